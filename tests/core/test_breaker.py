"""A broken model stays cheap through the stages' breakers, which span batches: the first
batch that shows it costs at most 2n runs, then about one call per micro-batch and a probe
per batch, until the first success closes it. Bad inputs never open one."""

from __future__ import annotations

import random
import threading

import pytest

from ts_microbatch.core._stall import StallGuard
from ts_microbatch.core.batch import Batch
from ts_microbatch.core.breaker import (
    BROKEN_AFTER_FAILURES,
    ON_TRIAL,
    OPEN,
    KnownGood,
    StageBreaker,
)
from ts_microbatch.core.errors import SiblingFailedError
from ts_microbatch.core.isolation import Isolator
from ts_microbatch.core.micro_batch import _MicroBatch, cut

from .isolation_driver import Boom, Drive


class Model:
    """A model whose inference (stage 1) is broken while ``broken`` is set, and which
    fails items in ``bad`` at inference on their own."""

    def __init__(self) -> None:
        self.broken = True
        self.bad: set[int] = set()

    def fails(self, stage: int, items: list[int]) -> bool:
        return stage == 1 and (self.broken or bool(self.bad.intersection(items)))


def test_a_broken_model_costs_2n_once_then_a_call_per_micro_batch_and_a_probe() -> None:
    model = Model()
    drive = Drive(model.fails)
    first = drive.batch([1] * 32, 4)
    assert first.failed_requests() == set(range(32))
    assert first.calls_in(1) <= 2 * 32
    assert all(f.isolated for f in first.failures())  # each failed alone: its own 500
    assert drive.isolator.broken() == ["stage1"]  # judged at the batch's end
    for _ in range(3):
        later = drive.batch([1] * 32, 4)
        assert later.failed_requests() == set(range(32))
        assert later.calls_in(1) == 8 + 1  # first runs, and the batch's probe
        # judged broken: none is its request's own, the probe run alone included
        assert not any(f.isolated for f in later.failures())
    model.broken = False  # it recovers: the next batch's probe passes and closes it
    recovered = drive.batch([1] * 32, 4, random.Random(3))
    assert recovered.failed_requests() == set()
    assert drive.isolator.broken() == []


def test_the_first_success_closes_the_breaker_and_isolates_the_held_parts() -> None:
    model = Model()
    drive = Drive(model.fails)
    drive.batch([1] * 8, 4)
    assert drive.isolator.broken() == ["stage1"]
    model.broken, model.bad = False, {1, 6}  # healthy, two bad requests: probes pass
    result = drive.batch([1] * 8, 4)
    assert result.ran(1, [0])  # the scenario: the batch's probe, alone, passed
    assert result.failed_requests() == {1, 6}
    assert drive.isolator.broken() == []


def test_a_batch_that_served_anything_never_opens_it() -> None:
    # 31 bad requests and one good, in any order: however many runs of one item fail
    # after the good one passed, the batch served something, so no stage is judged.
    model = Model()
    model.broken, model.bad = False, set(range(32)) - {17}
    drive = Drive(model.fails)
    for seed in range(5):
        result = drive.batch([1] * 32, 4, random.Random(seed))
        assert result.failed_requests() == set(range(32)) - {17}
        assert drive.isolator.broken() == []


def test_bad_requests_one_at_a_time_never_open_it() -> None:
    # Batches of one request (as at night): a breaker could not make them cheaper, and
    # the next batch that mixes good and bad requests must not meet an open one.
    model = Model()
    model.broken = False
    model.bad = {0}  # every batch: one request, bad at inference
    drive = Drive(model.fails)
    for _ in range(3 * BROKEN_AFTER_FAILURES):
        result = drive.batch([1], 1)
        assert result.failures()[0].isolated
    assert drive.isolator.broken() == []
    model.bad = {0, 1}
    drive.batch([1, 1], 2)  # two bad requests: five failed in a row, and two in a batch
    assert drive.isolator.broken() == ["stage1"]


@pytest.mark.parametrize("served", [False, True])
def test_bad_inputs_never_open_it(served: bool) -> None:
    drive = Drive(lambda stage, items: True, input_errors=True, first_stage_served=served)
    for _ in range(3):
        result = drive.batch([1] * 16, 4)
        assert result.failed_requests() == set(range(16))
        assert all(f.isolated for f in result.failures())
    assert drive.isolator.broken() == []


