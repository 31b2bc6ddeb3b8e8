"""Variable-length items: ordering by length, token budgets, buckets and refusals.

Items here are strings; an item's length is ``len(item)`` unless a test says otherwise. The
stages record what each call saw (its rows and ``current_micro_batch()``), so every test
proves the cut it asserts about happened, then checks each answer landed on its own item.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ts_microbatch import InvalidInputError, Pipeline
from ts_microbatch.core.errors import PayloadTooLargeError
from ts_microbatch.core.lengths import LengthRule, cut_sizes, plan
from ts_microbatch.core.metrics import PipelineObserver
from ts_microbatch.core.micro_batch import MicroBatchInfo, current_micro_batch


class Recorder:
    """Stages that answer each item with itself upper-cased and record every call."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[list[str], MicroBatchInfo | None]] = []
        self._lock = threading.Lock()
        self.fail_on = fail_on

    def preprocess(self, items: list[str]) -> list[str]:
        with self._lock:
            self.calls.append((list(items), current_micro_batch()))
        if self.fail_on is not None and self.fail_on in items:
            raise InvalidInputError(f"bad item {self.fail_on}")
        return [item.upper() for item in items]

    def stages(self) -> dict[str, Any]:
        return {"preprocess": self.preprocess, "inference": list, "postprocess": list}


class Tokens(PipelineObserver):
    def __init__(self) -> None:
        self.reports: list[tuple[int, int]] = []

    def on_tokens(self, real: int, padded: int) -> None:
        self.reports.append((real, padded))


def run(
    items: Sequence[str],
    rule: LengthRule,
    size: int = 32,
    *,
    owners: Sequence[int] | None = None,
    recorder: Recorder | None = None,
    observer: PipelineObserver | None = None,
) -> tuple[list[Any], Recorder]:
    """Answers (results or exceptions, in item order) of one batch, and what the stages saw."""
    recorder = recorder or Recorder()
    with Pipeline(
        recorder.stages(), micro_batch_size=size, lengths=rule, observer=observer
    ) as pipeline:
        batch = pipeline.submit_batch(list(items), owners=owners)
        assert batch.wait(30)
    answers = [f.exception() or f.result() for f in batch.futures]
    return answers, recorder


def text(n: int, tag: str = "a") -> str:
    return tag * n


def test_length_order_groups_similar_lengths_and_answers_each_in_its_place() -> None:
    items = [text(50, "a"), text(3, "b"), text(400, "c"), text(7, "d"), text(45, "e")]
    answers, recorder = run(items, LengthRule(len, order="length"), size=2)
    # The scenario: the cut went by length, not by arrival.
    assert [rows for rows, _ in recorder.calls] == [
        [items[1], items[3]],
        [items[4], items[0]],
        [items[2]],
    ]
    assert answers == [item.upper() for item in items]


def test_arrival_order_is_kept_without_order_length() -> None:
    items = [text(50), text(3), text(400)]
    _, recorder = run(items, LengthRule(len, max_tokens=1000), size=2)
    assert [rows for rows, _ in recorder.calls] == [items[:2], items[2:]]


def test_a_budget_lets_short_items_ride_together_and_long_ones_go_with_few() -> None:
    lengths = [10] * 12 + [300, 290, 280]
    items = [text(n, chr(97 + i % 26)) for i, n in enumerate(lengths)]
    rule = LengthRule(len, order="length", max_micro_batch_tokens=600)
    answers, recorder = run(items, rule, size=8)
    sizes = [len(rows) for rows, _ in recorder.calls]
    assert sizes == [8, 4, 2, 1]  # 8: the count cap; 2 x 290 <= 600 < 3 x 300
    for rows, info in recorder.calls:
        assert info is not None and info.padded_length == max(len(r) for r in rows)
        assert len(rows) == 1 or len(rows) * info.padded_length <= 600
    assert answers == [item.upper() for item in items]


def test_buckets_set_the_padded_length_the_stage_sees() -> None:
    items = [text(5), text(30), text(33), text(120)]
    rule = LengthRule(len, order="length", allowed_lengths=(32, 64, 128))
    _, recorder = run(items, rule, size=2)
    seen = [(len(rows), info.padded_length if info else None) for rows, info in recorder.calls]
    assert seen == [(2, 32), (2, 128)]
    assert recorder.calls[0][1] is not None and recorder.calls[0][1].lengths == (5, 30)


