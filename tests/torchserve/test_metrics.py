"""The pipeline's metrics through TorchServe's real metrics cache, as the worker emits them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from tests.compiled_model import build
from tests.torchserve.images import jpeg_rows, load_handler_module, make_context
from tests.torchserve.metric_lines import written
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch.torchserve.metrics import (
    METRIC_NAMES,
    PADDED_ITEMS,
    PADDED_TOKENS,
    RECOMPILES,
    SHAPES_UNKNOWN,
    TOKENS,
)


def metric_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    # TorchServe's backend writes "[METRICS]Name.Unit:value|#dims|#type:..." lines.
    return [
        line.removeprefix("[METRICS]") for line in written(caplog.records, "[METRICS]MicroBatch")
    ]


def values(lines: list[str], prefix: str) -> list[float]:
    return [float(line.split(":")[1].split("|")[0]) for line in lines if line.startswith(prefix)]


def test_handler_emits_padded_items(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = load_handler_module()
    handler = module.MicroBatchingHandler()
    mb_config = {"micro_batch_size": 4, "allowed_micro_batch_sizes": [4], "metrics_interval_s": 0}
    handler.initialize(make_context(model_dir, 6, {"micro_batching": mb_config}))
    with caplog.at_level(logging.INFO):
        try:
            handler.handle(jpeg_rows(6), make_context(model_dir, 6))
        finally:
            handler.micro_batching.shutdown()  # writes the lines still pending
    # Micro-batches of 4 and 2, the second padded to 4.
    assert sorted(values(metric_lines(caplog), f"{PADDED_ITEMS}.Count:")) == [0.0, 2.0]


def test_a_real_recompile_is_a_counter_metric(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A compiled model warmed up at 4 only, then sent a batch of 3: inductor compiles again
    # on the request path, which CompiledInference counts and reports as a metric.
    torch._dynamo.reset()
    config = build.model_config({"micro_batch_size": 4, "warmup": {"sizes": [4]}})
    directory = build.model_dir(tmp_path / "tiny", config)
    service = load_service(directory, model_name="tiny", handler="tiny_handler.py")
    handler = service._entry_point.__self__
    try:
        assert handler.micro_batching.compiled.compiles == 1  # the warm-up's, at load
        rows = [
            request(i, json.dumps([0.1 * i] * 16).encode(), "application/json") for i in range(3)
        ]
        with caplog.at_level(logging.INFO):
            code, answers = decode(service.predict(rows))
            handler.micro_batching.shutdown()  # writes the lines still pending
        assert code == 200 and [status for _, status, _ in answers] == [200] * 3
        assert handler.micro_batching.compiled.recompiles >= 1  # the scenario happened
    finally:
        handler.micro_batching.shutdown()
        torch._dynamo.reset()
    lines = metric_lines(caplog)
    assert sum(values(lines, f"{RECOMPILES}.Count:")) == handler.micro_batching.compiled.recompiles
    assert any("#type:COUNTER" in line for line in lines if line.startswith(RECOMPILES))


def test_handler_emits_stage_times_sizes_and_errors(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = load_handler_module()
    handler = module.MicroBatchingHandler()
    per_report = {"micro_batch_size": 4, "metrics_interval_s": 0}
    handler.initialize(make_context(model_dir, 8, {"micro_batching": per_report}))
    rows = jpeg_rows(8)
    rows[6] = {"body": b"broken"}
    with caplog.at_level(logging.INFO):
        try:
            handler.handle(rows, make_context(model_dir, 8))
        finally:
            handler.micro_batching.shutdown()  # writes the lines still pending
    lines = metric_lines(caplog)
    # One request id per line, not the batch's eight: the frontend parses every line.
    assert lines and all(line.count(",req-") == 1 for line in lines), lines[0]
    # Those need padding, compiling, length settings (tests/torchserve/test_lengths_service.py),
    # shape groups (tests/torchserve/test_metrics_reporter.py).
    quiet_here = {PADDED_ITEMS, RECOMPILES, TOKENS, PADDED_TOKENS, SHAPES_UNKNOWN}
    for name in set(METRIC_NAMES) - quiet_here:
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
    sized = [line for line in lines if line.startswith("MicroBatchSize.Count:")]
    assert values(lines, "MicroBatchSize.Count:") == [1.0] * len(sized)  # one per micro-batch
    # 2 micro-batches of 4, then the failing one re-run as 2+2 and 1+1.
    ranges = sorted(line.split("Sizes:")[1].split(",")[0] for line in sized)
    assert ranges == ["1", "1", "2", "2", "3-4", "3-4"]
