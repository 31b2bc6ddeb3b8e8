"""The isolation rule (an item fails only when it fails alone) and the stages' breakers,
driven as the pipeline drives them (``isolation_driver``), without threads.

The defects named here were reproduced on 9a922de, whose verdicts counted evidence inside a
batch; each test fails there.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ts_microbatch import Pipeline
from ts_microbatch.core.batch import Batch, RequestFailure
from ts_microbatch.core.errors import SiblingFailedError
from ts_microbatch.core.micro_batch import _MicroBatch

from .isolation_driver import Drive, mixed, owners_of

# -- the reproduced defects --------------------------------------------------------------


def test_defect_one_bad_request_failed_every_request_of_its_batch() -> None:
    # Inference stacks its micro-batch (landscape with portrait fails, each alone passes);
    # [L,P] [L,P] [L,P] [gray] at micro-batch 2, the grayscale image failing alone: every
    # first run failed alike, and the batch rule failed all seven.
    def fails(stage: int, items: list[int]) -> bool:
        return stage == 1 and (mixed(items) or 6 in items)

    result = Drive(fails).batch([1] * 7, 2)
    first_runs = [[0, 1], [2, 3], [4, 5], [6]]
    assert all(result.ran(1, items) for items in first_runs)  # every first run failed
    assert result.failed_requests() == {6}


def test_defect_three_bad_requests_were_a_verdict_that_failed_good_ones() -> None:
    # KServe requests of two instances each, of two sizes (their halves fail only in each
    # other's company); requests 1, 4 and 7 bad; micro-batch 6, a fresh model.
    sizes = [2] * 9
    bad = {item for request in (1, 4, 7) for item in (2 * request, 2 * request + 1)}

    def fails(stage: int, items: list[int]) -> bool:
        return stage == 1 and (mixed(items) or bool(bad.intersection(items)))

    result = Drive(fails).batch(sizes, 6)
    assert result.ran(1, [0, 1, 2, 3, 4, 5])
    assert result.failed_requests() == {1, 4, 7}


@pytest.mark.parametrize("served", [False, True])
def test_defect_one_request_of_256_bad_instances_cost_hundreds_of_calls(served: bool) -> None:
    # 592 stage calls once the first stage had served (25 on a fresh model): the request's
    # own lone probe never counted as its evidence.
    drive = Drive(lambda stage, items: stage == 0, first_stage_served=served)
    result = drive.batch([256], 32)
    assert result.failed_requests() == {0}
    assert result.runs <= 3  # a first run, its probe failing alone, and the request is over
    shuffled = Drive(lambda stage, items: stage == 0, first_stage_served=served)
    result = shuffled.batch([256], 32, random.Random(1))
    assert result.runs <= 2 * 8  # any order: a first run and a probe per micro-batch


def test_defect_four_bad_requests_failing_alike_failed_the_other_28() -> None:
    # "Up to four" was a floor: four requests failing alone alike at inference (over-long
    # texts whose position lookup fails) were a verdict on the other 28 of their batch.
    bad = {3, 11, 20, 29}
    result = Drive(lambda stage, items: stage == 1 and bool(bad & set(items))).batch([1] * 32, 8)
    assert result.failed_requests() == bad


# -- the rule, generatively -------------------------------------------------------------


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[int], int, set[int], int, bool, bool]:
    """Request sizes (1-4 items), a micro-batch size (1-8), 0-8 bad requests (some of
    their items bad), the stage bad items fail in, whether stacking mixed sizes fails
    inference (a company failure), and the model's state (first stage served or not)."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=16))
    owners = owners_of(sizes)
    bad_requests = draw(st.sets(st.integers(0, len(sizes) - 1), max_size=8))
    bad: set[int] = set()
    for request in bad_requests:
        items = [item for item, owner in enumerate(owners) if owner == request]
        bad |= draw(st.sets(st.sampled_from(items), min_size=1))
    return (
        sizes,
        draw(st.integers(1, 8)),
        bad,
        draw(st.integers(0, 2)),
        draw(st.booleans()),
        draw(st.booleans()),
    )


@settings(max_examples=300)
@given(batches(), st.randoms(use_true_random=False))
@example(([1] * 7, 2, {6}, 1, True, False), random.Random(0))
@example(([2] * 9, 6, {2, 3, 8, 9, 14, 15}, 1, True, False), random.Random(0))
def test_a_request_fails_if_and_only_if_it_fails_alone(
    case: tuple[list[int], int, set[int], int, bool, bool], rng: random.Random
) -> None:
    sizes, micro_batch_size, bad, bad_stage, stacking, served = case

    def fails(stage: int, items: list[int]) -> bool:
        return (stage == bad_stage and bool(bad.intersection(items))) or (
            stacking and stage == 1 and mixed(items)
        )

    result = Drive(fails, stages=3, first_stage_served=served).batch(sizes, micro_batch_size, rng)
    owners = result.owners
    alone = {r for r in range(len(sizes)) if _fails_alone(sizes, r, micro_batch_size, fails)}
    assert alone == {owners[item] for item in bad}  # what "alone" means here, checked
    assert result.failed_requests() == alone
    for failure in result.failures():
        assert failure.isolated  # one batch: no stage is judged broken
    # Bounded cost: each item is run alone at most once more than bisection needs.
    assert result.runs <= math.ceil(len(owners) / micro_batch_size) + 3 * len(owners)


