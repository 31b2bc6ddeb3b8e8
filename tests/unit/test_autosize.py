"""micro_batch_size "auto": where the cost model settles, driven by stages of known cost."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from tests.unit.fakes import FakeHandler, expected
from ts_microbatch import ConfigError, MicroBatching, MicroBatchingConfig
from ts_microbatch.autosize import AutoMicroBatchSize, StageCost, fit_cost, predicted_makespan_s

THREADS = {"preprocess": 2, "inference": 1, "postprocess": 1}
Costs = dict[str, Callable[[int], float]]


def known_costs(inference_fixed_s: float = 0.008) -> Costs:
    """CPU-heavy preprocessing, an accelerator with a fixed launch cost, cheap postprocessing."""
    return {
        "preprocess": lambda n: 0.0005 + 0.003 * n,
        "inference": lambda n: inference_fixed_s + 0.0005 * n,
        "postprocess": lambda n: 0.0001 + 0.00001 * n,
    }


def true_makespan(costs: Costs, batch: int, n: int) -> float:
    fitted = {s: StageCost(f(0), f(1) - f(0)) for s, f in costs.items()}
    return predicted_makespan_s(fitted, THREADS, batch, n)


def drive(policy: AutoMicroBatchSize, costs: Costs, batches: int, batch: int = 32) -> list[int]:
    """Runs `batches` batches the way the pipeline reports them; returns the sizes chosen."""
    chosen = []
    for _ in range(batches):
        size = policy.choose(batch, THREADS)
        chosen.append(size)
        for offset in range(0, batch, size):
            n = min(size, batch - offset)
            for stage, cost in costs.items():
                policy.observe(stage, n, cost(n))
    return chosen


def test_fit_recovers_a_line() -> None:
    assert fit_cost([(1, 0.003), (4, 0.006), (8, 0.010)]) == pytest.approx(StageCost(0.002, 0.001))
    assert fit_cost([(4, 0.006), (4, 0.007)]) is None
    assert fit_cost([(1, 0.005), (2, 0.004)]).per_item_s == 0.0  # never negative


def test_settles_on_the_least_makespan_within_a_few_batches() -> None:
    costs = known_costs()
    optimum = min(range(1, 33), key=lambda n: true_makespan(costs, 32, n))
    assert 4 <= optimum <= 12  # neither extreme: the case is a real trade-off
    policy = AutoMicroBatchSize(1, 32, explore_every=8)
    chosen = drive(policy, costs, 24)
    settled = [size for i, size in enumerate(chosen[3:], start=4) if i % 8]  # skip explorations
    assert set(settled) == {optimum}, chosen
    assert all(1 <= s <= 32 for s in chosen)


def test_never_worse_than_a_badly_chosen_fixed_size() -> None:
    costs = known_costs()
    policy = AutoMicroBatchSize(1, 32)
    drive(policy, costs, 10)
    best = policy.best(32, THREADS)
    assert best is not None
    for fixed in (1, 2, 32):
        assert true_makespan(costs, 32, best) <= true_makespan(costs, 32, fixed)


def test_adapts_when_stage_costs_change() -> None:
    policy = AutoMicroBatchSize(1, 32, window=32)
    drive(policy, known_costs(0.008), 12)
    before = policy.best(32, THREADS)
    slower_launch = known_costs(0.060)  # e.g. a busier device: fixed cost per call grows
    drive(policy, slower_launch, 30)
    after = policy.best(32, THREADS)
    optimum = min(range(1, 33), key=lambda n: true_makespan(slower_launch, 32, n))
    assert before is not None and after is not None and after > before
    assert math.isclose(
        true_makespan(slower_launch, 32, after),
        true_makespan(slower_launch, 32, optimum),
        rel_tol=0.03,
    )


def test_stays_inside_bounds_and_the_batch() -> None:
    policy = AutoMicroBatchSize(3, 6)
    chosen = drive(policy, known_costs(), 20)
    assert all(3 <= s <= 6 for s in chosen)
    assert policy.choose(2, THREADS) <= 2


def test_auto_through_micro_batching_answers_every_request() -> None:
    handler = FakeHandler(jitter_s=0.001)
    config = MicroBatchingConfig.from_mapping(
        {"micro_batch_size": "auto", "min_micro_batch_size": 2, "max_micro_batch_size": 8}
    )
    with MicroBatching(handler, config=config) as mb:
        for _ in range(6):
            assert mb.handle(list(range(20))) == expected(list(range(20)))
        assert 2 <= mb.micro_batch_size <= 8
        assert mb.config.micro_batch_size == "auto"
        mb.micro_batch_size = 5
        assert mb.config.micro_batch_size == 5
    sizes = {len(call) for call in handler.calls["preprocess"]}
    assert sizes <= set(range(2, 9)) | {20 % s for s in range(2, 9)}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"micro_batch_size": "big"},
            "micro_batching.micro_batch_size: got 'big', expected an integer >= 1 or \"auto\"",
        ),
        (
            {"min_micro_batch_size": 8, "max_micro_batch_size": 4},
            "min_micro_batch_size: got 8, expected at most",
        ),
        ({"max_micro_batch_size": 0}, "micro_batching.max_micro_batch_size: got 0"),
    ],
)
def test_auto_config_errors(mapping: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        MicroBatchingConfig.from_mapping(mapping)
    assert message in str(info.value)
