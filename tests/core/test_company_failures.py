"""Failures that happen only in company are never judged systemic, and a request's status
does not depend on its micro-batch's size or company (a reviewer's repros, kept).

``Drive`` runs a batch through two stages as a pipeline with one thread per stage would,
carrying out the isolator's outcomes as ``Outcomes.apply`` does (a lone probe at the front
of the queue, re-runs at its back). Items are their indices; ``mixed(items)`` stands for
"images of two sizes were stacked" (an item's parity is its size).
"""

from __future__ import annotations

from collections.abc import Callable

from ts_microbatch.core.batch import Batch, RequestFailure
from ts_microbatch.core.isolation import Isolator, Outcome
from ts_microbatch.core.micro_batch import cut


class Boom(Exception):
    """A stage error with no 4xx meaning (a verdict may be systemic)."""


def mixed(items: list[int]) -> bool:
    return len({item % 2 for item in items}) > 1


class Drive:
    def __init__(
        self,
        sizes: list[int],
        micro_batch_size: int,
        fails: Callable[[int, list[int]], bool],
        *,
        first_stage_served: bool = False,
    ) -> None:
        self.owners = [request for request, n in enumerate(sizes) for _ in range(n)]
        self.fails = fails
        self.batch = Batch(len(self.owners), owners=self.owners)
        self.isolator = Isolator()
        self.isolator.first_stage_served = first_stage_served
        self.queue = cut(self.batch, list(range(len(self.owners))), micro_batch_size)
        self.isolator.track(self.batch, self.queue)
        self.calls: list[tuple[int, list[int]]] = []

    def run(self) -> Drive:
        while self.queue:
            mb = self.queue.pop(0)
            for stage in (0, 1):
                if mb.answered():
                    self.apply(self.isolator.dropped(mb))
                    break
                self.calls.append((stage, list(mb.items)))
                if self.fails(stage, list(mb.items)):
                    error = Boom(f"stage {stage}: {mb.items}")
                    self.apply(self.isolator.failed(mb, stage, error))
                    break
                self.apply(self.isolator.passed(mb, stage))
                if stage == 1:
                    self.batch.answer(mb.indices, outputs=list(mb.items))
        return self

    def apply(self, outcome: Outcome) -> None:
        for fail in outcome.fail:
            failure = RequestFailure(f"stage{fail.stage}", fail.stage, fail.isolated)
            self.batch.answer(fail.mb.indices, error=fail.error, failure=failure)
        if outcome.fail_batch is not None:
            whole = outcome.fail_batch
            failure = RequestFailure(f"stage{whole.stage}", whole.stage, False)
            self.batch.answer(range(len(self.batch.order)), error=whole.error, failure=failure)
        self.queue[:0] = outcome.first
        self.queue.extend(outcome.rerun)

    def failed_requests(self) -> set[int]:
        out = set()
        for item, owner in enumerate(self.owners):
            outcome = self.batch.outcome(item)
            assert outcome is not None, f"item {item} never answered"
            if outcome.error is not None:
                out.add(owner)
        return out


def stacking_in_inference(stage: int, items: list[int]) -> bool:
    return stage == 1 and mixed(items)


def stacking_in_preprocess(stage: int, items: list[int]) -> bool:
    return stage == 0 and mixed(items)


def test_defect_a_kserve_requests_own_instances_counted_as_failing_alone() -> None:
    # Request 0: a KServe request of two images of different sizes. Its micro-batch [0, 1]
    # counted as "a request failing alone", and the batch rule failed all seven requests.
    assert Drive([2], 2, stacking_in_inference).run().failed_requests() == set()
    run = Drive([2, 1, 1, 1, 1, 1, 1], 2, stacking_in_inference).run()
    assert (1, [0, 1]) in run.calls  # the scenario: the request's own company failed
    assert run.failed_requests() == set()


def test_defect_a_lone_probe_of_several_instances_confirmed_a_company_failure() -> None:
    sizes = [1] * 9 + [2, 1]  # request 9 is items 9 and 10
    run = Drive(sizes, 3, stacking_in_inference).run()
    assert (1, [9]) in run.calls  # a probe is one item now, never a request's company
    assert run.failed_requests() == set()


def test_defect_a_requests_status_depended_on_the_micro_batch_size() -> None:
    # One KServe request of 4 images of two sizes, the first stage having served: at 4 its
    # halves [a, b] and [c, d] both failed, and it got 400 "bad input"; at 2, 200.
    at_4 = Drive([4], 4, stacking_in_preprocess, first_stage_served=True).run()
    at_2 = Drive([4], 2, stacking_in_preprocess, first_stage_served=True).run()
    assert (0, [0, 1]) in at_4.calls  # the scenario: both halves failed in company
    assert at_4.failed_requests() == at_2.failed_requests() == set()
    beside = Drive([1, 4], 4, stacking_in_preprocess, first_stage_served=True).run()
    assert beside.failed_requests() == set()


def test_defect_one_bad_request_as_the_probe_failed_seven_good_ones() -> None:
    def fails(stage: int, items: list[int]) -> bool:
        return stage == 1 and (mixed(items) or 6 in items)  # request 6 is bad on its own

    run = Drive([1] * 8, 2, fails).run()
    assert (1, [6]) in run.calls  # the scenario: the bad request ran alone as a probe
    assert run.failed_requests() == {6}


def test_a_broken_stage_still_fails_the_batch_after_a_few_lone_runs() -> None:
    run = Drive([1] * 32, 4, lambda stage, items: stage == 1).run()
    assert run.failed_requests() == set(range(32))
    assert len([call for call in run.calls if call[0] == 1]) <= 8 + 4  # first runs + probes