def test_an_item_over_max_tokens_is_refused_alone_with_413_before_any_stage() -> None:
    items = [text(10), text(600), text(20)]
    answers, recorder = run(items, LengthRule(len, max_tokens=512))
    assert [rows for rows, _ in recorder.calls] == [[items[0], items[2]]]  # never ran
    assert isinstance(answers[1], PayloadTooLargeError) and answers[1].status_code == 413
    assert "600 tokens" in str(answers[1]) and "max_tokens" in str(answers[1])
    assert answers[0] == items[0].upper() and answers[2] == items[2].upper()


def test_the_largest_bucket_is_the_limit_and_truncate_counts_at_it() -> None:
    items = [text(10), text(70)]
    refused, _ = run(items, LengthRule(len, allowed_lengths=(32, 64)))
    assert isinstance(refused[1], PayloadTooLargeError)
    assert "allowed_sequence_lengths" in str(refused[1])
    kept, recorder = run(items, LengthRule(len, allowed_lengths=(32, 64), truncate=True))
    assert kept == [item.upper() for item in items]
    info = recorder.calls[0][1]
    assert info is not None and info.lengths == (10, 64) and info.padded_length == 64


def test_one_item_of_a_request_too_long_refuses_the_whole_request() -> None:
    # A request of several items (a KServe request of n instances) stands or falls whole.
    items = [text(5), text(9), text(900), text(4)]
    answers, recorder = run(items, LengthRule(len, max_tokens=100), owners=[0, 1, 1, 2])
    assert all(isinstance(a, PayloadTooLargeError) for a in answers[1:3])
    assert answers[0] == items[0].upper() and answers[3] == items[3].upper()
    assert [rows for rows, _ in recorder.calls] == [[items[0], items[3]]]


def test_a_request_whose_length_cannot_be_measured_fails_alone_with_400() -> None:
    def measure(item: str) -> int:
        if item == "unreadable":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return len(item)

    answers, _ = run(["ok", "unreadable", "fine"], LengthRule(measure, order="length"))
    assert isinstance(answers[1], InvalidInputError) and answers[1].status_code == 400
    assert "cannot be measured" in str(answers[1])
    assert answers[0] == "OK" and answers[2] == "FINE"


def test_a_measure_raising_a_base_exception_fails_only_its_request() -> None:
    def measure(item: str) -> int:
        if item == "stop":
            raise KeyboardInterrupt
        return len(item)

    answers, recorder = run(["ok", "stop", "fine"], LengthRule(measure, order="length"))
    assert isinstance(answers[1], KeyboardInterrupt)
    assert answers[0] == "OK" and answers[2] == "FINE"
    assert [rows for rows, _ in recorder.calls] == [["ok", "fine"]]


@pytest.mark.parametrize("length", [-1, 2.5, None, True])
def test_a_length_that_is_not_a_count_fails_its_request(length: Any) -> None:
    answers, _ = run(["x", "y"], LengthRule(lambda item: length if item == "y" else 1))
    assert isinstance(answers[1], InvalidInputError) and answers[0] == "X"


def test_a_bad_item_in_a_length_ordered_batch_fails_alone() -> None:
    # Isolation bisects positions of the cut: it must blame the right request.
    items = [text(n, chr(97 + n % 26)) for n in (40, 2, 17, 9, 33, 5, 21, 11)]
    bad = items[4]
    answers, recorder = run(
        items, LengthRule(len, order="length"), size=4, recorder=Recorder(fail_on=bad)
    )
    assert any(bad in rows and len(rows) > 1 for rows, _ in recorder.calls)  # it was bisected
    assert isinstance(answers[4], InvalidInputError)
    assert [a for i, a in enumerate(answers) if i != 4] == [
        item.upper() for i, item in enumerate(items) if i != 4
    ]


def test_stage_calls_reach_the_requests_of_their_rows_in_cut_order() -> None:
    items = [text(30), text(3), text(12)]
    _, recorder = run(items, LengthRule(len, order="length"), size=3)
    info = recorder.calls[0][1]
    assert info is not None and info.item_requests == (1, 2, 0)


def test_tokens_are_reported_real_and_padded_per_micro_batch() -> None:
    observer = Tokens()
    items = [text(10), text(2), text(30), text(28)]
    run(items, LengthRule(len, order="length"), size=2, observer=observer)
    assert observer.reports == [(12, 20), (58, 60)]


