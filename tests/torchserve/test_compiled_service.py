"""A ``torch.compile``d model under the pipeline, loaded by TorchServe's own loader (its
``pt2:`` section compiles it in BaseHandler.initialize) and driven by ``Service.predict``.

Dynamo's caches are per process and its recompile limit is per code object, so each test
starts from ``torch._dynamo.reset()``: one test's graphs must not count toward another's.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.compiled_model import build
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch import ConfigError, WarmupError
from ts_microbatch.torchserve.compiled import compile_count

PADDED = {
    "micro_batch_size": 8,
    "allowed_micro_batch_sizes": [1, 2, 4, 8],
    "pad": "tensors",  # TinyHandler's preprocess stacks one row per request
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
    "warmup": {},
}
UNPADDED = {k: v for k, v in PADDED.items() if k not in ("allowed_micro_batch_sizes", "pad")}
# Frontend batches of varying size, as under uneven load: 25 batches of 1..32 requests.
STREAM = [random.Random(7).randint(1, 32) for _ in range(25)]
TOLERANCE = 1e-5  # inductor may order float sums differently from eager


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def load(tmp_path: Path, micro_batching: dict[str, Any]) -> tuple[Any, Any]:
    directory = build.model_dir(tmp_path / "tiny", build.model_config(micro_batching))
    service = load_service(directory, model_name="tiny", handler="tiny_handler.py")
    return service, service._entry_point.__self__


def serve(service: Any, sizes: list[int]) -> tuple[list[torch.Tensor], list[list[Any]]]:
    """Each batch through Service.predict; returns the inputs and each request's answer."""
    rng = torch.Generator().manual_seed(3)
    inputs, answers = [], []
    for n in sizes:
        rows = torch.randn(n, 16, generator=rng)
        batch = [
            request(i, json.dumps(row.tolist()).encode(), "application/json")
            for i, row in enumerate(rows)
        ]
        code, got = decode(service.predict(batch))
        assert code == 200 and [status for _, status, _ in got] == [200] * n
        inputs.append(rows)
        answers.append([json.loads(body) for _, _, body in got])
    return inputs, answers


def assert_eager_answers(inputs: list[torch.Tensor], answers: list[list[Any]]) -> None:
    eager = build.eager_model()
    with torch.inference_mode():
        for rows, got in zip(inputs, answers):
            expected = eager(rows)
            assert torch.allclose(torch.tensor(got), expected, atol=TOLERANCE, rtol=0)


def test_padding_and_warmup_leave_no_compile_on_the_request_path(tmp_path: Path) -> None:
    service, handler = load(tmp_path, PADDED)
    try:
        compiled = handler.micro_batching.compiled
        # The scenario: the pt2 section compiled the model, and warm-up compiled one graph
        # per allowed size on the pipeline's inference thread.
        assert type(handler.model).__name__ == "OptimizedModule"
        assert compiled is not None and compiled.compiles == 4
        assert compiled.compiled_on == {"ts-microbatch-inference-0"}
        handler.postprocessed.clear()
        before = compile_count()
        inputs, answers = serve(service, STREAM)
        assert compile_count() == before and compiled.recompiles == 0
        assert_eager_answers(inputs, answers)
        # Micro-batches of 3, 5, 6 or 7 ran padded, yet postprocess saw only real items.
        assert {n % 8 for n in STREAM} & {3, 5, 6, 7}
        assert sum(handler.postprocessed) == sum(STREAM)
        assert {n % 8 for n in STREAM} - {0} <= set(handler.postprocessed)
    finally:
        handler.micro_batching.shutdown()


def test_without_padding_the_same_stream_recompiles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service, handler = load(tmp_path, {**UNPADDED, "on_recompile": "error"})
    try:
        compiled = handler.micro_batching.compiled
        assert compiled.compiles == 1  # warm-up: the largest micro-batch only
        with caplog.at_level(logging.ERROR, logger="ts_microbatch.torchserve.compiled"):
            inputs, answers = serve(service, STREAM)
        assert compiled.recompiles > 0
        ours = [r for r in caplog.records if r.name == "ts_microbatch.torchserve.compiled"]
        assert ours and all("recompiled" in r.getMessage() for r in ours)
        assert all(r.levelno == logging.ERROR for r in ours)
        assert_eager_answers(inputs, answers)  # slower, still right
    finally:
        handler.micro_batching.shutdown()


