"""The isolator as a pure state machine: driven as the pipeline drives it, without threads.

Items belong to requests (``owners``): a KServe request of n instances is n consecutive
items. ``Run`` cuts a batch into micro-batches (``cut``), runs one stage that fails any micro-batch
holding a bad item, and carries out every ``Outcome`` as ``Pipeline._apply`` does, taking
the queued micro-batches in an order hypothesis chooses (the pipeline's threads interleave).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ts_microbatch import Pipeline
from ts_microbatch.core.batch import Batch, RequestFailure
from ts_microbatch.core.isolation import Isolator, Outcome, fewest_requests
from ts_microbatch.core.micro_batch import _MicroBatch, cut


class Boom(Exception):
    """The stage's error: no 4xx meaning, so verdicts may be systemic."""


class Run:
    """One batch through one failing stage, the isolator deciding."""

    def __init__(
        self,
        sizes: list[int],
        micro_batch_size: int,
        bad_items: set[int],
        *,
        mixed_fails: bool = False,
        first_stage_served: bool = False,
    ) -> None:
        self.owners = [request for request, n in enumerate(sizes) for _ in range(n)]
        self.bad_items = bad_items
        # Items of both parities in one call fail it (as stacking images of two sizes does)
        self.mixed_fails = mixed_fails
        self.batch = Batch(len(self.owners), owners=self.owners)
        self.isolator = Isolator()
        self.isolator.first_stage_served = first_stage_served
        self.queue = cut(self.batch, list(range(len(self.owners))), micro_batch_size)
        self.isolator.track(self.batch, self.queue)
        self.first_runs = len(self.queue)
        self.calls: list[list[int]] = []
        self.answers: dict[int, int] = {}  # item -> how many times it was answered

    def run(self, rng: random.Random | None = None) -> Run:
        """Runs until nothing is queued, in ``rng``'s order (queue order when None)."""
        while self.queue:
            mb = self.queue.pop(rng.randrange(len(self.queue)) if rng else 0)
            if mb.answered():
                self.apply(self.isolator.dropped(mb))
                continue
            self.calls.append(list(mb.items))
            mixed = self.mixed_fails and len({item % 2 for item in mb.items}) > 1
            if self.bad_items.intersection(mb.items) or mixed:
                self.apply(self.isolator.failed(mb, 0, Boom(f"bad items in {mb.items}")))
            else:
                self.apply(self.isolator.passed(mb, 0))
                self.finish(mb.indices, None, None)
        return self

    def apply(self, outcome: Outcome) -> None:
        for fail in outcome.fail:
            failure = RequestFailure("stage", fail.stage, fail.isolated)
            self.finish(fail.mb.indices, fail.error, failure)
        if outcome.fail_batch is not None:
            failure = RequestFailure("stage", 0, False)
            self.finish(range(len(self.batch)), Boom("systemic"), failure)
        self.queue[:0] = outcome.first  # a lone probe runs next, as the pipeline queues it
        self.queue.extend(outcome.rerun)

    def finish(
        self, indices: range, error: BaseException | None, failure: RequestFailure | None
    ) -> None:
        for index in indices:
            if self.batch.outcome(index) is None:
                self.answers[index] = self.answers.get(index, 0) + 1
        if error is None:
            self.batch.answer(indices, outputs=list(indices))
        else:
            assert failure is not None
            self.batch.answer(indices, error=error, failure=failure)

    def failed(self, item: int) -> bool:
        outcome = self.batch.outcome(item)
        return outcome is not None and outcome.error is not None

    def bad_requests(self) -> set[int]:
        return {self.owners[item] for item in self.bad_items}


