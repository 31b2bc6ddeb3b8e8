"""Which requests of a failed micro-batch are to blame: one rule, and a stage's record.

**The rule: an item fails only when it fails alone.** A micro-batch that fails in a stage
is never failed for it; it is taken apart until each item that fails has failed alone:

* a micro-batch of several requests is split in halves at a request boundary (a KServe
  request's instances stay together), both re-run from the first stage: one bad request
  among n costs about 2*log2(n) extra runs;
* a micro-batch of one request's items runs its first item alone, ahead of the queue (the
  *probe*), while the rest waits: the probe failing (in any stage) fails the request; the
  probe getting through the failed stage sends the rest on, in halves;
* a run of one item that fails is its request's own failure. Which of its other items
  still run is ``ts_microbatch.core.outcomes``'s rule (the lowest-index failing item names
  the request's failure: those above it never run), so a request of n bad instances costs
  at most two runs a micro-batch of its instances.

So what a request gets never depends on what shares its batch, whatever the number of bad
requests: items failing only in company (a preprocess stacking images of two sizes, a
KServe request's instances among themselves) end up run alone and pass. No evidence is
counted inside a batch, so there is no threshold for bad requests to reach.

**A broken model stays cheap through state across batches** (``ts_microbatch.core.
breaker``): runs of one item failing in a stage, with nothing served there, over a batch,
put that stage on trial; then a micro-batch failing there waits for its batch's probe, the
stage's known-good inputs (warm-up's sample, or two it served) run alone in turn: failing
there too, they judge the stage broken and what waited fails whole (500); one getting
through closes the breaker and what waited is isolated. The first success closes it.
Errors that mean bad input never count: a ``RequestError``, a 4xx ``PredictionException``
or decoder error (the adapter's ``is_input_error``), and any failure in a first stage that
has served a request since load (``first_stage_served``: a request failing there alone has
met a bad input of its own,
which the adapter answers 400).

A ``BaseException`` that is not an ``Exception`` (KeyboardInterrupt, SystemExit) is a request
to stop: its micro-batch fails whole, as no request's own failure. docs/failures.md gives
the rules with their costs.

Every decision is returned as an ``Outcome`` for the pipeline to carry out; this module
starts no threads and resolves no futures, so the rules can be driven and tested without a
pipeline: ``track`` a batch, then report ``passed``, ``failed`` and ``dropped`` micro-batches
and carry out the outcomes.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ._probes import BatchRecord, BrokenProbe, OwnProbe, Verdict
from .batch import Batch
from .breaker import ON_TRIAL, OPEN, KnownGood, StageBreaker
from .errors import RequestError
from .micro_batch import _MicroBatch

__all__ = ["Fail", "Isolator", "Outcome", "declared_per_request"]

logger = logging.getLogger(__name__)


class Fail(NamedTuple):
    """Fail ``mb``'s items (and so their requests) with the ``error`` raised in ``stage``;
    ``isolated`` when they failed alone, as their request's own failure."""

    mb: _MicroBatch
    error: BaseException
    stage: int
    isolated: bool


class Outcome(NamedTuple):
    rerun: list[_MicroBatch]  # to queue again at the first stage
    fail: list[Fail]
    first: tuple[_MicroBatch, ...] = ()  # to queue at the front of the first stage: probes


_NOTHING = Outcome([], [])


def declared_per_request(error: BaseException) -> bool:
    """The core's own notion of "this request's input is bad": a ``RequestError``. An
    adapter that knows more (TorchServe's 4xx ``PredictionException``, decoder errors) gives
    the ``Isolator`` its own test."""
    return isinstance(error, RequestError)


