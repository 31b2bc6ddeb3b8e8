"""The pipeline's metrics through TorchServe's real metrics cache, as the worker emits them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.handlers.conftest import jpeg_rows, load_handler_module, make_context
from ts_microbatch.torchserve_metrics import METRIC_NAMES


def test_handler_emits_stage_times_sizes_and_errors(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = load_handler_module()
    handler = module.MicroBatchingHandler()
    handler.initialize(make_context(model_dir, 8, {"micro_batching": {"micro_batch_size": 4}}))
    try:
        rows = jpeg_rows(8)
        rows[6] = {"body": b"broken"}
        with caplog.at_level(logging.INFO):
            handler.handle(rows, make_context(model_dir, 8))
    finally:
        handler.micro_batching.shutdown()
    # TorchServe's backend writes "[METRICS]Name.Unit:value|#dims|#type:..." lines.
    lines = [
        r.getMessage().removeprefix("[METRICS]")
        for r in caplog.records
        if r.getMessage().startswith("[METRICS]MicroBatch")
    ]
    for name in METRIC_NAMES:
        assert any(line.startswith(f"{name}.") for line in lines), name
    stage_lines = [line for line in lines if line.startswith("MicroBatchStageSeconds.Seconds:")]
    assert {
        s
        for s in ("Stage:preprocess", "Stage:inference", "Stage:postprocess")
        if any(s in x for x in stage_lines)
    } == {"Stage:preprocess", "Stage:inference", "Stage:postprocess"}
    assert any(
        "StatusCode:400" in line for line in lines if line.startswith("MicroBatchRequestErrors")
    )
    sizes = [
        float(line.split(":")[1].split("|")[0])
        for line in lines
        if line.startswith("MicroBatchSize.Count:")
    ]
    # 2 micro-batches of 4, then the failing one re-run as 2+2 and 1+1.
    assert sorted(sizes) == [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