def _fails_alone(sizes: list[int], request: int, micro_batch_size: int, fails: Any) -> bool:
    """Whether ``request`` fails when its batch holds it alone (its items renumbered as
    they are in the big batch, so the same items are bad)."""
    first = sum(sizes[:request])
    items = list(range(first, first + sizes[request]))
    return any(fails(stage, [item]) for item in items for stage in range(3))


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=12),
    st.integers(1, 8),
    st.randoms(use_true_random=False),
)
def test_every_item_is_answered_and_siblings_of_a_failed_item_are_never_run(
    sizes: list[int], micro_batch_size: int, rng: random.Random
) -> None:
    owners = owners_of(sizes)
    bad = {item for item in range(len(owners)) if item % 3 == 0}
    result = Drive(lambda stage, items: stage == 1 and bool(bad & set(items))).batch(
        sizes, micro_batch_size, rng
    )
    for item in range(len(owners)):
        outcome = result.batch.outcome(item)
        assert outcome is not None
        if isinstance(outcome.error, SiblingFailedError):
            assert owners[item] in result.failed_requests()
            assert not any(item in items for stage, items in result.calls if len(items) == 1)


def test_one_bad_request_among_32_costs_at_most_11_runs() -> None:
    for bad in range(32):
        result = Drive(lambda stage, items, bad=bad: stage == 1 and bad in items).batch(
            [1] * 32, 32
        )
        assert result.failed_requests() == {bad}
        assert result.runs <= 11


@given(st.sets(st.integers(0, 31), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_k_bad_requests_among_32_cost_at_most_2k_log2_32_extra_runs(
    bad: set[int], rng: random.Random
) -> None:
    result = Drive(lambda stage, items: stage == 1 and bool(bad & set(items))).batch(
        [1] * 32, 32, rng
    )
    assert result.failed_requests() == bad
    assert result.runs <= 1 + 2 * len(bad) * 5


def test_one_bad_instance_is_named_and_its_request_alone_fails() -> None:
    result = Drive(lambda stage, items: stage == 0 and 6 in items).batch([1, 8, 1], 10)
    assert result.failed_requests() == {1}
    assert result.batch.failure(6) == RequestFailure("stage0", 0, True)
    assert result.batch.outcome(2).error is None  # type: ignore[union-attr]  (ran, passed)
    assert isinstance(result.batch.outcome(8).error, SiblingFailedError)  # type: ignore[union-attr]
    after = result.calls[result.calls.index((0, [6])) + 1 :]
    assert not any(8 in items for _, items in after)  # never run once 6 failed alone


def test_a_requests_own_company_failure_is_served() -> None:
    # One KServe request of four images of two sizes, the first stage having served: at
    # micro-batch 4 and at 2 its items run alone in the end, and it is served.
    for size in (4, 2):
        drive = Drive(lambda stage, items: stage == 0 and mixed(items), first_stage_served=True)
        result = drive.batch([4], size)
        assert result.ran(0, [0])  # the scenario: its first item ran alone as the probe
        assert result.failed_requests() == set()


def test_halves_never_split_a_request() -> None:
    batch = Batch(7, owners=[0, 0, 0, 1, 1, 3, 3])
    first, second = _MicroBatch(batch, 0, 0, list(range(7))).halves()
    assert (first.items, second.items) == ([0, 1, 2], [3, 4, 5, 6])
    batch = Batch(4, owners=[5, 5, 5, 5])
    first, second = _MicroBatch(batch, 0, 0, list(range(4))).halves()  # one request: middle
    assert (first.items, second.items) == ([0, 1], [2, 3])


@pytest.mark.parametrize(
    ("owners", "message"),
    [
        ([0, 1], "owners: got 2 request indices for 3 items"),
        ([0, 2, 1], r"owners\[2\]: got 1, expected an integer >= 2"),
        ([0, -1, 1], r"owners\[1\]: got -1"),
        ([0, True, 1], r"owners\[1\]: got True"),
    ],
)
def test_owners_are_checked_when_submitted(owners: list[Any], message: str) -> None:
    with (
        Pipeline({"only": lambda items: items}) as pipeline,
        pytest.raises(ValueError, match=message),
    ):
        pipeline.submit_batch([1, 2, 3], owners=owners)
