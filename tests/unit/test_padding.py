"""allowed_micro_batch_sizes: padding before inference, cut back before postprocess; warm-up."""

from __future__ import annotations

import random
import threading
from typing import Any

import numpy as np
import pytest
import torch

from tests.unit.fakes import Bad, FakeHandler, expected
from tests.unit.test_autosize import THREADS, drive, known_costs
from ts_microbatch import (
    ConfigError,
    MicroBatching,
    MicroBatchingConfig,
    Pipeline,
    PipelineObserver,
    StageOutputError,
)
from ts_microbatch._padding import pad, unpad
from ts_microbatch.autosize import AutoMicroBatchSize
from ts_microbatch.errors import WarmupError

ALLOWED = [1, 2, 4, 8]


class Recorder(PipelineObserver):
    def __init__(self) -> None:
        self.padding: list[tuple[str, int, int]] = []
        self.stages: list[tuple[str, int]] = []
        self.batches = 0
        self._lock = threading.Lock()

    def on_padding(self, stage: str, size: int, padded_to: int) -> None:
        with self._lock:
            self.padding.append((stage, size, padded_to))

    def on_stage(self, stage: str, size: int, queue_wait_s: float, run_s: float, **_: Any) -> None:
        with self._lock:
            self.stages.append((stage, size))

    def on_batch(self, batch_size: int, micro_batches: int) -> None:
        self.batches += 1


def config(**settings: Any) -> MicroBatchingConfig:
    return MicroBatchingConfig.from_mapping(
        {"micro_batch_size": 8, "allowed_micro_batch_sizes": ALLOWED, **settings}
    )


def test_inference_sees_only_allowed_sizes_and_postprocess_only_real_items() -> None:
    handler = FakeHandler(jitter_s=0.001)
    observer = Recorder()
    rng = random.Random(1)
    sizes = [rng.randint(1, 32) for _ in range(30)]
    with MicroBatching(handler, config=config(), observer=observer) as mb:
        for n in sizes:
            items = list(range(100 * n, 100 * n + n))
            assert mb.handle(items) == expected(items)
    remainders = {n % 8 for n in sizes} - {0}
    assert {3, 5, 6, 7} & remainders  # the stream had sizes that need padding
    inference = [call for call in handler.calls["inference"]]
    assert {len(call) for call in inference} <= set(ALLOWED)
    for call in inference:  # padding repeats the last real item
        real = len(set(call))
        assert call == call[:real] + [call[real - 1]] * (len(call) - real)
    # Postprocess got each request exactly once: no padded item reached it.
    posted = [x for call in handler.calls["postprocess"] for x in call]
    assert sorted(posted) == sorted(x for n in sizes for x in range(100 * n, 100 * n + n))
    padded = [(n, to) for stage, n, to in observer.padding]
    assert all(stage == "inference" for stage, _, _ in observer.padding)
    assert (3, 4) in padded or (5, 8) in padded or (6, 8) in padded or (7, 8) in padded
    assert all(to == min(a for a in ALLOWED if a >= n) for n, to in padded)
    # Stage metrics count requests, never padded items.
    assert sum(n for stage, n in observer.stages if stage == "inference") == sum(sizes)


def test_a_bad_item_in_a_padded_micro_batch_is_isolated_and_the_rest_answered() -> None:
    handler = FakeHandler()
    handler.fail_on["inference"] = {5}
    with MicroBatching(handler, config=config(micro_batch_size=7)) as mb:
        futures = mb.submit(list(range(7)))
        results = [f.exception() or f.result() for f in futures]
    assert isinstance(results[5], Bad)
    assert [r for i, r in enumerate(results) if i != 5] == expected([0, 1, 2, 3, 4, 6])
    assert {len(call) for call in handler.calls["inference"]} <= set(ALLOWED)
    # The micro-batch of 7 ran padded to 8, then its halves of 3 and 4 padded to 4 each.
    assert handler.calls["inference"][0] == [0, 1, 2, 3, 4, 5, 6, 6]
    assert [0, 1, 2, 2] in handler.calls["inference"]