def test_a_second_inference_thread_for_a_compiled_model_fails_the_load(tmp_path: Path) -> None:
    config = {**PADDED, "parallelism": {"inference": 2}}
    with pytest.raises(ConfigError) as info:
        load(tmp_path, config)
    assert "micro_batching.parallelism.inference: got 2, expected 1 for a compiled model" in str(
        info.value
    )


def test_warmup_sample_file_missing_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {**PADDED, "warmup": {"sample": "sample.json"}})
    assert "micro_batching.warmup.sample: got 'sample.json', cannot read" in str(info.value)


def test_warmup_sample_file_shipped_with_the_model(tmp_path: Path) -> None:
    directory = build.model_dir(
        tmp_path / "tiny",
        build.model_config({**PADDED, "warmup": {"sample": "sample.json", "sizes": [4]}}),
    )
    (directory / "sample.json").write_text(json.dumps(list(range(16))))
    service = load_service(directory, model_name="tiny", handler="tiny_handler.py")
    handler = service._entry_point.__self__
    try:
        # Size 4, then the padding check: 4 unpadded and 3 padded to 4 (no new compile).
        assert sorted(handler.postprocessed) == [3, 4, 4]
        assert handler.micro_batching.compiled.compiles == 1
    finally:
        handler.micro_batching.shutdown()


V2_SAMPLE = {
    "inputs": [
        {"name": "x", "shape": [2, 16], "datatype": "FP32", "data": [0.25] * 16 + [0.75] * 16}
    ]
}
# TinyHandler that keeps the rows preprocess was given.
RECORDING_HANDLER = """
from tiny_handler import TinyHandler


class RecordingHandler(TinyHandler):
    def __init__(self):
        super().__init__()
        self.rows = []

    def preprocess(self, data):
        self.rows.extend(row.get("data") for row in data)
        return super().preprocess(data)
"""


def load_with_sample(tmp_path: Path, micro_batching: dict[str, Any], sample: Any) -> Any:
    """TinyNet loaded by TorchServe's loader with ``sample`` as its warm-up sample.json."""
    config = build.model_config(micro_batching, compiled=False)
    directory = build.model_dir(tmp_path / "tiny", config)
    (directory / "sample.json").write_text(json.dumps(sample))
    (directory / "recording_handler.py").write_text(RECORDING_HANDLER)
    service = load_service(directory, model_name="tiny", handler="recording_handler.py")
    return service._entry_point.__self__


@pytest.mark.parametrize(
    ("sample", "kserve"),
    [(V2_SAMPLE, "auto"), ({"instances": [[0.25] * 16, [0.75] * 16]}, True)],
)
def test_defect_warmup_sample_kserve_body(
    tmp_path: Path, sample: dict[str, Any], kserve: bool | str
) -> None:
    # A KServe body as warmup.sample failed the load: its bytes reached preprocess unread.
    warmup = {"sample": "sample.json", "sizes": [4]}
    handler = load_with_sample(
        tmp_path, {"micro_batch_size": 4, "kserve": kserve, "warmup": warmup}, sample
    )
    try:
        # The sample's two instances, repeated, made the micro-batch of 4.
        assert handler.postprocessed == [4]
        assert handler.rows == [[0.25] * 16, [0.75] * 16] * 2
    finally:
        handler.micro_batching.shutdown()


def test_warmup_sample_malformed_kserve_body_fails_the_load(tmp_path: Path) -> None:
    warmup = {"sample": "sample.json", "sizes": [2]}
    with pytest.raises(WarmupError, match="warm-up: the sample cannot be read as a request"):
        load_with_sample(tmp_path, {"kserve": True, "warmup": warmup}, {"instances": []})