def test_bad_inputs_never_open_a_first_stage_that_has_served() -> None:
    # Each request failing there alone met a bad input of its own (400): the stage goes on
    # trial as any stage does, its known-good inputs pass, and it serves on.
    served = [False]
    drive = Drive(lambda stage, items: stage == 0 and served[0] and items not in witnesses)
    drive.batch([1] * 16, 4)
    witnesses = [[good.item] for good in drive.isolator._breakers[0].witnesses()]
    served[0] = True
    results = [drive.batch([1] * 8, 4) for _ in range(3)]  # all bad: items 0-7
    assert any(result.ran(0, witnesses[0]) for result in results)  # the scenario: on trial
    for result in results:
        assert result.failed_requests() == set(range(8))
        assert all(f.isolated for f in result.failures())  # each its own
    assert drive.isolator.broken() == []


def test_a_first_stage_whose_store_goes_down_fails_fast_and_serves_when_it_is_back() -> None:
    # Issue 49: a preprocess that calls a feature store that went down is judged as
    # inference is, on the inputs it served, instead of costing every batch its isolation.
    store = {"down": False}
    drive = Drive(lambda stage, items: stage == 0 and store["down"])
    drive.batch([1] * 16, 4)
    store["down"] = True
    first = drive.batch([1] * 16, 4)
    assert first.failed_requests() == set(range(16))
    assert all(f.isolated for f in first.failures())  # no verdict yet: each failed alone
    for _ in range(3):
        later = drive.batch([1] * 16, 4)
        assert drive.isolator.broken() == ["stage0"]
        assert later.failed_requests() == set(range(16))
        assert later.calls_in(0) <= 4 + 2  # a call per micro-batch, and its two witnesses
        assert not any(f.isolated for f in later.failures())  # the model's failure: 500
    store["down"] = False
    back = drive.batch([1] * 16, 4)
    assert back.failed_requests() == set()
    assert drive.isolator.broken() == []


def test_a_model_that_never_served_can_be_judged_broken_in_its_first_stage() -> None:
    drive = Drive(lambda stage, items: stage == 0)
    drive.batch([1] * 16, 4)
    assert drive.isolator.broken() == ["stage0"]
    result = drive.batch([1] * 16, 4)
    assert result.calls_in(0) == 4 + 1


def test_while_open_a_batch_whose_probe_is_good_serves_its_good_requests() -> None:
    # The documented exposure, pinned: open, a batch of good and bad requests; its probe
    # (the first item of its first failing micro-batch) decides for the parts held.
    model = Model()
    drive = Drive(model.fails)
    drive.batch([1] * 8, 4)
    model.broken, model.bad = False, {1, 2, 3, 5, 6, 7}
    result = drive.batch([1] * 8, 4)  # probe: item 0, good
    assert result.failed_requests() == {1, 2, 3, 5, 6, 7}


def test_while_open_a_batch_whose_probe_is_bad_fails_its_failing_parts_whole() -> None:
    model = Model()
    drive = Drive(model.fails)
    drive.batch([1] * 8, 4)
    model.broken, model.bad = False, {0, 1, 2, 3, 5, 6, 7}  # 4 is good, beside bad ones
    result = drive.batch([1] * 8, 4)
    assert result.ran(1, [0])  # the probe: bad, failed alike
    assert result.failed_requests() == set(range(8))  # 4 failed with its micro-batch


def test_the_verdict_needs_a_batch_end_with_nothing_served_and_two_requests() -> None:
    # Was test_a_failure_of_another_type_starts_its_own_streak: its first assertions (a
    # KeyError after four ValueErrors starts a streak of its own; open for one type only)
    # were the defect that kept a model failing with two alternating types from being
    # judged (tests/core/test_known_good.py). The rest hold as they were.
    breaker = StageBreaker()
    for _ in range(BROKEN_AFTER_FAILURES):
        breaker.failed_alone()
    assert breaker.batch_done(breaker.successes - 1, failed_alone=2) is None  # one served
    assert breaker.batch_done(breaker.successes, failed_alone=1) is None  # a request alone
    assert breaker.batch_done(breaker.successes, failed_alone=2) == OPEN  # no known-good
    assert breaker.open
    assert breaker.batch_done(breaker.successes, failed_alone=2) is None  # already open


