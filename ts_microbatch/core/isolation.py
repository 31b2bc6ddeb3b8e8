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
Parts = list[tuple[_MicroBatch, BaseException]]


class _OwnProbe:
    """On the first item of a failed micro-batch of one request: the rest, waiting for it."""

    __slots__ = ("stage", "rest")

    def __init__(self, stage: int, rest: _MicroBatch | None) -> None:
        self.stage = stage
        self.rest = rest


class _BrokenProbe:
    """On a batch's one probe in a stage on trial or open: the parts held for it. With a
    known-good input (``good``), the probe is that input in a private batch (its answer goes
    nowhere), ``rest`` the witnesses still to run should it fail and ``failed`` those that
    failed; otherwise the probe is the first item of the batch's failing micro-batch."""

    __slots__ = ("record", "stage", "held", "good", "rest", "failed")

    def __init__(
        self,
        record: _BatchRecord,
        stage: int,
        held: Parts,
        witnesses: Sequence[KnownGood] = (),
    ) -> None:
        self.record = record
        self.stage = stage
        self.held = held
        self.good: KnownGood | None = witnesses[0] if witnesses else None
        self.rest = list(witnesses[1:])
        self.failed: list[KnownGood] = []


_BROKEN = "broken"  # the batch's probe failed there too: the stage's failures fail whole
_ISOLATE = "isolate"  # the probe passed or failed otherwise: the batch's failures bisected


class _BatchRecord:
    """A batch's part in the stages' records: each breaker's successes at its start, how
    many of its requests failed a run of one item there, and its probe while a breaker is
    open."""

    __slots__ = ("successes", "failed_alone", "probes")

    def __init__(self, breakers: Sequence[StageBreaker]) -> None:
        self.successes = [breaker.successes for breaker in breakers]
        self.failed_alone: list[set[int]] = [set() for _ in breakers]
        self.probes: dict[int, _BrokenProbe | str] = {}


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
        self._records: weakref.WeakKeyDictionary[Batch, _BatchRecord] = weakref.WeakKeyDictionary()
        # The first stage has served a request since the pipeline started (only ever set).
        self.first_stage_served = False

    def track(self, batch: Batch) -> None:
        """Starts ``batch``'s record; at its last answer, the breakers judge it."""
        if self.first_stage_served:
            batch.first_stage_served = True
        with self._lock:
            self._records[batch] = _BatchRecord(self._breakers)
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
            if isinstance(probe, _BrokenProbe) and probe.good is not None:
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
            if isinstance(probe, _BrokenProbe) and probe.good is not None:
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
        alone.split = _OwnProbe(stage, rest)
        return Outcome([], [], first=(alone,))

    def _while_broken(self, mb: _MicroBatch, stage: int, error: BaseException) -> Outcome:
        """``stage`` is on trial or open: the batch's probe decides, the stage's known-good
        inputs (the first item on trial when it has none: ts_microbatch.core.breaker)."""
        record = self._record(mb.batch)
        state = record.probes.get(stage)
        if state is _BROKEN:
            return Outcome([], [Fail(mb, error, stage, isolated=False)])
        if state is _ISOLATE:
            return self._isolate(mb, stage)
        if isinstance(state, _BrokenProbe):
            state.held.append((mb, error))
            return _NOTHING
        witnesses = self._breakers[stage].witnesses()
        if witnesses:
            probe = record.probes[stage] = _BrokenProbe(record, stage, [(mb, error)], witnesses)
            return self._run_witness(probe, witnesses[0], mb.batch)
        alone, rest = mb.first_alone()
        held = [(rest, error)] if rest is not None else []
        alone.split = record.probes[stage] = _BrokenProbe(record, stage, held)
        return Outcome([], [], first=(alone,))

    def _run_witness(self, probe: _BrokenProbe, good: KnownGood, until: Batch) -> Outcome:
        """``good`` runs alone ahead of the queue as ``probe``, for the batch ``until``."""
        probe.good = good
        alone = good.micro_batch()
        alone.split = probe
        until.when_answered(self._probe_expiry(alone, probe.stage, good))
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
        probe: _BrokenProbe,
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
                return self._run_witness(probe, probe.rest.pop(0), probe.held[0][0].batch)
            if good.warm or len(probe.failed) >= 2:
                return self._probe_failed(probe, stage, error)
        for failed in probe.failed:
            breaker.forget(failed)
        return self._release(probe)

    def _probe_failed(self, probe: object, stage: int, error: BaseException) -> Outcome:
        """A probe failed alone (its own failure is given by the caller): what waited for
        it. An own probe's rest needs nothing: all above the probe in its request, it is
        never run (``Outcomes.skip_items_above``)."""
        if not isinstance(probe, _BrokenProbe):
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
            probe.record.probes[probe.stage] = _BROKEN
            return Outcome([], [Fail(mb, e, probe.stage, isolated=False) for mb, e in probe.held])
        return self._release(probe)

    def _release(self, probe: object) -> Outcome:
        """A probe got through its stage, or was dropped, or failed unlike the stage: what
        waited for it is isolated by the rule."""
        if isinstance(probe, _OwnProbe):
            rest = probe.rest
            if rest is None:
                return _NOTHING
            return Outcome([rest] if len(rest) == 1 else list(rest.halves()), [])
        if isinstance(probe, _BrokenProbe):
            probe.record.probes[probe.stage] = _ISOLATE
            outcome = _NOTHING
            for mb, _ in probe.held:
                outcome = _merge(outcome, self._isolate(mb, probe.stage))
            return outcome
        return _NOTHING

    def _record(self, batch: Batch) -> _BatchRecord:
        record = self._records.get(batch)
        if record is None:
            record = self._records[batch] = _BatchRecord(self._breakers)
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