def test_warm_up_shapes_are_cut_exactly_whatever_the_rule() -> None:
    recorder = Recorder()
    rule = LengthRule(len, order="length", max_micro_batch_tokens=10)
    with Pipeline(recorder.stages(), micro_batch_size=1, lengths=rule) as pipeline:
        batch = pipeline.submit_batch([text(9), text(3), text(9)], micro_batch_size=3, quiet=True)
        assert batch.wait(30)
    assert [len(rows) for rows, _ in recorder.calls] == [3]


@given(
    lengths=st.lists(st.integers(0, 700), min_size=1, max_size=40),
    size=st.integers(1, 16),
    budget=st.none() | st.integers(1, 3000),
    order=st.sampled_from(["arrival", "length"]),
    buckets=st.none() | st.lists(st.integers(1, 600), min_size=1, max_size=5, unique=True),
    max_tokens=st.none() | st.integers(1, 700),
    min_items=st.integers(1, 4),
    data=st.data(),
)
def test_every_item_is_answered_once_in_its_place_and_cuts_keep_their_bounds(
    lengths: list[int],
    size: int,
    budget: int | None,
    order: str,
    buckets: list[int] | None,
    max_tokens: int | None,
    min_items: int,
    data: st.DataObject,
) -> None:
    allowed = tuple(sorted(buckets)) if buckets else None
    rule = LengthRule(len, order, budget, allowed, max_tokens, min_items=min(min_items, size))
    # Requests of one to three items each.
    owners: list[int] = []
    while len(owners) < len(lengths):
        owners += [len(set(owners))] * data.draw(st.integers(1, 3))
    owners = owners[: len(lengths)]
    items = [f"{i}:" + "x" * max(0, n - len(f"{i}:")) for i, n in enumerate(lengths)]
    answers, recorder = run(items, rule, size, owners=owners)
    limit = rule.limit
    too_long = {
        owners[i] for i, item in enumerate(items) if limit is not None and len(item) > limit
    }
    for i, item in enumerate(items):
        if owners[i] in too_long:
            assert isinstance(answers[i], PayloadTooLargeError)
        else:
            assert answers[i] == item.upper()
    seen = [row for rows, _ in recorder.calls for row in rows]
    assert sorted(seen) == sorted(i for i in items if owners[items.index(i)] not in too_long)
    for rows, info in recorder.calls:
        assert info is not None and 1 <= len(rows) <= size
        padded = info.padded_length
        assert padded is not None and padded >= max(len(r) for r in rows)
        if budget is not None and len(rows) > rule.min_items:
            assert len(rows) * padded <= budget


def test_plan_keeps_a_requests_items_together_when_sorting() -> None:
    rule = LengthRule(len, order="length")
    result = plan(rule, ["aaaa", "b", "cc", "d"], [0, 0, 1, 2], 4)
    assert result.order == (3, 2, 0, 1)  # request 0 (longest 4) last, its items together


def test_cut_sizes_without_a_budget_are_the_fixed_size() -> None:
    assert cut_sizes(LengthRule(len), [1] * 7, 3) == (3, 3, 1)


@pytest.mark.parametrize("length", ["12", 3.9, 3.0, True, False, -5])
def test_defect_item_length_true_float_or_str_was_accepted(length: Any) -> None:
    # 3.9 was counted as 3 and "12" as 12 by the adapter's int() before the core's check.
    answers, recorder = run(["x", "y"], LengthRule(lambda item: length if item == "y" else 1))
    assert [rows for rows, _ in recorder.calls] == [["x"]]  # the scenario: y never ran
    assert isinstance(answers[1], InvalidInputError) and answers[0] == "X"
    assert "item_length returned" in str(answers[1])


def test_integer_types_of_numpy_and_torch_are_lengths() -> None:
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    lengths = {"x": numpy.int64(3), "y": torch.tensor(5)}
    answers, recorder = run(["x", "y"], LengthRule(lambda item: lengths[item], order="length"))
    assert answers == ["X", "Y"]
    assert recorder.calls[0][1] is not None and recorder.calls[0][1].lengths == (3, 5)


def test_a_length_no_model_takes_is_its_requests_413() -> None:
    answers, recorder = run(["x", "y"], LengthRule(lambda item: 10**170 if item == "y" else 1))
    assert isinstance(answers[1], PayloadTooLargeError) and answers[0] == "X"
    assert [rows for rows, _ in recorder.calls] == [["x"]]