class Isolator:
    """Decides what to do with failed micro-batches; thread-safe.

    Args:
        stages: the stages' names, in order.
        enabled: isolate failures; when False a failure fails its micro-batch.
        is_input_error: whether an error means its request's input is bad (never counts
            towards a broken stage).
    """

    def __init__(
        self,
        stages: Sequence[str],
        enabled: bool = True,
        is_input_error: Callable[[BaseException], bool] = declared_per_request,
    ) -> None:
        self.enabled = enabled
        self._names = list(stages)
        self._is_input_error = is_input_error
        self._lock = threading.Lock()
        self._breakers = [StageBreaker() for _ in self._names]
        # A batch's record lives as long as the batch; one never tracked gets one on use.
        self._records: weakref.WeakKeyDictionary[Batch, BatchRecord] = weakref.WeakKeyDictionary()
        # The first stage has served a request since the pipeline started (only ever set).
        self.first_stage_served = False

    def track(self, batch: Batch) -> None:
        """Starts ``batch``'s record; at its last answer, the breakers judge it."""
        if self.first_stage_served:
            batch.first_stage_served = True
        with self._lock:
            self._records[batch] = BatchRecord(self._breakers)
        batch.when_answered(self._batch_done)

    def broken(self) -> list[str]:
        """The stages judged broken now (their breaker open)."""
        return [name for name, b in zip(self._names, self._breakers) if b.open]

    def passed(self, mb: _MicroBatch, stage: int) -> Outcome:
        """``mb`` got through ``stage``."""
        breaker = self._breakers[stage]
        # No lock, and in this order (ts_microbatch.core.breaker says why): a pass that
        # skips the lock below has left a known-good input first.
        breaker.keep(KnownGood.of(mb))
        breaker.successes += 1
        if stage == 0:
            # Only ever set, never cleared: no lock.
            mb.batch.first_stage_served = self.first_stage_served = True
        # The common case (every stage call of a healthy model) takes no lock: a probe's
        # marker is set before it is queued and read only by the thread running it.
        if not breaker.streak and mb.split is None:
            return _NOTHING
        with self._lock:
            if breaker.open:
                logger.warning("stage %s served again: no longer judged broken", self._names[stage])
            breaker.clear()
            probe = mb.split
            if probe is None or probe.stage != stage:
                return _NOTHING
            mb.split = None
            if isinstance(probe, BrokenProbe) and probe.good is not None:
                _answer_nowhere(mb)  # its verdict is in: the later stages drop it
                for failed in probe.failed:  # failed alone where another passed
                    breaker.forget(failed)
                logger.info(
                    "stage %s: its known-good input passed alone, so the failures were the "
                    "inputs'; the stage serves on",
                    self._names[stage],
                )
            return self._release(probe)

    def dropped(self, mb: _MicroBatch) -> Outcome:
        """``mb`` was dropped unrun (its items were answered already, or failed outside a
        stage): what waited for it, if it was a probe, goes on."""
        if mb.split is None:
            return _NOTHING
        with self._lock:
            probe, mb.split = mb.split, None
            return self._release(probe)

    def failed(self, mb: _MicroBatch, stage: int, error: BaseException) -> Outcome:
        """``mb`` failed in ``stage`` with ``error``."""
        with self._lock:
            probe, mb.split = mb.split, None
            if isinstance(probe, BrokenProbe) and probe.good is not None:
                return self._known_good_failed(mb, probe, probe.good, stage, error)
            if not isinstance(error, Exception):
                # KeyboardInterrupt, SystemExit, GeneratorExit: a request to stop, which says
                # nothing about any input. Code that asked to stop is not re-run.
                stopped = Outcome([], [Fail(mb, error, stage, isolated=False)])
                return _merge(stopped, self._release(probe))
            if not self.enabled:
                return Outcome([], [Fail(mb, error, stage, isolated=mb.one_request())])
            if stage == 0 and self.first_stage_served:
                # Its answer reads the batch's flag: as the isolator judged it (a batch
                # tracked before another's first success would otherwise say 500).
                mb.batch.first_stage_served = True
            may_be_broken = self._may_be_broken(stage, error)
            if len(mb) == 1:
                requests = self._record(mb.batch).failed_alone[stage]
                if may_be_broken and mb.owners[0] not in requests:
                    # A request counts once: its instances failing alone at once (threads)
                    # are one bad request, never two towards a broken stage.
                    requests.add(mb.owners[0])
                    self._breakers[stage].failed_alone()
                own = Outcome([], [Fail(mb, error, stage, isolated=True)])
                return _merge(own, self._probe_failed(probe, stage, error))
            if may_be_broken and self._breakers[stage].suspect:
                return self._while_broken(mb, stage, error)
            return self._isolate(mb, stage)

    def _may_be_broken(self, stage: int, error: BaseException) -> bool:
        """Whether ``error`` in ``stage`` may be the model's: never a bad input's, nor a
        failure in a first stage that has served (its request's own input: 400)."""
        return not self._is_input_error(error) and not (stage == 0 and self.first_stage_served)

    def _isolate(self, mb: _MicroBatch, stage: int) -> Outcome:
        """The rule for a micro-batch that failed in ``stage``: halves at a request boundary,
        or, within one request, its first item alone ahead of the rest."""
        if len(mb) == 1:  # held for a probe, never run alone: it runs alone now
            return Outcome([mb], [])
        if not mb.one_request():
            return Outcome(list(mb.halves()), [])
        alone, rest = mb.first_alone()
        alone.split = OwnProbe(stage, rest)
        return Outcome([], [], first=(alone,))

    def _while_broken(self, mb: _MicroBatch, stage: int, error: BaseException) -> Outcome:
        """``stage`` is on trial or open: the batch's probe decides, the stage's known-good
        inputs (the first item on trial when it has none: ts_microbatch.core.breaker)."""
        record = self._record(mb.batch)
        verdict = record.verdicts.get(stage)
        if verdict is Verdict.BROKEN:
            return Outcome([], [Fail(mb, error, stage, isolated=False)])
        if verdict is Verdict.ISOLATE:
            return self._isolate(mb, stage)
        if verdict is Verdict.PENDING:
            record.held[stage].append((mb, error))
            return _NOTHING
        record.verdicts[stage] = Verdict.PENDING
        witnesses = self._breakers[stage].witnesses()
        probe = BrokenProbe(record, stage, mb.batch, witnesses)
        if witnesses:
            record.held[stage] = [(mb, error)]
            return self._run_witness(probe, witnesses[0])
        alone, rest = mb.first_alone()
        record.held[stage] = [(rest, error)] if rest is not None else []
        alone.split = probe
        return Outcome([], [], first=(alone,))

    def _run_witness(self, probe: BrokenProbe, good: KnownGood) -> Outcome:
        """``good`` runs alone ahead of the queue as ``probe``, for its batch."""
        probe.good = good
        alone = good.micro_batch()
        alone.split = probe
        probe.until.when_answered(self._probe_expiry(alone, probe.stage, good))
        return Outcome([], [], first=(alone,))

    def _probe_expiry(
        self, probe: _MicroBatch, stage: int, good: KnownGood
    ) -> Callable[[Batch], None]:
        """What the batch a known-good probe runs for does at its last answer. Only when it
        timed out does the probe expire with it, so a call stuck on it is abandoned with
        the batch's timeout; answered for any other reason (its held parts failed whole,
        or skipped as a failed instance's siblings), the probe finishes and its answer goes
        nowhere: expiring it then made ``StallGuard`` take a healthy call for a stuck one.
        A probe that timed out gives no verdict, so its input is known-good no longer: the
        next batch does not run it again, nor lose another thread to it."""

        def expire(batch: Batch) -> None:
            if batch.timed_out and not probe.batch.expire(None):
                # No lock: this may run at once, under it (a batch answered already).
                self._breakers[stage].forget(good)

        return expire

    def _known_good_failed(
        self,
        mb: _MicroBatch,
        probe: BrokenProbe,
        good: KnownGood,
        stage: int,
        error: BaseException,
    ) -> Outcome:
        """The known-good probe ``mb`` failed in ``stage``: no request's failure. The stage
        is judged broken only when warm-up's sample fails, or two inputs it served, of two
        requests: a replayed request may fail alone for a reason of its own (the row it
        looks up deleted since), and one such must not fail the good requests held for it.
        A witness that failed with no verdict is known-good no longer."""
        _answer_nowhere(mb)
        if not isinstance(error, Exception):  # a request to stop: no verdict on the model
            return self._release(probe)
        if self._may_be_broken(stage, error):
            self._breakers[stage].failed_alone()
        breaker = self._breakers[probe.stage]
        probe.failed.append(good)
        if stage == probe.stage and breaker.suspect and self._may_be_broken(stage, error):
            if probe.rest:  # the next witness runs, for the same batch
                return self._run_witness(probe, probe.rest.pop(0))
            if good.warm or len(probe.failed) >= 2:
                return self._probe_failed(probe, stage, error)
        for failed in probe.failed:
            breaker.forget(failed)
        return self._release(probe)

    def _probe_failed(self, probe: object, stage: int, error: BaseException) -> Outcome:
        """A probe failed alone (its own failure is given by the caller): what waited for
        it. An own probe's rest needs nothing: all above the probe in its request, it is
        never run (``Outcomes.skip_items_above``)."""
        if not isinstance(probe, BrokenProbe):
            return _NOTHING
        breaker = self._breakers[stage]
        if stage == probe.stage and breaker.suspect and self._may_be_broken(stage, error):
            # Still suspect, and the model's: the held parts fail. A success since (another
            # micro-batch of the batch got through) closed it: they are isolated instead.
            if breaker.probe_failed():
                logger.error(
                    "stage %s judged broken: its known-good inputs failed alone (%s) after "
                    "%d runs of one item failed with nothing served in between; its "
                    "micro-batches that fail now fail whole after one probe per batch, until "
                    "it serves again",
                    self._names[stage],
                    type(error).__name__,
                    breaker.streak,
                )
            held = probe.record.settle(probe.stage, Verdict.BROKEN)
            return Outcome([], [Fail(mb, e, probe.stage, isolated=False) for mb, e in held])
        return self._release(probe)

    def _release(self, probe: object) -> Outcome:
        """A probe got through its stage, or was dropped, or failed unlike the stage: what
        waited for it is isolated by the rule."""
        if isinstance(probe, OwnProbe):
            rest = probe.rest
            if rest is None:
                return _NOTHING
            return Outcome([rest] if len(rest) == 1 else list(rest.halves()), [])
        if isinstance(probe, BrokenProbe):
            outcome = _NOTHING
            for mb, _ in probe.record.settle(probe.stage, Verdict.ISOLATE):
                outcome = _merge(outcome, self._isolate(mb, probe.stage))
            return outcome
        return _NOTHING

    def _record(self, batch: Batch) -> BatchRecord:
        record = self._records.get(batch)
        if record is None:
            record = self._records[batch] = BatchRecord(self._breakers)
        return record

    def _batch_done(self, batch: Batch) -> None:
        with self._lock:
            record = self._records.pop(batch, None)
            if record is None:
                return
            for index, breaker in enumerate(self._breakers):
                failed_alone = len(record.failed_alone[index])
                state = breaker.batch_done(record.successes[index], failed_alone)
                if state == ON_TRIAL:
                    logger.warning(
                        "stage %s on trial: %d runs of one item failed and it served nothing "
                        "in between; its next failing micro-batch waits for its known-good "
                        "input run alone",
                        self._names[index],
                        breaker.streak,
                    )
                elif state == OPEN:
                    logger.error(
                        "stage %s judged broken: %d runs of one item failed and it has served "
                        "nothing since the pipeline started (no known-good input to test it "
                        "with); its micro-batches that fail now fail whole after one probe "
                        "per batch, until it serves again",
                        self._names[index],
                        breaker.streak,
                    )


def _answer_nowhere(mb: _MicroBatch) -> None:
    """A known-good probe's verdict is in: its private batch (which nobody awaits) is
    answered, so the stages drop it as stale instead of running it further."""
    mb.batch.answer(mb.indices, outputs=[None])


def _merge(a: Outcome, b: Outcome) -> Outcome:
    if b is _NOTHING:
        return a
    if a is _NOTHING:
        return b
    return Outcome(a.rerun + b.rerun, a.fail + b.fail, a.first + b.first)
