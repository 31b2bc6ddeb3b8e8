"""``"auto"`` with lengths: the cut chosen from costs per padded token.

The costs are fed in directly (as the pipeline feeds measured stage runs), so the choices
are deterministic; one test runs the pipeline to prove it feeds and follows the chooser.
"""

from __future__ import annotations

from typing import Any

from ts_microbatch import Pipeline
from ts_microbatch.core.autobudget import AutoTokenBudget, predicted_makespan_s
from ts_microbatch.core.lengths import LengthRule

THREADS = {"preprocess": 1, "inference": 1, "postprocess": 1}
RULE = LengthRule(len, order="length")


def fed(fixed_s: float, per_token_s: float) -> AutoTokenBudget:
    """A chooser whose inference costs fixed_s + per_token_s * t (the other stages ~0)."""
    auto = AutoTokenBudget(32)
    for tokens in (64, 256, 1024, 4096, 16384):
        auto.observe("preprocess", tokens, 1e-5 + 1e-8 * tokens)
        auto.observe("inference", tokens, fixed_s + per_token_s * tokens)
        auto.observe("postprocess", tokens, 1e-5)
    return auto


def test_nothing_to_gain_from_splitting_keeps_the_whole_batch() -> None:
    # Equal lengths: splitting only adds the fixed cost again (the plain handler's shape).
    auto = fed(fixed_s=0.005, per_token_s=1e-5)
    assert auto.costs() is not None
    assert auto.choose(RULE, [50] * 32, THREADS) == (32,)


def test_a_long_tail_is_cut_into_groups_of_similar_length() -> None:
    auto = fed(fixed_s=0.002, per_token_s=1e-5)
    lengths = sorted([12] * 22 + [90] * 8 + [480, 500])
    sizes = auto.choose(RULE, lengths, THREADS)
    assert len(sizes) > 1 and sum(sizes) == 32
    costs = auto.costs()
    assert costs is not None
    whole = predicted_makespan_s(costs, THREADS, RULE, lengths, 32 * 500, 32)
    assert predicted_makespan_s(costs, THREADS, RULE, lengths, auto.last_budget or 0, 32) < whole
    # The two long documents do not ride with the short queries.
    assert sizes[-1] <= 2


def test_until_costs_are_known_it_explores_both_ends() -> None:
    auto = AutoTokenBudget(32)
    assert auto.costs() is None
    first = auto.choose(RULE, [40] * 16, THREADS)
    second = auto.choose(RULE, [40] * 16, THREADS)
    assert {first, second} == {(16,), (1,) * 16}


def test_a_neighbour_budget_is_run_every_explore_every_batches() -> None:
    auto = fed(fixed_s=0.005, per_token_s=1e-5)
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
        self.seen: list[tuple[str, int]] = []

    def observe(self, stage: str, tokens: int, run_s: float) -> None:
        self.seen.append((stage, tokens))
        super().observe(stage, tokens, run_s)


def test_the_pipeline_follows_the_chooser_and_feeds_it_padded_tokens() -> None:
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
    expected = [("preprocess", len(c) * rule.padded(max(map(len, c)))) for c in calls]
    assert [s for s in auto.seen if s[0] == "preprocess"] == expected
