"""``ts-microbatch-tune --slo-p99-ms`` through a real TorchServe on the text example: the
confirm step's ladders decide (a module of its own: CI runs modules side by side, and this
one and the benchmark's sweep are its two longest tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, load_module
from ts_microbatch.tools import slo_confirm, slo_verdict, tune

text_build = load_module("examples/text_classifier/build_mar.py", "ts_microbatch_text_build_mar")
SAMPLE = Path(ROOT, "examples/text_classifier/sample.txt")


def test_the_slo_tuner_confirms_its_choice_on_a_real_torchserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short rungs: what is proved is which measurement decides, not a P99 worth quoting
    # (at the shipped 4 s and 50 requests a rung, the two ladders took about 2 minutes).
    monkeypatch.setattr(slo_confirm, "SECONDS_PER_RATE", 1.0)
    monkeypatch.setattr(slo_confirm, "MIN_REQUESTS_PER_RATE", 10)
    monkeypatch.setattr(slo_confirm, "MAX_SECONDS_PER_RATE", 3.0)
    monkeypatch.setattr(slo_verdict, "MIN_ANSWERS", 10)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "tuned" / "model-config.yaml"
    argv = ["--mar", str(mar), "--input", str(SAMPLE), "--micro-batch-sizes", "1,4"]
    argv += ["--threads", "1", "--batch-sizes", "1,4", "--windows", "5,20", "--repeats", "1"]
    argv += ["--slo-p99-ms", "500", "--rate", "20", "--confirm", "1", "--out", str(out)]
    assert tune.main(argv) in (0, 1)  # 1: nothing held within the objective, said
    lines = [
        json.loads(x)
        for x in out.with_name("model-config.trials.jsonl").read_text().split("\n")
        if x
    ]
    confirmed = [line for line in lines if line["kind"] == "confirmed"]
    if not confirmed:
        # The plan held nothing: only acceptable when the in-process step met a machine
        # busy as long as the objective's half through a batch and its reruns (a stall is
        # measured again, inprocess.STALL_FACTOR; before that, a CI run beside the floor's
        # suite kept one batch of one at 625 ms among 32 of ~1 ms, and the pooled spread
        # priced every candidate over 500). The scenario did not happen: nothing to assert.
        slowest = max(
            ms * max(line["spread"][str(n)])
            for line in lines
            if line["kind"] == "stage-costs"
            for n, ms in line["batch_ms"].items()
        )
        assert slowest > 250, f"nothing confirmed, and no batch slower than {slowest:.0f} ms"
        pytest.skip(f"the machine stalled an in-process batch for {slowest:.0f} ms")
    # The scenario: the example as packaged (yours) and the two best were served, each
    # swept open loop up the same ladder, lowest first.
    assert len(confirmed) == 2  # the current configuration and the best candidate
    current = confirmed[0]
    assert (current["batchSize"], current["maxBatchDelay"]) == (16, 20)  # the .mar's
    ladder = slo_confirm.ladder(max(line["predicted_per_s"] for line in confirmed))
    for line in confirmed:
        offered = [p["offered_per_s"] for p in line["curve"]]
        assert offered == ladder[: len(offered)]
        assert [p["requests"] for p in line["curve"]] == [
            slo_confirm.rate_requests(rate) for rate in offered
        ]  # the short rungs were the ones run
        assert all(p["errors"] == 0 for p in line["curve"])
    # What is written follows the verdict the trials record (no latency is asserted here,
    # only which measurement decides): a replacement, or the .mar's own kept.
    verdict = lines[-1] if lines[-1]["kind"] != "best" else lines[-2]
    assert verdict["kind"] in ("replaced", "kept")
    if verdict["kind"] == "kept":
        assert not out.exists()
        return
    written = yaml.safe_load(out.read_text())
    assert (written["batchSize"], written["maxBatchDelay"]) == (
        verdict["batchSize"], verdict["maxBatchDelay"],
    )  # fmt: skip
    assert verdict["measured_per_s"] > verdict["current"]["measured_per_s"]
