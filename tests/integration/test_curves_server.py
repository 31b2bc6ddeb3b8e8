"""Latency against offered load through a real TorchServe: ``ts-microbatch-benchmark
--rates`` on the text example, the plain baseline and ours as packaged, each round a
sweep of open-loop rates on one server (ts_microbatch.tools.curves)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import ROOT, load_module
from ts_microbatch.tools import benchmark

text_build = load_module("examples/text_classifier/build_mar.py", "ts_microbatch_text_build_mar")
SAMPLE = Path(ROOT, "examples/text_classifier/sample.txt")


def test_the_benchmark_draws_latency_against_offered_load(tmp_path: Path) -> None:
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    body = tmp_path / "body.txt"
    body.write_text("a short text to classify\n")
    out = tmp_path / "run"
    argv = ["--mar", str(mar), "--body", str(body), "--rounds", "1", "--batch-size", "4"]
    argv += ["--warmup-requests", "8", "--rates", "10,20", "--rate-seconds", "3"]
    argv += ["--min-answers", "50"]  # a smoke run: 1,500 a rate would take minutes
    argv += ["--settle-s", "1"]  # one slice of warming for the frontend's JIT, not 90 s
    argv += ["--variant", 'w5={"maxBatchDelay": 5}']  # the frontend's window, this variant
    assert benchmark.main([*argv, "--slo-p99-ms", "5000", "--out", str(out)]) == 0
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    curves = {r["handler"]: r["curve"] for r in runs if r.get("kind") == "run"}
    assert set(curves) == {"plain", "plain1", "ours", "w5"}  # both baselines
    threads = {r["handler"]: r["intra_op_threads"] for r in runs if r.get("kind") == "run"}
    assert threads["plain1"] == "1" and threads["ours"].startswith("1/")
    # What the server batched with, as it described the model: w5's own window.
    served = {r["handler"]: r["served_frontend"] for r in runs if r.get("kind") == "run"}
    assert served["w5"] == {"batchSize": 4, "maxBatchDelay": 5}
    assert served["ours"]["maxBatchDelay"] != 5
    for points in curves.values():
        # The scenario: each rate's requests were sent, open loop, and answered.
        assert [p["offered_per_s"] for p in points] == [10, 20]
        assert [p["requests"] for p in points] == [50, 60]
        assert all(p["errors"] == 0 and p["timeouts"] == 0 for p in points)
    saved = json.loads((out / "curves.json").read_text())
    assert {run["handler"] for run in saved["runs"]} == {"plain", "plain1", "ours", "w5"}
    # P99 at equal offered load against the baseline, with an interval and a call.
    compared = {(c["comparison"], c["offered_per_s"]) for c in saved["comparisons"]}
    assert compared == {
        (f"{v} / {base}", rate)
        for v in ("ours", "w5")
        for base in ("plain", "plain1")
        for rate in (10, 20)
    }
    # A point others kept busy gives no verdict (CI runs suites side by side).
    called = [c for c in saved["comparisons"] if c["call"] != "no verdict"]
    assert all(c["low"] <= c["ratio"] <= c["high"] for c in called)
    assert all("other_cpu_cores" in p for points in curves.values() for p in points)
    variants = json.loads((out / "results.json").read_text())["variants"]
    assert variants["w5"]["frontend"] == {"batchSize": 4, "maxBatchDelay": 5}
    assert variants["ours"]["frontend"]["maxBatchDelay"] != 5
    assert not (out / "p99.png").exists()  # benchmarks/latency_load.py draws it
    assert "holds" in (out / "curves.md").read_text()
    # Each sweep began with its floor: --min-answers requests one at a time, all answered.
    floors = {r["handler"]: r["floor"] for r in runs if r.get("kind") == "run"}
    assert all(f["answers"] == 50 and f["errors"] == 0 for f in floors.values())
    assert all(f["p99_low_ms"] <= f["p99_ms"] <= f["p99_high_ms"] for f in floors.values())
    assert (out / "curves.md").read_text().count("one request at a time") == 4
    # Each run's CPU ledger: its parts sum to the machine's cores, the frontend's among them;
    # the frontend was warmed a slice for its JIT first, and the ledger names the JIT's part.
    for r in (r for r in runs if r.get("kind") == "run"):
        assert r["settled"]["slices"] == 1 and r["settled"]["seconds"] >= 1
        parts = r["ledger"]["parts"]
        assert "frontend JIT" in parts
        assert abs(sum(parts.values()) - r["ledger"]["cores"]) < 1e-6
        assert parts["frontend"] > 0 and any(k.startswith("worker ") for k in parts)
