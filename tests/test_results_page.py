"""benchmarks/results.py renders docs/results.md from the reports its declared runs leave: every
figure on the page comes from a report, with its command, date, machine and spread, and a run
without a report (never run, or failed this time) is listed as pending with no figure."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results():
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "benchmarks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_results"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def group(speedup, accepted, exact=None, of=None, spread=None):
    return {"samples": 4, "mean_accepted_tokens": accepted, "tokens_per_second": 10.0 * speedup, "speedup": speedup,
            "per_sample_speedup": spread, "per_question_speedup": spread, "exact": exact, "exact_of": of}


def fake_report(temperature: float = 0.0) -> dict:
    """The fields of a `draftheads bench` report.json the page reads (draftheads/bench/command.py)."""
    spread = {"median": 1.41, "min": 0.93, "q1": 1.2, "q3": 1.6, "max": 2.07}
    return {
        "created": "2026-11-30T10:00:00+00:00",
        "environment": {"cpu": "Test CPU 9000", "cpu_count": 2, "gpu": None, "device": "cpu", "torch_threads": 1,
                        "target": "smollm2"},
        "settings": {"temperature": temperature, "max_new_tokens": 128, "rounds": 3},
        "questions": {"source": "mt_bench.jsonl", "questions": 2, "samples": 4, "categories": ["writing", "math"]},
        "methods": [{"name": "eagle3"}, {"name": "prompt-lookup"}],
        "results": {
            "plain": {"by_category": {"overall": group(1.0, 1.0)}},
            "eagle3": {"by_category": {"overall": group(1.37, 2.46, 4, 4, spread), "writing": group(1.5, 2.7, 2, 2),
                                       "math": group(1.2, 2.2, 2, 2)}},
            "prompt-lookup": {"by_category": {"overall": group(0.97, 1.18, 4, 4, spread),
                                              "writing": group(0.95, 1.1, 2, 2)}},
        },
    }


def write_spec(tmp_path: Path, runs: str) -> Path:
    spec = tmp_path / "results.yaml"
    spec.write_text("intro: A test page.\nruns:\n" + runs)
    return spec


def test_the_page_shows_each_methods_figures_with_command_date_machine_and_spread(tmp_path, results):
    (tmp_path / "greedy").mkdir()
    (tmp_path / "greedy" / "report.json").write_text(json.dumps(fake_report()))
    spec = write_spec(tmp_path, f"""
  - name: greedy
    title: heads on MT-Bench, greedy
    command: draftheads bench --target smollm2 --heads runs/h --questions q.jsonl --out {tmp_path}/greedy
  - name: sampled
    title: heads on MT-Bench, T = 0.7
    command: draftheads bench --target smollm2 --temperature 0.7 --out {tmp_path}/sampled
""")
    page = tmp_path / "results.md"
    assert results.main(["--spec", str(spec), "--out", str(page), "--from-reports"]) == 0
    text = page.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| heads on MT-Bench, greedy | eagle3 |"))
    for cell in ("2.46", "1.37x", "1.41x (0.93-2.07) over questions", "4/4", "2026-11-30", "Test CPU 9000, 2 cores"):
        assert cell in row, (cell, row)
    assert f"--out {tmp_path}/greedy" in text  # the command
    assert "| math | 1.20x (2.20) | - |" in text  # per category; a category a method has no sample in: "-"
    pending = text.split("## Pending")[1].split("##")[0]
    assert "heads on MT-Bench, T = 0.7" in pending and "--temperature 0.7" in pending
    assert "| heads on MT-Bench, T = 0.7 |" not in text  # no row, so no figure, for a run without a report
    assert "A test page." in text


def test_a_run_that_fails_is_pending_and_its_old_report_is_not_shown(tmp_path, results):
    stale = tmp_path / "old.md"
    stale.write_text("| variant | tokens/s |\n|---|---|\n| base | 999 |\n")
    spec = write_spec(tmp_path, f"""
  - name: broken
    title: a script that fails
    command: python -c "raise SystemExit(3)"
    markdown: {stale}
""")
    page = tmp_path / "results.md"
    assert results.main(["--spec", str(spec), "--out", str(page)]) == 1
    text = page.read_text()
    assert "999" not in text
    assert "a script that fails** (the command exited with 3)" in text


def test_a_run_whose_report_is_gone_keeps_what_the_page_showed(tmp_path, results):
    """A new checkout has no results/ folder: re-rendering keeps the figures an earlier render showed
    (rows and section, with their dates), and renders the runs that reported again from their reports."""
    (tmp_path / "greedy").mkdir()
    (tmp_path / "greedy" / "report.json").write_text(json.dumps(fake_report()))
    spec = write_spec(tmp_path, f"""
  - name: greedy
    title: heads on MT-Bench, greedy
    command: draftheads bench --target smollm2 --heads runs/h --out {tmp_path}/greedy
  - name: script
    title: a script's table
    command: python benchmarks/x.py
    markdown: {tmp_path}/script.md
  - name: other
    title: heads on MT-Bench
    command: draftheads bench --target smollm2 --heads runs/h --out {tmp_path}/other