@pytest.mark.parametrize(
    ("payload", "check"),
    [
        ([1, 2, 3], lambda p: p == [1, 2, 3, 3]),
        (np.arange(6).reshape(3, 2), lambda p: p.tolist() == [[0, 1], [2, 3], [4, 5], [4, 5]]),
        (torch.arange(3.0), lambda p: p.tolist() == [0.0, 1.0, 2.0, 2.0]),
        (
            {"ids": torch.ones(3, 2), "mask": torch.zeros(3, 2)},
            lambda p: p["ids"].shape == (4, 2) and p["mask"].shape == (4, 2),
        ),
        ((torch.ones(3), [7, 8, 9]), lambda p: p[0].shape == (4,) and p[1] == [7, 8, 9, 9]),
    ],
)
def test_pad_and_unpad_batch_major_payloads(payload: Any, check: Any) -> None:
    padded = pad(payload, 3, 4, "preprocess's output")
    assert check(padded)
    assert same(unpad(padded, 3, 4, "inference's output"), payload)


def same(a: Any, b: Any) -> bool:
    """Equal structure and values (tensors and arrays compared by value)."""
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, list):
        return a == b
    return type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (torch.ones(5, 2), "preprocess's output has 5 rows for a micro-batch of 3"),
        ("abc", "preprocess's output is a str"),
        (torch.tensor(1.0), "preprocess's output is a Tensor"),
    ],
)
def test_pad_refuses_what_is_not_one_row_per_request(payload: Any, message: str) -> None:
    with pytest.raises(StageOutputError) as info:
        pad(payload, 3, 4, "preprocess's output")
    assert message in str(info.value)


def test_a_stage_output_that_cannot_be_padded_fails_its_requests_with_the_reason() -> None:
    class Scalar(FakeHandler):
        def preprocess(self, data: list[int]) -> Any:
            return {"count": len(data)}  # not batch-major

    with MicroBatching(Scalar(), config=config(micro_batch_size=3, isolate_failures=False)) as mb:
        futures = mb.submit([1, 2, 3])
        errors = [f.exception() for f in futures]
    assert all(isinstance(e, StageOutputError) for e in errors)
    assert "preprocess's output['count'] is a int" in str(errors[0])


def test_auto_chooses_only_allowed_sizes() -> None:
    policy = AutoMicroBatchSize(1, 32, allowed_sizes=(1, 2, 4, 8, 16))
    chosen = drive(policy, known_costs(), 60)
    assert set(chosen) <= {1, 2, 4, 8, 16}
    assert len(set(chosen)) >= 3  # it explored and climbed among them
    # A batch smaller than the smallest allowed size above it is one micro-batch, padded.
    assert policy.choose(3, THREADS) in (1, 2, 4)
    policy = AutoMicroBatchSize(2, 12, allowed_sizes=(1, 2, 4, 8, 16))
    assert set(drive(policy, known_costs(), 40)) <= {2, 4, 8}