def test_with_a_known_good_input_the_verdict_is_only_a_trial() -> None:
    breaker = StageBreaker()
    breaker.keep(KnownGood("served once", (0, 0), False, None, lambda n: n, None, None))
    for _ in range(BROKEN_AFTER_FAILURES):
        breaker.failed_alone()
    assert breaker.batch_done(breaker.successes, failed_alone=2) == ON_TRIAL
    assert breaker.suspect and not breaker.open  # not judged broken: the inputs may be bad
    assert breaker.probe_failed() and breaker.open  # the known-good input failed: judged
    assert not breaker.probe_failed()  # already open
    breaker.clear()
    assert not breaker.suspect and breaker.streak == 0


# -- a reviewer's repros (interleavings the threads make; driven here one step at a time) --


def _opened(drive: Drive) -> None:
    drive.batch([1] * 6, 2)  # six bad requests, nothing served: open
    assert drive.isolator.broken() == ["stage1"]


def test_defect_a_probe_failing_after_a_success_closed_the_breaker_failed_held_requests() -> None:
    # Open; batch [bad, good1 | good2, good3]: [bad, good1] fails, its probe (bad) goes
    # first and good1 waits; [good2, good3] passes inference (closing the breaker) before
    # the probe fails. good1 was failed whole, though nothing was judged broken any more.
    model = Model()
    drive = Drive(model.fails)
    _opened(drive)
    model.broken, model.bad = False, {0}
    isolator, outcomes = drive.isolator, drive.outcomes
    batch = Batch(4)
    isolator.track(batch)
    first, second = cut(batch, [0, 1, 2, 3], 2)
    outcomes.passed(first, 0)
    outcomes.stage_failed(1, first, Boom("bad in [0, 1]"))
    probe = drive.queue.pop(0)
    assert list(probe.items) == [0] and not drive.queue  # the probe; good1 is held
    for stage in (0, 1):
        outcomes.passed(second, stage)
    outcomes.finish(batch, second.indices, outputs=[2, 3])
    assert isolator.broken() == []  # the scenario: closed before the probe reports
    outcomes.passed(probe, 0)
    outcomes.stage_failed(1, probe, Boom("bad in [0]"))
    assert [list(mb.items) for mb in drive.queue] == [[1]]  # good1 runs alone now
    assert batch.outcome(1) is None


def test_defect_one_requests_instances_failing_alone_at_once_counted_as_two() -> None:
    # One KServe request of two bad instances, micro-batch 1, two threads: both failed
    # alone before the first answer, the batch counted two requests, and three such
    # requests sent one at a time opened the breaker.
    isolator = Drive(lambda stage, items: True).isolator
    for _ in range(3):
        batch = Batch(2, owners=[0, 0])
        isolator.track(batch)
        one, two = cut(batch, [0, 1], 1)
        for mb in (one, two):
            isolator.passed(mb, 0)
        outcomes = [isolator.failed(mb, 1, Boom("bad")) for mb in (one, two)]
        for outcome in outcomes:
            for fail in outcome.fail:
                batch.answer(fail.mb.indices, error=fail.error)
        assert isolator.broken() == []


def test_defect_a_bad_body_got_500_after_a_concurrent_batch_served_the_first_stage() -> None:
    # Asynchronous worker, no warm-up: X's batch was tracked before Y's passed the first
    # stage; X failing there alone was judged a bad input but answered as a fresh model's.
    isolator = Drive(lambda stage, items: True).isolator
    x, y = Batch(1), Batch(1)
    isolator.track(x)
    isolator.track(y)
    isolator.passed(cut(y, [0], 1)[0], 0)
    (mb,) = cut(x, [0], 1)
    isolator.failed(mb, 0, Boom("not an image"))
    assert x.first_stage_served  # what the adapter reads for 400


def test_a_micro_batch_makes_its_witness_once_and_every_stage_keeps_that_one() -> None:
    # The witness (its first item, with its request's context row) does not change on the
    # micro-batch's way: made when stage 0 passes it, the later stages keep the same
    # object; a half cut from it is a micro-batch of its own and makes its own.
    isolator = Isolator(["stage0", "stage1", "stage2"])
    batch = Batch(2)
    isolator.track(batch)
    (mb,) = cut(batch, ["a", "b"], 2)
    for stage in range(3):
        isolator.passed(mb, stage)
    kept = [breaker.served[0] for breaker in isolator._breakers]
    assert kept[0] is kept[1] is kept[2] is KnownGood.of(mb)
    assert kept[0].item == "a" and kept[0].source == (id(batch), 0)
    first, second = mb.halves()
    assert KnownGood.of(second) is not kept[0] and KnownGood.of(second).item == "b"