""")
    (tmp_path / "script.md").write_text("# Its own heading\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n# Another\n\ntext\n")
    page = tmp_path / "results.md"
    assert results.main(["--spec", str(spec), "--out", str(page), "--from-reports"]) == 0
    first = page.read_text()
    (tmp_path / "greedy" / "report.json").rename(tmp_path / "other.json")  # greedy's report is gone
    (tmp_path / "script.md").unlink()  # and the script's table
    assert results.main(["--spec", str(spec), "--out", str(page), "--from-reports"]) == 0
    assert page.read_text() == first  # nothing reported since: the same page
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.json").write_text(json.dumps(fake_report(temperature=0.7)))
    assert results.main(["--spec", str(spec), "--out", str(page), "--from-reports"]) == 0
    text = page.read_text()
    kept = [line for line in first.splitlines() if line.startswith("| heads on MT-Bench, greedy | ")]
    assert len(kept) == 2 and all(line in text for line in kept)
    assert "| math | 1.20x (2.20) | - |" in text and "## Pending" not in text
    assert "| heads on MT-Bench | eagle3 | 0.7 |" in text  # the prefix of the other title is not mistaken for it
    section = text.split("## heads on MT-Bench, greedy\n")[1].split("\n## ")[0]
    assert f"--out {tmp_path}/greedy" in section and "2026-11-30" in section
    # A run that fails now is pending, whatever the page showed before.
    spec.write_text(spec.read_text().replace(f"draftheads bench --target smollm2 --heads runs/h --out {tmp_path}/greedy",
                                             'python -c "raise SystemExit(3)"\n    markdown: ' + str(tmp_path / "g.md")))
    assert results.main(["--spec", str(spec), "--out", str(page), "--only", "greedy"]) == 1
    assert "| heads on MT-Bench, greedy | " not in page.read_text()


def test_a_script_runs_markdown_table_is_included(tmp_path, results):
    table = tmp_path / "table.md"
    table.write_text("# Training throughput\n\n| variant | tokens/s |\n|---|---|\n| base | 123 (120-126) |\n")
    spec = write_spec(tmp_path, f"""
  - name: training
    title: training throughput
    command: python benchmarks/training_throughput.py --config configs/smollm2.yaml
    markdown: {table}
""")
    page = tmp_path / "results.md"
    assert results.main(["--spec", str(spec), "--out", str(page), "--from-reports"]) == 0
    text = page.read_text()
    assert "| base | 123 (120-126) |" in text and "## Training throughput" in text  # its headings one level down


@pytest.mark.parametrize("runs,message", [
    ("  - {name: a, title: t, command: draftheads bench --out x}\n  - {name: a, title: t, command: draftheads bench --out y}\n",
     "the name 'a' is used twice"),
    ("  - {name: a, title: t, command: python benchmarks/x.py}\n", "name its output"),
    ("  - {name: a, title: t, command: draftheads bench --out x, colour: red}\n", "unknown field(s) colour"),
    ("  - {name: a, command: draftheads bench --out x}\n", "'title' must be a non-empty string"),
])
def test_a_bad_spec_is_refused_naming_the_run_and_field(tmp_path, results, runs, message, capsys):
    page = tmp_path / "results.md"
    assert results.main(["--spec", str(write_spec(tmp_path, runs)), "--out", str(page), "--from-reports"]) == 2
    assert message in capsys.readouterr().err
    assert not page.exists()


def test_the_shipped_spec_loads_and_the_page_shows_only_its_runs(results):
    """benchmarks/results.yaml is valid, and every figure row of docs/results.md belongs to a run it declares."""
    runs = results.load_spec(results.SPEC).runs
    titles = {r.title for r in runs}
    lines = results.PAGE.read_text().split("\n## ")[0].splitlines()  # the summary table is before the first section
    start = next(i for i, line in enumerate(lines) if line.startswith("| run | method |")) + 2
    figure_rows = [line.split(" | ")[0][2:] for line in lines[start:] if line.startswith("| ")]
    assert runs and figure_rows and set(figure_rows) <= titles


def test_notes_follow_the_table_and_a_misspelt_field_is_refused(tmp_path, results, capsys):
    """The spec's notes are rendered under their own heading after the table of every run, before the
    runs' sections; a top-level field the page does not know (a typo loses the text) is refused."""
    (tmp_path / "greedy").mkdir()
    (tmp_path / "greedy" / "report.json").write_text(json.dumps(fake_report()))
    run = f"""
  - name: greedy
    title: heads on MT-Bench, greedy
    command: draftheads bench --target smollm2 --out {tmp_path}/greedy
"""
    spec = tmp_path / "results.yaml"
    spec.write_text("intro: The page.\nnotes: |\n  ### What limits the heads\n\n  The verify cost.\nruns:\n" + run)
    page = tmp_path / "results.md"
    assert results.main(["--spec", str(spec), "--out", str(page), "--from-reports"]) == 0
    text = page.read_text()
    order = [text.index(s) for s in ("The page.", "| run | method |", "## Notes on the runs",
                                     "### What limits the heads\n\nThe verify cost.", "## heads on MT-Bench, greedy")]
    assert order == sorted(order)
    spec.write_text("intro: The page.\nnote: lost\nruns:\n" + run)
    assert results.main(["--spec", str(spec), "--out", str(tmp_path / "other.md"), "--from-reports"]) == 2
    assert "unknown top-level field(s) note" in capsys.readouterr().err
