"""bench/harness.py, the harness every benchmark runs through: a two-contender toy benchmark run as a script in a
temporary folder (each contender a fresh process), its JSON record, its history when a second run replaces it, and
bench/results.py rendering the records into the results page; and bench/RESULTS.md is what bench/records gives."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

from support.paths import ROOT

sys.path.append(str(ROOT / "bench"))  # the scripts import each other by module name, as `python bench/x.py` does

import harness  # noqa: E402
import results  # noqa: E402

TOY = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {bench!r})
    import harness as h

    bench = h.Benchmark("toy", "two fresh processes, one of them sleeping", [
        h.Contender("pass", "python -c pass: interpreter start-up and exit", argv=[sys.executable, "-c", "pass"]),
        h.Contender("sleep", "the same plus time.sleep(0.2)",
                    argv=[sys.executable, "-c", "import time; time.sleep(0.2)"], baseline="pass"),
    ], group="Tests", ratio=("sleep", "pass"), repeat=3)
    h.run(bench).finish(figures={{"answer": 42}}, notes=["a toy"])
""")


def _run_toy(script: Path, records: Path) -> dict:
    done = subprocess.run([sys.executable, str(script), "--records", str(records)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "| pass |" in done.stdout and "| sleep |" in done.stdout  # the table, printed
    return json.loads((records / "toy.json").read_text())


def test_a_toy_benchmark_gets_its_record_its_history_and_its_table(tmp_path):
    script, records = tmp_path / "toy_bench.py", tmp_path / "records"
    script.write_text(TOY.format(bench=str(ROOT / "bench")))
    first = _run_toy(script, records)

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert first["commit"] == head.strip() and len(first["commit"]) == 40
    assert first["benchmark"] == "toy" and first["kind"] == "speed" and first["date"]
    assert first["command"].endswith("toy_bench.py --records " + str(records))
    assert first["machine"]["cpu"].strip() and first["machine"]["cores"] >= 1 and first["machine"]["memory_gib"] > 0
    by_name = {c["name"]: c for c in first["contenders"]}
    assert set(by_name) == {"pass", "sleep"}
    for c in by_name.values():
        assert c["runs"] == 3 and len(c["seconds"]) == 3 and c["includes"]
        assert c["median"] == statistics.median(c["seconds"]) and c["fastest"] == min(c["seconds"])
    assert min(by_name["sleep"]["seconds"]) >= 0.2
    ratio = first["ratio"]
    assert (ratio["contender"], ratio["baseline"]) == ("sleep", "pass")
    assert ratio["value"] == statistics.median(by_name["sleep"]["seconds"]) / statistics.median(
        by_name["pass"]["seconds"])
    assert first["figures"] == {"answer": 42} and first["notes"] == ["a toy"]

    second = _run_toy(script, records)  # replaces the first, which goes to the history
    assert second["date"] >= first["date"]
    history = (tmp_path / "legacy" / "toy.md").read_text()
    assert first["date"] in history and "| sleep |" in history

    page = results.render_page(records)
    assert "| pass |" in page and "| sleep |" in page and "## Speed benchmarks" in page
    assert "x pass" in page and harness.headline(second) in page
    assert "Earlier runs: [legacy/toy.md](legacy/toy.md)" in page


def test_in_process_contenders_runs_timed_elsewhere_and_a_wrapped_script(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--records", str(tmp_path / "records")])
    calls = harness.run(harness.Benchmark("parts", "in this process", [
        harness.Contender("a", "returns its own seconds and another's", call=lambda i: {"seconds": 2.0 + i,
                                                                                         "also": {"b": 1.0}}),
        harness.Contender("b", "reported by a", baseline="a")], repeat=2), log=lambda _: None)
    assert calls["a"].seconds == [2.0, 3.0] and calls["b"].seconds == [1.0, 1.0]
    elsewhere = harness.measured(harness.Benchmark("elsewhere", "a child's own seconds", [
        harness.Contender("c", "timed by a child process")]), {"c": [0.5]}, {"c": [{"rows": 7}]})
    both = harness.combine("both", "two parts", [calls, elsewhere], ratio=("c", "a"))
    record = both.finish(figures={"tables": [{"title": "t", "header": ["x"], "rows": [[1]]}]})
    assert [c["name"] for c in record["contenders"]] == ["a", "b", "c"]
    assert record["ratio"]["value"] == 0.5 / 2.5 and record["contenders"][2]["extras"] == [{"rows": 7}]
    assert json.loads((tmp_path / "records" / "both.json").read_text())["benchmark"] == "both"

    def main():
        print("[progress] not kept")
        print("### A study\n\n| k | v |\n|---|---|\n| 1 | 2 |")

    harness.wrap(main, "study", "a study", kind="calibration")
    study = json.loads((tmp_path / "records" / "study.json").read_text())
    assert study["wrapped"] and study["kind"] == "calibration" and "--records" in study["command"]
    assert study["figures"]["markdown"].startswith("### A study") and "| 1 | 2 |" in study["figures"]["markdown"]
    assert "--records" not in sys.argv  # taken out for the script's own parser
    assert "\n#### A study\n" in results.render_page(tmp_path / "records")  # its headings under the page's


def test_a_record_from_before_the_harness_renders_its_text_as_it_was(tmp_path):
    legacy = {"benchmark": "old", "title": "an old run", "kind": "calibration", "group": "Audit", "command": "x",
              "legacy_markdown": "## An old run (issue 1)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"}
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "old.json").write_text(json.dumps(legacy))
    page = results.render_page(tmp_path / "records")
    assert "## Calibration studies" in page and "#### An old run (issue 1)" in page and "| 1 | 2 |" in page


def test_the_results_page_is_what_the_records_give():
    assert (ROOT / "bench" / "RESULTS.md").read_text() == results.render_page(harness.RECORDS), (
        "bench/RESULTS.md is stale: run .venv/bin/python bench/results.py")
