"""allowed_micro_batch_sizes: padding before inference, cut back before postprocess; warm-up."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from tests.core.fakes import Bad, FakeHandler, expected
from tests.core.test_autosize import THREADS, drive, known_costs
from ts_microbatch import (
    ConfigError,
    MicroBatching,
    MicroBatchingConfig,
    Pipeline,
    PipelineObserver,
    StageOutputError,
)
from ts_microbatch.core._padding import pad, unpad
from ts_microbatch.core.autosize import AutoMicroBatchSize
from ts_microbatch.core.config import WarmupConfig
from ts_microbatch.core.errors import WarmupError

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


class Pair(NamedTuple):
    ids: Any
    mask: Any


def config(**settings: Any) -> MicroBatchingConfig:
    return MicroBatchingConfig.from_mapping(
        {"micro_batch_size": 8, "allowed_micro_batch_sizes": ALLOWED, **settings}
    )


def tensors(**settings: Any) -> MicroBatchingConfig:
    """Padding of the handler's batch-major tensors (needs a warm-up to check it)."""
    return config(pad="tensors", warmup={}, **settings)


@pytest.mark.parametrize("pad", ["requests", "tensors"])
def test_inference_sees_only_allowed_sizes_and_every_request_is_answered_once(pad: str) -> None:
    handler = FakeHandler(jitter_s=0.001)
    observer = Recorder()
    rng = random.Random(1)
    sizes = [rng.randint(1, 32) for _ in range(30)]
    with MicroBatching(handler, config=config(pad=pad, warmup={}), observer=observer) as mb:
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
    every = sorted(x for n in sizes for x in range(100 * n, 100 * n + n))
    posted = [x for call in handler.calls["postprocess"] for x in call]
    if pad == "tensors":  # postprocess got each request exactly once: no padded item
        assert sorted(posted) == every
        assert all(stage == "inference" for stage, _, _ in observer.padding)
    else:  # whole requests are padded: every stage sees the allowed sizes
        assert {len(call) for call in handler.calls["postprocess"]} <= set(ALLOWED)
        assert sorted(set(posted)) == sorted(set(every)) and len(posted) > len(every)
        assert all(stage == "preprocess" for stage, _, _ in observer.padding)
    padded = [(n, to) for _, n, to in observer.padding]
    assert (3, 4) in padded or (5, 8) in padded or (6, 8) in padded or (7, 8) in padded
    assert all(to == min(a for a in ALLOWED if a >= n) for n, to in padded)
    # Stage metrics count requests, never padded items.
    assert sum(n for stage, n in observer.stages if stage == "inference") == sum(sizes)


@pytest.mark.parametrize("pad", ["requests", "tensors"])
def test_a_bad_item_in_a_padded_micro_batch_is_isolated_and_the_rest_answered(pad: str) -> None:
    handler = FakeHandler()
    handler.fail_on["inference"] = {5}
    with MicroBatching(handler, config=config(micro_batch_size=7, pad=pad, warmup={})) as mb:
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
        (
            Pair(torch.arange(3), np.arange(3)),
            lambda p: type(p) is Pair and p.ids.tolist() == [0, 1, 2, 2],
        ),
        (
            torch.topk(torch.arange(12.0).reshape(3, 4), 2),
            lambda p: type(p).__name__ == "topk" and p.indices.shape == (4, 2),
        ),
        ((torch.ones(3, 2), None), lambda p: p[0].shape == (4, 2) and p[1] is None),
    ],
)
def test_pad_and_unpad_batch_major_payloads_keep_their_types(payload: Any, check: Any) -> None:
    padded = pad(payload, 3, 4, "preprocess's output")
    assert check(padded)
    assert same(unpad(padded, 3, 4, "inference's output"), payload)