# -- a probe and its batch's timeout (driven one step at a time) ---------------------------


def _on_trial() -> Isolator:
    """Stage 1 served "served", then a batch of five bad requests failed there alone."""
    isolator = Isolator(["stage0", "stage1"])
    served = Batch(1)
    isolator.track(served)
    (mb,) = cut(served, ["served"], 1)
    isolator.passed(mb, 0)
    isolator.passed(mb, 1)
    served.answer(mb.indices, outputs=["served"])
    burst = Batch(BROKEN_AFTER_FAILURES)
    isolator.track(burst)
    for mb in cut(burst, [f"bad {n}" for n in range(BROKEN_AFTER_FAILURES)], 1):
        isolator.passed(mb, 0)
        isolator.failed(mb, 1, Boom("bad"))
    burst.answer(range(BROKEN_AFTER_FAILURES), error=Boom("bad"))
    assert isolator._breakers[1].state == ON_TRIAL
    return isolator


def _probe_for(isolator: Isolator, batch: Batch) -> _MicroBatch:
    isolator.track(batch)
    (mb,) = cut(batch, [f"item {n}" for n in range(len(batch))], len(batch))
    isolator.passed(mb, 0)
    outcome = isolator.failed(mb, 1, Boom("bad in it"))
    (probe,) = outcome.first
    assert list(probe.items) == ["served"]  # the known-good input, held parts waiting
    return probe


def test_defect_a_running_probe_was_taken_for_stuck_when_its_batch_was_answered() -> None:
    # A KServe request's failed instance skips its siblings: every held part answered while
    # the known-good probe was still in its call. The probe's batch was expired with it,
    # and StallGuard abandoned the healthy probe's thread and started another.
    isolator = _on_trial()
    batch = Batch(4, owners=[0, 0, 0, 0])
    probe = _probe_for(isolator, batch)
    started: list[str] = []
    guard = StallGuard(started.append)
    thread, spare = threading.current_thread(), threading.Thread(target=lambda: None)
    guard.begin(thread, "stage1", probe)  # the probe is in its call
    batch.answer_items(range(4), error=SiblingFailedError("a sibling failed"))
    assert batch.outcome(0) is not None and not batch.timed_out  # the scenario
    guard.check({"stage1": [thread, spare]}, {"stage1": 2})
    assert started == []  # nothing taken for stuck
    assert not probe.batch.timed_out and not probe.answered()  # it finishes
    isolator.passed(probe, 1)  # and its verdict goes nowhere
    assert isolator.broken() == []


def test_defect_a_stuck_probe_was_run_again_by_every_later_batch() -> None:
    # The known-good probe got stuck and its batch timed out: no verdict was ever given,
    # so each later failing batch ran the same item again, each losing a thread to it.
    isolator = _on_trial()
    batch = Batch(2, owners=[0, 0])
    probe = _probe_for(isolator, batch)
    assert not batch.wait(0)  # times out, the probe still in its call
    assert probe.batch.timed_out and probe.answered()  # stuck with it: may be abandoned
    later = Batch(2, owners=[0, 0])
    isolator.track(later)
    (mb,) = cut(later, ["x", "y"], 2)
    isolator.passed(mb, 0)
    outcome = isolator.failed(mb, 1, Boom("bad in it"))
    assert all(list(p.items) != ["served"] for p in outcome.first)  # not run again


def test_hang_a_probe_for_a_batch_timed_out_already_forgets_its_input_under_the_lock() -> None:
    # The batch times out while its failing micro-batch is in its call; the known-good
    # probe started for it then runs its expiry at once, on the thread that holds the
    # isolator's lock: a lock that is not re-entrant would hang here.
    isolator = _on_trial()
    batch = Batch(2, owners=[0, 0])
    isolator.track(batch)
    (mb,) = cut(batch, ["x", "y"], 2)
    isolator.passed(mb, 0)
    assert not batch.wait(0) and batch.timed_out  # the scenario: timed out before it failed
    (probe,) = isolator.failed(mb, 1, Boom("bad in it")).first
    assert list(probe.items) == ["served"]
    assert probe.batch.timed_out  # expired with its batch at once
    assert isolator._breakers[1].witnesses() == ()  # and its input is known-good no longer
