"""``"auto"`` with lengths: the cut chosen from costs by shape (items x padded length).

The costs are fed in directly (as the pipeline feeds measured stage runs), so the choices
are deterministic; one test runs the pipeline to prove it feeds and follows the chooser.
"""

from __future__ import annotations

from typing import Any

import pytest

from ts_microbatch import Pipeline
from ts_microbatch.core.autobudget import (
    AutoTokenBudget,
    ShapeCost,
    fit_shape_cost,
    predicted_makespan_s,
)
from ts_microbatch.core.lengths import LengthRule

THREADS = {"preprocess": 1, "inference": 1, "postprocess": 1}
RULE = LengthRule(len, order="length")
SHAPES = [(1, 16), (4, 16), (32, 16), (2, 128), (8, 128), (1, 512), (2, 512), (16, 64)]


def fed(cost: ShapeCost) -> AutoTokenBudget:
    """A chooser whose inference costs ``cost`` (the other stages next to nothing)."""
    auto = AutoTokenBudget(32)
    for n, length in SHAPES:
        auto.observe("preprocess", n, length, 1e-5 + 1e-8 * n * length)
        auto.observe("inference", n, length, cost.at(n, length))
        auto.observe("postprocess", n, length, 1e-5)
    return auto


def test_the_fit_recovers_a_shape_cost() -> None:
    truth = ShapeCost(0.004, 2e-6, 1e-6)
    fit = fit_shape_cost([(n, length, truth.at(n, length)) for n, length in SHAPES])
    assert fit is not None
    assert fit == pytest.approx(truth, rel=1e-6, abs=1e-12)


def test_one_length_fits_without_the_attention_term_and_no_coefficient_is_negative() -> None:
    fit = fit_shape_cost([(n, 64, 0.003 + 1e-5 * n * 64) for n in (1, 4, 16)])
    assert fit is not None and fit.per_token_length_s == 0.0
    assert fit.fixed_s == pytest.approx(0.003) and fit.per_token_s == pytest.approx(1e-5)
    noisy = fit_shape_cost([(1, 64, 0.01), (8, 64, 0.004), (16, 64, 0.005)])
    assert noisy is not None and min(noisy) >= 0.0
    assert fit_shape_cost([(4, 64, 0.01), (4, 64, 0.011)]) is None  # one token count


def test_nothing_to_gain_from_splitting_keeps_the_whole_batch() -> None:
    # Equal lengths: splitting only adds the fixed cost again (the plain handler's shape).
    auto = fed(ShapeCost(0.005, 1e-5, 0.0))
    assert auto.costs() is not None
    assert auto.choose(RULE, [50] * 32, THREADS) == (32,)


def test_a_long_tail_is_cut_into_groups_of_similar_length() -> None:
    auto = fed(ShapeCost(0.002, 1e-5, 2e-6))
    lengths = sorted([12] * 22 + [90] * 8 + [480, 500])
    sizes = auto.choose(RULE, lengths, THREADS)
    assert len(sizes) > 1 and sum(sizes) == 32
    costs = auto.costs()
    assert costs is not None
    whole = predicted_makespan_s(costs, THREADS, RULE, lengths, 32 * 500, 32)
    assert predicted_makespan_s(costs, THREADS, RULE, lengths, auto.last_budget or 0, 32) < whole
    assert sizes[-1] <= 2  # the two long documents do not ride with the short queries


def test_a_fixed_cost_per_call_keeps_micro_batches_from_getting_tiny() -> None:
    # On a CPU a small micro-batch is slow per token: a large fixed cost per call.
    lengths = sorted([12] * 22 + [90] * 8 + [480, 500])
    cheap_calls = fed(ShapeCost(0.0001, 1e-5, 2e-6)).choose(RULE, lengths, THREADS)
    costly_calls = fed(ShapeCost(0.05, 1e-5, 2e-6)).choose(RULE, lengths, THREADS)
    assert len(costly_calls) < len(cheap_calls)


def test_until_costs_are_known_it_runs_the_start_budget_and_its_neighbours() -> None:
    auto = AutoTokenBudget(32, start_budget=256)
    assert auto.costs() is None
    budgets = []
    for _ in range(3):
        auto.choose(RULE, [64] * 16, THREADS)
        budgets.append(auto.last_budget)
    assert sorted(budgets) == [128, 256, 512]  # never the whole batch (1024) to explore


def test_a_neighbour_budget_is_run_every_explore_every_batches() -> None:
    auto = fed(ShapeCost(0.005, 1e-5, 0.0))
    auto._explore_every = 4  # noqa: SLF001 - a short period for the test
    budgets = []
    for _ in range(8):
        auto.choose(RULE, [50] * 32, THREADS)
        budgets.append(auto.last_budget)
    chosen = max(budgets, key=budgets.count)
    assert sum(b != chosen for b in budgets) == 2  # batches 4 and 8


class Recording(AutoTokenBudget):
    def __init__(self) -> None:
        super().__init__(8)
        self.seen: list[tuple[str, int, int]] = []

    def observe(self, stage: str, items: int, padded_length: int, run_s: float) -> None:
        self.seen.append((stage, items, padded_length))
        super().observe(stage, items, padded_length, run_s)


def test_the_pipeline_follows_the_chooser_and_feeds_it_shapes() -> None:
    calls: list[list[str]] = []

    def preprocess(items: list[str]) -> list[str]:
        calls.append(list(items))
        return items

    stages: dict[str, Any] = {"preprocess": preprocess, "inference": list, "postprocess": list}
    auto = Recording()
    rule = LengthRule(len, order="length", allowed_lengths=(8, 16, 32))
    with Pipeline(stages, micro_batch_size=8, lengths=rule, token_budget=auto) as pipeline:
        items = ["x" * n for n in (3, 30, 5, 12, 7, 2)]
        batch = pipeline.submit_batch(items)
        assert batch.wait(30)
    assert [f.result() for f in batch.futures] == items
    assert tuple(len(c) for c in calls) == auto.last_sizes
    expected = [("preprocess", len(c), rule.padded(max(map(len, c)))) for c in calls]
    assert [s for s in auto.seen if s[0] == "preprocess"] == expected