def same(a: Any, b: Any) -> bool:
    """Equal types, structure and values (tensors and arrays compared by value)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(map(same, a, b))
    if a is None:
        return True
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def test_same_tells_tuple_types_apart() -> None:
    assert (
        not same(Pair(1, 2), (1, 2)) and not same((1, 2), [1, 2]) and same(Pair(1, 2), Pair(1, 2))
    )


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

    with MicroBatching(Scalar(), config=tensors(micro_batch_size=3, isolate_failures=False)) as mb:
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
        before = time.monotonic()
        seconds = mb.warm_up(7)
        assert 0 < seconds <= time.monotonic() - before
        # Each size twice, then the padding check: 4 unpadded, and 3 padded to 4.
        assert [n for _, n in seen] == [1, 1, 2, 2, 4, 4, 4, 4]
        assert {name for name, _ in seen} == {"ts-microbatch-inference-0"}
        assert observer.stages == [] and observer.padding == [] and observer.batches == 0
        assert mb.handle([1, 2, 3]) == expected([1, 2, 3])
    assert observer.batches == 1 and ("preprocess", 3, 4) in observer.padding


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


def test_pipeline_refuses_allowed_sizes_without_padded_stages() -> None:
    with pytest.raises(ConfigError, match="padded_stages"):
        Pipeline({"a": lambda x: x}, allowed_sizes=[1, 2])
    with pytest.raises(ConfigError, match="padded_stages"):
        Pipeline({"a": lambda x: x}, allowed_sizes=[1, 2], padded_stages=["b"])
    with pytest.raises(ConfigError, match="consecutive"):
        Pipeline(
            {"a": lambda x: x, "b": lambda x: x, "c": lambda x: x},
            allowed_sizes=[1, 2],
            padded_stages=["a", "c"],
        )


@pytest.mark.parametrize(
    ("allowed", "message"),
    [([], "expected a non-empty list"), ([0, 4], "allowed_micro_batch_sizes[0]: got 0")],
)
def test_hang_pipeline_accepted_allowed_sizes_it_cannot_pad_to(
    allowed: list[int], message: str
) -> None:
    # Defect: [] was accepted (IndexError at the first batch), [0, 4] too.
    with pytest.raises(ConfigError) as info:
        Pipeline({"a": lambda x: x}, allowed_sizes=allowed, padded_stages=["a"])
    assert message in str(info.value)


def test_a_micro_batch_size_over_the_largest_allowed_is_refused_at_run_time_too() -> None:
    with MicroBatching(FakeHandler(), config=config()) as mb:
        with pytest.raises(ConfigError, match="expected the largest to be at least"):
            mb.micro_batch_size = 16
        assert mb.micro_batch_size == 8
        mb.micro_batch_size = 4
        assert mb.handle(list(range(6))) == expected(list(range(6)))


def test_hang_refused_micro_batch_size_stayed_in_force() -> None:
    # Defect: Pipeline stored the size, then raised; later batches were cut at 3.
    calls: list[list[int]] = []

    def inference(items: list[int]) -> list[int]:
        calls.append(list(items))
        return items

    pipeline = Pipeline(
        {"inference": inference},
        micro_batch_size=2,
        allowed_sizes=[1, 2],
        padded_stages=["inference"],
    )
    with pipeline:
        with pytest.raises(ConfigError, match="expected at most the largest"):
            pipeline.micro_batch_size = 3
        assert pipeline.micro_batch_size == 2
        assert [f.result(timeout=10) for f in pipeline.submit([1, 2, 3])] == [1, 2, 3]
    assert calls == [[1, 2], [3]]


def test_hang_fixed_size_with_allowed_sizes_below_min_was_refused_for_a_size_never_set() -> None:
    # Defect: "micro_batch_size: got 8" (the min, used as a placeholder) for a valid config.
    cfg = MicroBatchingConfig.from_mapping(
        {"micro_batch_size": 2, "min_micro_batch_size": 8, "allowed_micro_batch_sizes": [1, 2]}
    )
    handler = FakeHandler()
    with MicroBatching(handler, config=cfg) as mb:
        assert mb.micro_batch_size == 2
        assert mb.handle([1, 2, 3]) == expected([1, 2, 3])
    assert [len(c) for c in handler.calls["inference"]] == [2, 1]


def test_hang_unsorted_allowed_sizes_built_directly_padded_to_the_wrong_size() -> None:
    # Defect: MicroBatchingConfig(allowed_micro_batch_sizes=(8, 1, 4)) kept that order, so
    # 3 items padded to 8 (the first size that holds them) and warm-up ran 8, 1, 4.
    cfg = MicroBatchingConfig(
        micro_batch_size=4, allowed_micro_batch_sizes=(8, 1, 4), warmup=WarmupConfig()
    )
    assert cfg.allowed_micro_batch_sizes == (1, 4, 8)
    assert cfg.warmup_sizes() == (1, 4) and cfg.padded_size(3) == 4
    handler = FakeHandler()
    with MicroBatching(handler, config=cfg) as mb:
        assert mb.handle([1, 2, 3]) == expected([1, 2, 3])
    assert [len(c) for c in handler.calls["inference"]] == [4]


class FlatTokens(FakeHandler):
    """Like examples/text_classifier: one flat tensor of every request's tokens and the
    offsets where each request starts; inference sums each request's bag (empty bag: 0)."""

    def preprocess(self, data: list[int]) -> Any:
        self.calls["preprocess"].append(list(data))
        return torch.tensor(data), torch.arange(len(data))  # one token per request

    def inference(self, batch: Any) -> Any:
        tokens, offsets = batch
        ends = [*offsets.tolist()[1:], len(tokens)]
        return torch.stack([tokens[a:b].sum() for a, b in zip(offsets.tolist(), ends)])

    def postprocess(self, batch: Any) -> list[int]:
        return [int(x) for x in batch]