def test_auto_with_allowed_sizes_pads_through_the_pipeline() -> None:
    handler = FakeHandler()
    cfg = config(micro_batch_size="auto", min_micro_batch_size=1, max_micro_batch_size=8)
    with MicroBatching(handler, config=cfg) as mb:
        for n in (32, 30, 17, 32, 5, 32, 29, 3):
            assert mb.handle(list(range(n))) == expected(list(range(n)))
    assert {len(call) for call in handler.calls["inference"]} <= set(ALLOWED)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"micro_batch_size": 16, "allowed_micro_batch_sizes": [1, 2, 4, 8]},
            "micro_batching.allowed_micro_batch_sizes: got [1, 2, 4, 8], expected the largest "
            "to be at least micro_batch_size (16)",
        ),
        ({"allowed_micro_batch_sizes": [2, 0]}, "allowed_micro_batch_sizes[1]: got 0"),
        ({"allowed_micro_batch_sizes": "1,2"}, "expected a non-empty list of integers >= 1"),
        ({"allowed_micro_batch_sizes": [2, 2]}, "expected distinct sizes"),
        ({"warmup": {"iterations": 0}}, "micro_batching.warmup.iterations: got 0"),
        ({"warmup": {"size": [1]}}, "micro_batching.warmup.size: unknown key"),
        ({"warmup": True}, "micro_batching.warmup: got True, expected a mapping"),
        (
            {"allowed_micro_batch_sizes": [1, 4], "warmup": {"sizes": [2]}},
            "micro_batching.warmup.sizes: got [2], but [2] not in allowed_micro_batch_sizes",
        ),
        ({"on_recompile": "raise"}, "micro_batching.on_recompile: got 'raise'"),
    ],
)
def test_padding_and_warmup_config_errors_name_the_key(
    mapping: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        MicroBatchingConfig.from_mapping(mapping)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("mapping", "sizes"),
    [
        ({"micro_batch_size": 4, "allowed_micro_batch_sizes": [1, 2, 4, 8]}, (1, 2, 4)),
        ({"micro_batch_size": 5, "allowed_micro_batch_sizes": [2, 8, 16]}, (2, 8)),
        ({"micro_batch_size": 4}, (4,)),
        ({"micro_batch_size": 4, "warmup": {"sizes": [3]}}, (3,)),
        (
            {
                "micro_batch_size": "auto",
                "max_micro_batch_size": 12,
                "allowed_micro_batch_sizes": [1, 2, 4, 8, 16],
            },
            (1, 2, 4, 8),
        ),
    ],
)
def test_warmup_sizes_are_the_sizes_inference_can_see(
    mapping: dict[str, Any], sizes: tuple[int, ...]
) -> None:
    assert MicroBatchingConfig.from_mapping({"warmup": {}, **mapping}).warmup_sizes() == sizes


def test_warm_up_runs_each_size_on_the_pipeline_inference_thread_and_reports_nothing() -> None:
    seen: list[tuple[str, int]] = []

    class Handler(FakeHandler):
        def inference(self, batch: list[int]) -> list[int]:
            seen.append((threading.current_thread().name, len(batch)))
            return super().inference(batch)

    observer = Recorder()
    cfg = config(micro_batch_size=4, warmup={"iterations": 2})
    with MicroBatching(Handler(), config=cfg, observer=observer) as mb:
        seconds = mb.warm_up(7)
        assert seconds >= 0
        assert [n for _, n in seen] == [1, 1, 2, 2, 4, 4]
        assert {name for name, _ in seen} == {"ts-microbatch-inference-0"}
        assert observer.stages == [] and observer.padding == [] and observer.batches == 0
        assert mb.handle([1, 2, 3]) == expected([1, 2, 3])
    assert observer.batches == 1 and ("inference", 3, 4) in observer.padding


def test_warm_up_failure_names_the_size() -> None:
    handler = FakeHandler()
    handler.always_fail.add("inference")
    with (
        MicroBatching(handler, config=config(micro_batch_size=4)) as mb,
        pytest.raises(WarmupError) as info,
    ):
        mb.warm_up(1, sizes=[2])
    assert "warm-up with a micro-batch of 2 failed: RuntimeError: inference is broken" in str(
        info.value
    )


def test_pipeline_refuses_allowed_sizes_without_a_padded_stage() -> None:
    with pytest.raises(ConfigError, match="padded_stage"):
        Pipeline({"a": lambda x: x}, allowed_sizes=[1, 2])
    with pytest.raises(ConfigError, match="padded_stage"):
        Pipeline({"a": lambda x: x}, allowed_sizes=[1, 2], padded_stage="b")


def test_a_micro_batch_size_over_the_largest_allowed_is_refused_at_run_time_too() -> None:
    with MicroBatching(FakeHandler(), config=config()) as mb:
        with pytest.raises(ConfigError, match="expected the largest to be at least"):
            mb.micro_batch_size = 16
        assert mb.micro_batch_size == 8
        mb.micro_batch_size = 4
        assert mb.handle(list(range(6))) == expected(list(range(6)))
    pipeline = Pipeline(
        {"inference": lambda x: x},
        micro_batch_size=2,
        allowed_sizes=[1, 2],
        padded_stage="inference",
    )
    with pipeline, pytest.raises(ConfigError, match="expected at most the largest"):
        pipeline.micro_batch_size = 3