def test_defect_padding_to_allowed_sizes_exceeded_the_token_budget() -> None:
    # 21 items of 96 tokens fit a budget of 2048 (2016), but padded to the allowed 32 the
    # model saw 32 x 96 = 3072 tokens, 11 rows of them duplicates.
    allowed = (1, 2, 4, 8, 16, 32)
    rule = LengthRule(len, max_micro_batch_tokens=2048, allowed_sizes=allowed)
    sizes = cut_sizes(rule, [96] * 21, 32)
    assert sizes == (16, 5)
    assert all(rule.tokens(n, 96) <= 2048 for n in sizes)
    assert rule.most_items(96, 32) == 16  # warm-up's sizes: the same formula


def test_defect_a_planning_failure_failed_the_batch_and_every_later_one() -> None:
    calls: list[int] = []

    def broken_choice(lengths: Sequence[int]) -> Sequence[int]:
        calls.append(len(lengths))
        raise OverflowError("cannot fit")

    rule = LengthRule(len, order="length")
    result = plan(rule, ["ccc", "a", "bb"], None, 2, choose=broken_choice)
    assert calls == [3]  # the scenario: choosing raised
    assert result.order == (0, 1, 2) and result.sizes == (2, 1)  # arrival order, fixed size
    nonsense = plan(rule, ["ccc", "a", "bb"], None, 2, choose=lambda lengths: [5, -2])
    assert nonsense.order == (0, 1, 2) and nonsense.sizes == (2, 1)


LENGTH_RESULTS = st.one_of(
    st.integers(0, 600),
    st.integers(0, 10**400),
    st.integers(-(10**6), -1),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=4),
    st.just("raise"),
)


@given(
    results=st.lists(LENGTH_RESULTS, min_size=1, max_size=20),
    size=st.integers(1, 8),
    budget=st.none() | st.integers(1, 3000),
    buckets=st.none() | st.lists(st.integers(1, 600), min_size=1, max_size=4, unique=True),
    allowed=st.none() | st.sampled_from([(1, 2, 4, 8), (2, 8), (1, 3)]),
    auto=st.booleans(),
)
def test_whatever_item_length_returns_each_request_is_answered_and_the_next_batch_served(
    results: list[Any],
    size: int,
    budget: int | None,
    buckets: list[int] | None,
    allowed: tuple[int, ...] | None,
    auto: bool,
) -> None:
    """One request under "auto" with lengths once broke every later batch: its length
    overflowed the token budget's cost fit, outside any per-request guard."""
    from ts_microbatch.core.autobudget import AutoTokenBudget

    items = [f"{i}:x" for i in range(len(results))]
    by_item = dict(zip(items, results))

    def measure(item: str) -> Any:
        value = by_item.get(item, len(item))
        if value == "raise":
            raise ValueError("cannot measure")
        return value

    bucket_tuple = tuple(sorted(buckets)) if buckets else None
    rule = LengthRule(
        measure, "length", budget, bucket_tuple, truncate=False, allowed_sizes=allowed
    )
    recorder = Recorder()
    size = allowed[-1] if allowed else size
    token_budget = AutoTokenBudget(size, budget) if auto else None
    with Pipeline(
        recorder.stages(),
        micro_batch_size=size,
        lengths=rule,
        allowed_sizes=allowed,
        padded_stages=("preprocess", "inference", "postprocess") if allowed else None,
        token_budget=token_budget,
    ) as pipeline:
        batch = pipeline.submit_batch(items)
        assert batch.wait(30)
        for item, outcome in zip(items, (batch.outcome(i) for i in range(len(items)))):
            assert outcome is not None
            if outcome.error is None:
                assert outcome.value == item.upper()
            else:
                assert isinstance(outcome.error, (InvalidInputError, PayloadTooLargeError))
        for round_no in range(3):  # later batches of good requests are served normally
            good = [f"{round_no}:" + "y" * n for n in (3, 9, 1, 27, 5)]
            cap = bucket_tuple[-1] if bucket_tuple else 600  # within every limit
            by_item.update({item: len(item) % cap + 1 for item in good})
            later = pipeline.submit_batch(good)
            assert later.wait(30)
            assert [later.outcome(i) for i in range(len(good))] == [
                (item.upper(), None) for item in good
            ]
