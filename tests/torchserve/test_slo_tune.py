"""The tuner for a latency objective on a real .mar (the text example): stage costs
in-process, batch formation modelled, the winner written as a model-config.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, load_module
from ts_microbatch import MicroBatchingConfig
from ts_microbatch.tools.tune import main

text_build = load_module("examples/text_classifier/build_mar.py", "ts_microbatch_text_build_mar")
SAMPLE = str(Path(ROOT, "examples/text_classifier/sample.txt"))


def test_the_tuner_finds_the_frontend_settings_that_hold_an_objective(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "out" / "model-config.yaml"  # its folder does not exist yet
    argv = ["--mar", str(mar), "--input", SAMPLE, "--micro-batch-sizes", "1,4", "--threads", "1"]
    argv += ["--batch-sizes", "1,4,8", "--windows", "1,5,50", "--repeats", "2"]
    assert main([*argv, "--slo-p99-ms", "100", "--out", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert written["batchSize"] in (1, 4, 8) and written["maxBatchDelay"] in (1, 5, 50)
    MicroBatchingConfig.from_mapping(written["micro_batching"])  # a config the package loads
    printed = capsys.readouterr().out
    assert "bound by" in printed and "held req/s" in printed
    lines = [
        json.loads(x)
        for x in out.with_name("model-config.trials.jsonl").read_text().split("\n")
        if x
    ]
    kinds = [line["kind"] for line in lines]
    # The scenario: two combinations measured at three batch sizes, 2 x 3 x 3 modelled.
    assert kinds.count("stage-costs") == 2 and kinds.count("modelled") == 18
    assert all(set(line["batch_ms"]) == {"1", "4", "8"} for line in lines
               if line["kind"] == "stage-costs")  # fmt: skip
    modelled = [line for line in lines if line["kind"] == "modelled"]
    best = max(modelled, key=lambda line: line["held_per_s"])
    assert (written["batchSize"], written["maxBatchDelay"]) == (
        best["batchSize"], best["maxBatchDelay"],
    )  # fmt: skip
    # A 50 ms window cannot hold a 40 ms objective: no configuration with it is chosen.
    tight = tmp_path / "tight" / "model-config.yaml"
    assert main([*argv, "--slo-p99-ms", "40", "--out", str(tight)]) == 0
    assert yaml.safe_load(tight.read_text())["maxBatchDelay"] != 50


def test_an_objective_nothing_holds_writes_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "model-config.yaml"
    argv = ["--mar", str(mar), "--input", SAMPLE, "--micro-batch-sizes", "1", "--threads", "1"]
    argv += ["--batch-sizes", "4", "--windows", "50", "--repeats", "1"]
    assert main([*argv, "--slo-p99-ms", "10", "--out", str(out)]) == 1
    assert not out.exists()
    assert "No configuration holds P99 10 ms" in capsys.readouterr().out