@st.composite
def batches(draw: st.DrawFn, max_bad_requests: int | None) -> tuple[list[int], int, set[int]]:
    """Request sizes (1 to 6 items each), a micro-batch size, and bad items."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=12))
    owners = [request for request, n in enumerate(sizes) for _ in range(n)]
    micro_batch_size = draw(st.integers(1, 9))
    bad_requests = draw(
        st.sets(st.integers(0, len(sizes) - 1), max_size=max_bad_requests or len(sizes))
    )
    bad_items = set()
    for request in bad_requests:
        items = [item for item, owner in enumerate(owners) if owner == request]
        bad_items |= draw(st.sets(st.sampled_from(items), min_size=1))
    return sizes, micro_batch_size, bad_items


@given(batches(max_bad_requests=None), st.randoms(use_true_random=False))
@example(([3], 8, {0, 1, 2}), random.Random(0))  # one request's instances failing alike
def test_every_item_answered_once_and_bad_items_always_fail(
    case: tuple[list[int], int, set[int]], rng: random.Random
) -> None:
    sizes, micro_batch_size, bad_items = case
    run = Run(sizes, micro_batch_size, bad_items).run(rng)
    assert run.answers == dict.fromkeys(range(len(run.owners)), 1)
    for item in range(len(run.owners)):
        failure = run.batch.failure(item)
        if item in bad_items:
            assert run.failed(item)
        if failure is not None and failure.isolated:
            # Isolated means its request's own failure: that request had a bad item.
            assert run.owners[item] in run.bad_requests()


@given(batches(max_bad_requests=2), st.randoms(use_true_random=False))
@example(([1, 3, 1], 8, {1, 2, 3}), random.Random(0))  # the probe took one request for three
@example(([1, 6, 1], 2, set(range(1, 7))), random.Random(0))  # the batch rule did
def test_two_bad_requests_are_isolated_whatever_their_instances(
    case: tuple[list[int], int, set[int]], rng: random.Random
) -> None:
    # Every other request is served, and each bad one fails as its own failure.
    sizes, micro_batch_size, bad_items = case
    run = Run(sizes, micro_batch_size, bad_items).run(rng)
    bad_requests = run.bad_requests()
    for item, owner in enumerate(run.owners):
        failure = run.batch.failure(item)
        if owner not in bad_requests:
            assert not run.failed(item), (item, failure)
        elif item in bad_items:
            assert failure is not None and failure.isolated


@pytest.mark.parametrize(("instances", "micro_batch_size"), [(3, 8), (64, 4), (64, 32), (5, 2)])
def test_one_requests_instances_failing_alike_cost_three_calls_a_micro_batch(
    instances: int, micro_batch_size: int
) -> None:
    # A broken stage and a request of many instances alone: no verdict is possible (one
    # request). Its halves are bisected down to items until one item fails alone (its
    # instances might fail only in each other's company); from then on, splitting within
    # it stops as soon as both halves fail.
    run = Run([instances], micro_batch_size, set(range(instances))).run()
    assert all(run.failed(item) for item in range(instances))
    assert all(run.batch.failure(item).isolated for item in range(instances))  # type: ignore[union-attr]
    first = min(micro_batch_size, instances)
    assert len(run.calls) <= 3 * run.first_runs + 2 * first
    shuffled = Run([instances], micro_batch_size, set(range(instances))).run(random.Random(0))
    assert len(shuffled.calls) <= (2 * first - 1) * shuffled.first_runs


def test_one_bad_instance_is_named() -> None:
    # Within a request, one failing half is split on until the instance is found, so the
    # answer can name it; the request's other instances pass.
    run = Run([1, 8, 1], 10, {6}).run(random.Random(0))
    assert [item for item in range(10) if run.failed(item)] == [6]
    assert run.batch.failure(6) == RequestFailure("stage", 0, True)


def test_systemic_verdicts_count_requests() -> None:
    # Four micro-batches failing their first run alike: with eight requests to blame, a
    # broken stage (the batch fails at once, 4 calls); with one request spanning all four,
    # that request's failure (bisected within it, 3 calls a micro-batch, no verdict).
    # (The verdict waits for the requests of the last failed part run alone, ahead of the
    # queue: a call more for each; those fail as their own, the others by the verdict.)
    eight = Run([1] * 8, 2, set(range(8))).run()
    assert eight.calls[4:] == [[6], [7]]  # the lone probes, run next
    assert len(eight.calls) == 6
    assert [f.isolated for f in _failures(eight)] == [False] * 6 + [True] * 2
    one = Run([8], 2, set(range(8))).run()
    assert len(one.calls) <= 13 and all(f.isolated for f in _failures(one))
    assert len(_failures(eight)) == len(_failures(one)) == 8


def _failures(run: Run) -> list[RequestFailure]:
    return [f for item in range(len(run.owners)) if (f := run.batch.failure(item)) is not None]


@pytest.mark.parametrize(
    ("owners", "spans", "expected"),
    [
        (None, [range(0, 2), range(2, 4)], 2),
        ([0, 0, 0, 0], [range(0, 1), range(1, 2), range(2, 3), range(3, 4)], 1),
        ([0, 1, 1, 2, 3, 3], [range(0, 2), range(2, 4), range(4, 6)], 2),  # 1 and 3
        ([0, 1, 2, 3], [range(0, 1), range(1, 2), range(2, 3), range(3, 4)], 4),
        ([0, 0, 2, 2, 2, 5], [range(0, 3), range(3, 6)], 1),  # request 2 meets both
    ],
)
def test_fewest_requests_to_blame(
    owners: list[int] | None, spans: list[range], expected: int
) -> None:
    assert fewest_requests(owners, spans) == expected


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


def test_defect_a_failure_only_in_company_is_judged_systemic() -> None:
    # Every micro-batch mixes sizes and fails its first run alike (VisionHandler stacking
    # 640x480 with 480x640), each request alone passes: the lone probe passes, no verdict,
    # and every request is answered as alone.
    run = Run([1] * 8, 2, set(), mixed_fails=True).run()
    assert run.calls[:5] == [[0, 1], [2, 3], [4, 5], [6, 7], [6]]  # the scenario: the probe
    assert not any(run.failed(item) for item in range(8))
    assert run.answers == dict.fromkeys(range(8), 1)


@given(batches(max_bad_requests=None), st.randoms(use_true_random=False))
def test_in_a_first_stage_that_has_served_each_request_gets_what_it_gets_alone(
    case: tuple[list[int], int, set[int]], rng: random.Random
) -> None:
    # Once the first stage has served, no verdict is given there: a request fails if and
    # only if it has a bad item, as alone, and then as its own failure (400 at the boundary).
    sizes, micro_batch_size, bad_items = case
    run = Run(sizes, micro_batch_size, bad_items, first_stage_served=True).run(rng)
    bad_requests = run.bad_requests()
    for item, owner in enumerate(run.owners):
        assert run.failed(item) == (item in bad_items) or owner in bad_requests
        failure = run.batch.failure(item)
        if failure is not None:
            assert failure.isolated


@given(batches(max_bad_requests=None), st.randoms(use_true_random=False))
def test_a_company_failure_ends_with_every_request_answered_as_alone(
    case: tuple[list[int], int, set[int]], rng: random.Random
) -> None:
    sizes, micro_batch_size, _ = case
    one_item_requests = [1] * len(sizes)  # parity is per item: one item per request
    run = Run(one_item_requests, micro_batch_size, set(), mixed_fails=True).run(rng)
    assert not any(run.failed(item) for item in range(len(run.owners)))