def test_hang_padding_a_flat_token_tensor_answered_an_empty_bag_with_200() -> None:
    # Defect (examples/text_classifier, allowed [1, 2, 4], three one-word requests):
    # request 2 got the prediction of an empty bag. Whole requests are padded by default.
    cfg = MicroBatchingConfig.from_mapping(
        {"micro_batch_size": 4, "allowed_micro_batch_sizes": [1, 2, 4], "warmup": {}}
    )
    handler = FlatTokens()
    with MicroBatching(handler, config=cfg) as mb:
        mb.warm_up(5)
        assert mb.handle([7, 8, 9]) == [7, 8, 9]
    assert handler.calls["preprocess"][-1] == [7, 8, 9, 9]  # the padded request


def test_warm_up_refuses_tensor_padding_that_changes_answers() -> None:
    cfg = tensors(micro_batch_size=4, allowed_micro_batch_sizes=[1, 2, 4])
    with MicroBatching(FlatTokens(), config=cfg) as mb, pytest.raises(WarmupError) as info:
        mb.warm_up(5)
    assert "a micro-batch of 3 padded to 4 answered row 2 differently" in str(info.value)
    assert "use pad: requests" in str(info.value)


@pytest.mark.parametrize(
    "output",
    [
        lambda t: torch.topk(t.float().unsqueeze(1).repeat(1, 3), 2),  # torch.return_types
        lambda t: Pair(t * 2, None),  # a namedtuple holding None
        lambda t: (t * 2, None),
    ],
)
def test_hang_padded_structured_outputs_failed_every_request(output: Any) -> None:
    # Defect: a namedtuple, torch.return_types or a tuple holding None from inference got
    # 500 for every request when padded (200 unpadded).
    class Structured(FakeHandler):
        def preprocess(self, data: list[int]) -> Any:
            return torch.tensor(data)

        def inference(self, batch: Any) -> Any:
            return output(batch)

        def postprocess(self, batch: Any) -> list[Any]:
            self.calls["postprocess"].append([type(batch).__name__])
            first = batch[0]
            return [row.tolist() for row in first]

    handler = Structured()
    with MicroBatching(handler, config=tensors(micro_batch_size=4)) as mb:
        padded = mb.handle([1, 2, 3])  # padded to 4
        alone = [mb.handle([x])[0] for x in (1, 2, 3)]
    assert padded == alone
    assert handler.calls["postprocess"][0] == [type(output(torch.tensor([1]))).__name__]


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"pad": "rows"}, "micro_batching.pad: got 'rows', expected one of requests, tensors"),
        (
            {"allowed_micro_batch_sizes": [1, 2], "pad": "tensors"},
            "micro_batching.pad: got 'tensors' without warmup",
        ),
    ],
)
def test_pad_config_errors_name_the_key(mapping: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        MicroBatchingConfig.from_mapping(mapping)
    assert message in str(info.value)
