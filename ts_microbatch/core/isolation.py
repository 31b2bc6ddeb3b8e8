"""Which requests of a failed micro-batch are to blame, and when a stage is broken.

Follow a micro-batch that fails in a stage (``Isolator.failed``). Each step is returned as
an ``Outcome`` (re-runs, probes to run first, failures) that ``ts_microbatch.core.outcomes``
carries out: this module starts no threads and resolves no futures.

1. **Halves: an item fails only when it fails alone.** A micro-batch of several requests is
   split in halves at a request boundary (a KServe request's instances stay together), both
   re-run from the first stage: one bad request among n costs about 2*log2(n) extra runs.
   A run of one item that fails is its request's own failure (``Fail.isolated``). **A slow
   failure** (its call took over ``SLOW_FAILURE`` times what the stage's passing calls take
   for as many items, and over 50 ms) is split into its requests at once instead: its bad
   request fails slowly once more, alone, not log2(n) times in its neighbours' way.
2. **Probes.** A micro-batch of one request's items runs its first item alone, ahead of the
   queue, while the rest waits (an ``ItemProbe``, ``ts_microbatch.core._probes``): the probe
   failing, in any stage, fails the request and the rest never runs (the lowest-index
   failing item names the request's failure: ``Outcomes.skip_items_above``), so a request of
   n bad instances costs at most two runs a micro-batch; the probe getting through the
   failed stage sends the rest on, in halves. So what a request gets never depends on what
   shares its batch, and no evidence is counted inside a batch.
3. **The breaker** (``ts_microbatch.core.breaker``: one small state machine per stage, across
   batches) keeps a broken model cheap. Each request whose run of one item fails with an
   error that may be the model's adds to its stage's streak; any success clears it. At a
   batch's last answer (``_batch_done``), a stage that served nothing in it, with a streak of
   five and runs of one item failed by two requests or more, goes on trial (open at once
   when it has never served: no known-good input).
4. **Verdicts.** On trial or open, the first micro-batch of a batch that fails there starts
   the batch's ``Trial`` of the stage: its parts failing there are held, and the stage's
   known-good inputs run alone in turn (``KnownGoodProbe``, each in a private batch whose
   answer goes nowhere; with none, the failing micro-batch's first item stands in, an
   ``ItemProbe``). The probe getting through closes the breaker (any success does): the
   failures were the inputs', the held parts are bisected (``Verdict.ISOLATE``). Every
   known-good input failing there in turn (two or more, or warm-up's sample when it is the
   only one), or the stand-in item, with an error that may be the model's, judge it broken:
   the breaker opens and the held parts, and the batch's later ones failing there, fail
   whole, 500 in the server's words (``Verdict.BROKEN``, ``_shared``). Anything else
   isolates them; a known-good input that failed with no verdict (where another passed,
   warm-up's sample too), or whose probe timed out with its batch, is known-good no longer.

Errors that mean bad input never count towards a broken stage: a ``RequestError``, the
adapter's ``is_input_error`` (a 4xx ``PredictionException``, a decoder error). Every stage
is judged so, the first too: a request failing alone in a first stage that has served
(``first_stage_served``) is answered 400 as its own bad input, until the stage is judged
broken (a preprocess whose feature store went down): then its failures are the model's.
A ``BaseException`` that is not an ``Exception`` is a request to stop: its micro-batch fails
whole, as no request's own failure. docs/failures.md gives the rules with their costs.

**One lock**, re-entrant (a batch answered already runs a ``when_answered`` callback at once,
under it: ``_expire_with``), held by every method, ``passed`` on every stage call included:
a few stores, 0.3-0.4 us added to a ``passed`` of about 1 us.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ._probes import BatchRecord, ItemProbe, KnownGoodProbe, Probe, Trial, Verdict
from .batch import Batch
from .breaker import KnownGood, StageBreaker, log_judged
from .errors import MicroBatchingError, RequestError, SharedFailureError
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
# A failing call over this many times a passing call of its size (the stage's seconds per
# item, a moving average of its passing calls), and over SLOW_FAILURE_S (below it, halving
# costs little), is slow: split into its requests at once.
SLOW_FAILURE, SLOW_FAILURE_S = 2.0, 0.05


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
        self._lock = threading.RLock()  # re-entrant: the module docstring says why
        self._breakers = [StageBreaker() for _ in self._names]
        self._per_item: list[float | None] = [None for _ in self._names]  # passing calls' s
        # A batch's record lives as long as the batch; one never tracked gets one on use.
        self._records: weakref.WeakKeyDictionary[Batch, BatchRecord] = weakref.WeakKeyDictionary()
        # The first stage has served a request since the pipeline started (only ever set).
        self.first_stage_served = False

    def track(self, batch: Batch) -> None:
        """Starts ``batch``'s record; at its last answer, the breakers judge it."""
        with self._lock:
            if self.first_stage_served:
                batch.first_stage_served = True
            self._records[batch] = BatchRecord(self._breakers)
        batch.when_answered(self._batch_done)

    def broken(self) -> list[str]:
        """The stages judged broken now (their breaker open)."""
        with self._lock:
            return [name for name, b in zip(self._names, self._breakers) if b.open]

    # -- what the stage threads report -----------------------------------------------

    def passed(self, mb: _MicroBatch, stage: int, run_s: float | None = None) -> Outcome:
        """``mb`` got through ``stage``, its call taking ``run_s`` seconds."""
        good = KnownGood.of(mb)  # outside the lock: it copies its request's context row
        with self._lock:
            if run_s is not None:
                pace, now = self._per_item[stage], run_s / len(mb)
                self._per_item[stage] = now if pace is None else pace + 0.2 * (now - pace)
            if self._breakers[stage].success(good):
                logger.warning("stage %s served again: no longer judged broken", self._names[stage])
            if stage == 0:
                mb.batch.first_stage_served = self.first_stage_served = True
            probe = mb.probe
            if probe is None or probe.stage != stage:
                return _NOTHING
            mb.probe = None
            if isinstance(probe, KnownGoodProbe):
                _answer_nowhere(mb)  # its verdict is in: the later stages drop it
                self._forget(probe.trial)  # they failed alone where another passed
                logger.info(
                    "stage %s: its known-good input passed alone, so the failures were the "
                    "inputs'; the stage serves on",
                    self._names[stage],
                )
            return self._release(probe)

    def dropped(self, mb: _MicroBatch) -> Outcome:
        """``mb`` was dropped unrun (its items were answered already, or failed outside a
        stage): what waited for it, if it was a probe, goes on."""
        with self._lock:
            probe, mb.probe = mb.probe, None
            return self._release(probe)

    def failed(
        self, mb: _MicroBatch, stage: int, error: BaseException, failed_s: float | None = None
    ) -> Outcome:
        """``mb`` failed in ``stage`` with ``error``, its call taking ``failed_s`` seconds."""
        with self._lock:
            probe, mb.probe = mb.probe, None
            if isinstance(probe, KnownGoodProbe):
                return self._known_good_failed(mb, probe, stage, error)
            if not isinstance(error, Exception):  # a request to stop: never re-run
                stopped = Outcome([], [self._shared(mb, error, stage, "was stopped")])
                return _merge(stopped, self._release(probe))
            if not self.enabled:
                if mb.one_request():
                    return Outcome([], [Fail(mb, error, stage, isolated=True)])
                why = "failed for a micro-batch of several requests (isolation is disabled)"
                return Outcome([], [self._shared(mb, error, stage, why)])
            if stage == 0 and self.first_stage_served:
                # Its answer reads the batch's flag: as the isolator judged it (a batch
                # tracked before another's first success would otherwise say 500).
                mb.batch.first_stage_served = True
            if len(mb) == 1:  # its own failure, unless the stage is judged broken
                broken = self._breakers[stage].open and not self._is_input_error(error)
                own = Outcome([], [Fail(mb, error, stage, isolated=not broken)])
                return _merge(own, self._item_failed(mb, probe, stage, error))
            if not self._is_input_error(error) and self._breakers[stage].suspect:
                return self._on_trial(mb, stage, error)
            pace = self._per_item[stage]  # a slow failure (rule 1): its requests apart
            if failed_s is not None and pace is not None and not mb.one_request():
                slow = failed_s > max(SLOW_FAILURE * pace * len(mb), SLOW_FAILURE_S)
                return Outcome(mb.requests(), []) if slow else self._isolate(mb, stage)
            return self._isolate(mb, stage)

    # -- halves and item probes ------------------------------------------------------

    def _isolate(self, mb: _MicroBatch, stage: int) -> Outcome:
        """The rule for a micro-batch that failed in ``stage``: halves at a request boundary,
        or, within one request, its first item alone ahead of the rest."""
        if len(mb) == 1:  # held for a probe, never run alone: it runs alone now
            return Outcome([mb], [])
        if not mb.one_request():
            return Outcome(list(mb.halves()), [])
        alone, rest = mb.first_alone()
        alone.probe = ItemProbe(stage, rest, trial=None)
        return Outcome([], [], first=(alone,))

    def _item_failed(
        self, mb: _MicroBatch, probe: ItemProbe | None, stage: int, error: BaseException
    ) -> Outcome:
        """A run of one item failed (its own failure is the caller's): it counts towards a
        broken stage, once per request and batch (a request's instances failing alone at
        once, in two threads, are one bad request). Then what waited for it, if it was a
        probe: an own probe's rest needs nothing, all above it in its request it never runs
        (``Outcomes.skip_items_above``); a trial's stand-in gives the verdict."""
        may_be_broken = not self._is_input_error(error)
        requests = self._record(mb.batch).failed_alone[stage]
        if may_be_broken and mb.owners[0] not in requests:
            requests.add(mb.owners[0])
            self._breakers[stage].failed_alone()
        if probe is None or probe.trial is None:
            return _NOTHING
        if stage == probe.stage and may_be_broken and self._breakers[stage].suspect:
            return self._judge_broken(probe.trial, error)
        return self._release(probe)

    # -- a batch's trial of a stage on trial or open ---------------------------------

    def _on_trial(self, mb: _MicroBatch, stage: int, error: BaseException) -> Outcome:
        """``mb`` failed in ``stage``, on trial or open: its batch's trial of the stage
        decides, started here by its first failing micro-batch."""
        record = self._record(mb.batch)
        trial = record.trials.get(stage)
        if trial is None:
            trial = record.trials[stage] = Trial(stage, self._breakers[stage].witnesses())
            if trial.witnesses:
                trial.held.append((mb, error))
                return self._run_known_good(trial, mb.batch)
            alone, rest = mb.first_alone()  # nothing known-good: its first item stands in
            if rest is not None:  # worded as its whole call's: the item may have raised it
                trial.held.append((rest, self._shared(mb, error, stage, _BROKEN).error))
            alone.probe = ItemProbe(stage, rest=None, trial=trial)
            return Outcome([], [], first=(alone,))
        if trial.verdict is Verdict.BROKEN:
            return Outcome([], [self._shared(mb, error, stage, _BROKEN)])
        if trial.verdict is Verdict.ISOLATE:
            return self._isolate(mb, stage)
        trial.held.append((mb, error))  # PENDING: its probe is running
        return _NOTHING

    def _run_known_good(self, trial: Trial, until: Batch) -> Outcome:
        """The trial's next known-good input runs alone ahead of the queue, for ``until``."""
        probe = KnownGoodProbe(trial, trial.witnesses.pop(0), until)
        alone = probe.good.micro_batch()
        alone.probe = probe
        until.when_answered(self._expire_with(alone, probe))
        return Outcome([], [], first=(alone,))

    def _expire_with(self, alone: _MicroBatch, probe: KnownGoodProbe) -> Callable[[Batch], None]:
        """What ``probe.until`` does at its last answer. Only when it timed out does the
        probe expire with it, so a call stuck on it is abandoned with the batch's timeout;
        answered for any other reason (its held parts failed whole, or skipped as a failed
        instance's siblings), the probe finishes and its answer goes nowhere: expiring it
        then made ``StallGuard`` take a healthy call for a stuck one. A probe that timed out
        gives no verdict, so its input is known-good no longer: the next batch does not run
        it again, nor lose another thread to it."""

        def expire(until: Batch) -> None:
            if until.timed_out and not alone.batch.expire(None):
                with self._lock:
                    self._breakers[probe.stage].forget(probe.good)

        return expire

    def _known_good_failed(
        self, mb: _MicroBatch, probe: KnownGoodProbe, stage: int, error: BaseException
    ) -> Outcome:
        """The known-good input ``mb`` failed in ``stage``: no request's failure. The next
        witness runs; judged broken when all failed (the witness rule, module docstring)."""
        _answer_nowhere(mb)
        trial = probe.trial
        if not isinstance(error, Exception):  # a request to stop: no verdict on the model
            return self._release(probe)
        may_be_broken = not self._is_input_error(error)
        if may_be_broken:
            self._breakers[stage].failed_alone()
        trial.failed.append(probe.good)
        if stage == trial.stage and may_be_broken and self._breakers[stage].suspect:
            if trial.witnesses:  # the next one runs, for the same batch
                return self._run_known_good(trial, probe.until)
            # Every witness failed alone: two or more, or warm-up's sample as the only one.
            if len(trial.failed) >= 2 or trial.failed[0].warm:
                return self._judge_broken(trial, error)
        self._forget(trial)
        return self._release(probe)

    def _judge_broken(self, trial: Trial, error: BaseException) -> Outcome:
        """The trial's probe failed alone in its stage with an error that may be the
        model's, the stage still on trial or open: it is broken, the held parts fail whole."""
        breaker = self._breakers[trial.stage]
        if breaker.probe_failed():
            logger.error(
                "stage %s judged broken: its known-good inputs failed alone (%s) after %d runs "
                "of one item failed with nothing served in between; its micro-batches that "
                "fail now fail whole after one probe per batch, until it serves again",
                self._names[trial.stage],
                type(error).__name__,
                breaker.streak,
            )
        held = trial.settle(Verdict.BROKEN)
        return Outcome([], [self._shared(mb, e, trial.stage, _BROKEN) for mb, e in held])

    def _shared(self, mb: _MicroBatch, error: BaseException, stage: int, why: str) -> Fail:
        """``mb`` fails whole, as no request's own failure: **a request's answer is its own**.
        Several requests get ``SharedFailureError`` in the server's words, caused by ``error``
        (logged, never answered: any of them may have raised it, quoting its input); the
        package's own errors but a request's (an output count, a stall) name no input."""
        own = isinstance(error, MicroBatchingError) and not isinstance(error, RequestError)
        if mb.one_request() or own:
            return Fail(mb, error, stage, isolated=False)
        shared = SharedFailureError(f"stage {self._names[stage]} {why}")
        shared.__cause__ = error
        return Fail(mb, shared, stage, isolated=False)

    def _forget(self, trial: Trial) -> None:
        """The trial's known-good inputs that failed gave no verdict: known-good no longer."""
        for good in trial.failed:
            self._breakers[trial.stage].forget(good)

    def _release(self, probe: Probe | None) -> Outcome:
        """A probe got through its stage, or was dropped, or failed with no verdict: what
        waited for it goes on, isolated by the rule."""
        if isinstance(probe, ItemProbe) and probe.trial is None:
            rest = probe.rest  # the others of its one-request micro-batch
            if rest is None:
                return _NOTHING
            return Outcome([rest] if len(rest) == 1 else list(rest.halves()), [])
        trial = None if probe is None else probe.trial
        if trial is None:
            return _NOTHING
        outcome = _NOTHING
        for mb, _ in trial.settle(Verdict.ISOLATE):
            outcome = _merge(outcome, self._isolate(mb, trial.stage))
        return outcome

    # -- the evidence ----------------------------------------------------------------

    def _record(self, batch: Batch) -> BatchRecord:
        record = self._records.get(batch)
        if record is None:
            record = self._records[batch] = BatchRecord(self._breakers)
        return record

    def _batch_done(self, batch: Batch) -> None:
        """``batch``'s last answer: each breaker judges what it saw (breaker.batch_done)."""
        with self._lock:
            record = self._records.pop(batch, None)
            if record is None:
                return
            for index, breaker in enumerate(self._breakers):
                failed_alone = len(record.failed_alone[index])
                state = breaker.batch_done(record.successes[index], failed_alone)
                if state is not None:
                    log_judged(self._names[index], state, breaker.streak)


_BROKEN = "failed on inputs known to be good: judged broken, it fails fast until it serves again"


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
