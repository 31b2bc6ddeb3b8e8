"""Which requests of a failed micro-batch are to blame: bisection with a bounded cost.

A micro-batch that fails in a stage is split in halves (at a request boundary: a KServe
request's instances stay together) that start over from the first stage:

* one half fails, the other passes: the failing half is split again, so one bad request
  among n costs about 2*log2(n) extra stage calls;
* both halves fail there with the same exception type: one more level is tried on one half,
  the *probe*, while the other is held back; if the probe's halves fail alike too, three
  parts that share no request failed alike, evidence of a broken stage;
* every micro-batch of the batch fails its first run in the same stage with the same type,
  and it takes at least four requests to explain that: the same evidence, for the batch.

**A verdict needs requests failing alone.** Parts failing alike can be a failure of their
company (a preprocess stacking images of two sizes; a KServe request's instances among
themselves). So a **systemic** verdict (the parts fail with the error, with the batch rule
every request not answered yet, and later micro-batches failing alike fail whole) is given
only once items of up to four of the failed parts' requests (``MIN_REQUESTS_FOR_BATCH_
VERDICT``) failed alone alike: runs of one item, the *lone probes* run ahead of the queue
while the parts wait, or halves of one item. An item of a failed part passing alone means
the company failed: no verdict for that stage and type in the batch, and every part is
bisected down to the items. A request's own halves failing alike are its failure once an
item of it failed alone (a probe of one of its items first).

**The first stage's record.** Once the first stage has served a request since the model was
loaded (``Isolator.first_stage_served``), a request failing there alone has met a bad input
of its own (the adapter answers it 400), so no verdict is given there any more. A model
whose first stage never served can still be judged systemic there: its failure is its own
(500), alone as in a batch.

A ``BaseException`` that is not an ``Exception`` (KeyboardInterrupt, SystemExit) is a request
to stop: its micro-batch fails whole, unbisected, as no request's own failure. An error
that means bad input (``RequestError``, a 4xx ``PredictionException``, a decoder error
``ts_microbatch.torchserve.status`` maps to 4xx) never leads to a verdict. docs/failures.md
gives the rules with their costs.

Every decision is returned as an ``Outcome`` for the pipeline to carry out; this module
starts no threads and resolves no futures. Its bookkeeping (``ts_microbatch.core._ledger``)
is kept per batch by the ``Isolator``, so the state machine can be driven and tested
without a pipeline: ``track`` a batch, then report ``passed``, ``failed`` and ``dropped``
micro-batches and carry out the outcomes.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Callable, Sequence

from ._ledger import (
    _NOTHING,
    Fail,
    Key,
    Outcome,
    Parts,
    PendingKey,
    _Alone,
    _Ledger,
    _merge,
    _Pending,
    _Split,
)
from .batch import Batch
from .errors import RequestError
from .micro_batch import _MicroBatch

__all__ = ["Fail", "Isolator", "Outcome", "declared_per_request", "fewest_requests"]

# Below this many requests to blame, "every micro-batch failed" is weak evidence (two
# micro-batches with one bad request each fail both), so the probe decides instead.
MIN_REQUESTS_FOR_BATCH_VERDICT = 4


def declared_per_request(error: BaseException) -> bool:
    """The core's own notion of "this request's input is bad": a ``RequestError``. An
    adapter that knows more (TorchServe's 4xx ``PredictionException``, decoder errors) gives
    the ``Isolator`` its own test."""
    return isinstance(error, RequestError)


def fewest_requests(owners: Sequence[int] | None, spans: Sequence[range]) -> int:
    """The fewest requests whose items meet every one of ``spans``: how many bad requests
    it takes, at least, to fail all those micro-batches.

    Args:
        owners: the request of each position of the cut, numbered non-decreasing
            (``Order.groups``); None: position p is request p.
        spans: the micro-batches' position ranges, disjoint and in order.
    """
    if owners is None:
        return len(spans)
    count, reached = 0, -1  # reached: the last item of the last request counted
    for span in spans:
        if span.start <= reached:
            continue  # the last request counted has items here too
        # Of the requests in this span, the one holding its last item reaches furthest.
        reached = bisect.bisect_right(owners, owners[span[-1]]) - 1
        count += 1
    return count


def _requests(mb: _MicroBatch) -> int:
    return len(set(mb.owners))


class Isolator:
    """Decides what to do with failed micro-batches; thread-safe.

    Args:
        enabled: bisect failed micro-batches; when False a failure fails its micro-batch.
        is_input_error: whether an error means its request's input is bad (never a systemic
            verdict, always bisected down to the request).
    """

    def __init__(
        self,
        enabled: bool = True,
        is_input_error: Callable[[BaseException], bool] = declared_per_request,
    ) -> None:
        self.enabled = enabled
        self._is_input_error = is_input_error
        self._lock = threading.Lock()
        # A batch's bookkeeping lives as long as the batch: stale micro-batches of a batch
        # that timed out still report to it, and nothing has to remember to drop it.
        self._ledgers: weakref.WeakKeyDictionary[Batch, _Ledger] = weakref.WeakKeyDictionary()
        # The first stage has served a request since the pipeline started (only ever set).
        self.first_stage_served = False

    def track(self, batch: Batch, micro_batches: Sequence[_MicroBatch]) -> None:
        """Starts the bookkeeping of ``batch``, cut into ``micro_batches`` for their first
        runs. A batch not tracked is never judged by the batch rule."""
        if self.first_stage_served:
            batch.first_stage_served = True
        with self._lock:
            self._ledgers[batch] = _Ledger([mb.indices for mb in micro_batches])

    def _ledger(self, batch: Batch) -> _Ledger:
        ledger = self._ledgers.get(batch)
        if ledger is None:
            ledger = self._ledgers[batch] = _Ledger([])
        return ledger

    def passed(self, mb: _MicroBatch, stage: int) -> Outcome:
        """``mb`` got through ``stage``."""
        if stage == 0:
            # Only ever set, never cleared: no lock.
            mb.batch.first_stage_served = self.first_stage_served = True
        if mb.split is None:
            # A first run (the common case, every stage call of a healthy batch) waits on no
            # bisection step. ``split`` is set before a half is queued and cleared only by
            # the thread running it, so this thread reads it without the shared lock.
            return _NOTHING
        with self._lock:
            split = mb.split
            if split is None or split.stage != stage:
                return _NOTHING
            outcome = _NOTHING
            if len(mb) == 1:
                # An item of a failed part got through alone: what failed there was its
                # company, so no verdict waiting in this stage is given.
                outcome = self._company(mb.batch, stage)
            if isinstance(split, _Alone):
                mb.split = None
                return outcome
            return _merge(outcome, self._report(mb, None))

    def dropped(self, mb: _MicroBatch) -> Outcome:
        """``mb`` was dropped unrun (its items were answered already, or failed outside a
        stage): an outcome for its split, which may hold a sibling back."""
        with self._lock:
            return self._report(mb, None)

    def failed(self, mb: _MicroBatch, stage: int, error: BaseException) -> Outcome:
        """``mb`` failed in ``stage`` with ``error``."""
        with self._lock:
            if not isinstance(error, Exception):
                # KeyboardInterrupt, SystemExit, GeneratorExit: a request to stop, which says
                # nothing about any input (a stage that failed one request alone in the first
                # stage was taken for that request's bad input, 400). Code that asked to stop
                # is not re-run: the micro-batch fails whole, never as one request's.
                stopped = Outcome([], [Fail(mb, error, stage, isolated=False)])
                return _merge(stopped, self._report(mb, None))
            ledger = self._ledger(mb.batch)
            key: Key = (stage, type(error))
            verdict = ledger.systemic.get(stage)
            if not self.enabled or (verdict is not None and type(error) is verdict):
                isolated = mb.one_request() and verdict is None
                # Still an outcome for its split, which may hold a sibling back.
                return _merge(
                    Outcome([], [Fail(mb, error, stage, isolated)]), self._report(mb, None)
                )
            alone = len(mb) == 1 and self._may_be_systemic(stage, error)
            if alone:
                # A run of one item failed: the evidence a verdict waits for.
                ledger.alone_failed.setdefault(key, set()).add(mb.owners[0])
            probe = mb.split if isinstance(mb.split, _Alone) else None
            if probe is not None:
                # A lone probe is answered with its own failure, whatever the verdict.
                mb.split = None
                own = Outcome([], [Fail(mb, error, stage, isolated=True)])
                return _merge(own, self._probe_reported(probe, alone and probe.key[:2] == key))
            if alone:
                given = self._given(ledger, key, mb.owners[0])
                if given is not _NOTHING:
                    own = _merge(self._bisect(mb, stage, error), self._report(mb, None))
                    return _merge(given, own)
            if self._is_input_error(error):
                return _merge(self._bisect(mb, stage, error), self._report(mb, None))
            if mb.attempt == 0 and self._every_first_run_failed(mb.batch, ledger, stage, error):
                return self._judge(ledger, key, [(mb, error)], whole=True)
            split = mb.split
            if (
                isinstance(split, _Split)
                and split.stage == stage
                and type(error) is split.error_type
            ):
                return self._report(mb, error)
            # A failure unlike its parent's: bisected on its own, and an outcome for the split.
            return _merge(self._bisect(mb, stage, error), self._report(mb, None))

    def _may_be_systemic(self, stage: int, error: BaseException) -> bool:
        """Whether a failure in ``stage`` with ``error`` can lead to a verdict: never for a
        bad input, nor in a first stage that has served (a request failing there alone has
        met a bad input: the module's docstring)."""
        return not self._is_input_error(error) and not (stage == 0 and self.first_stage_served)

    @staticmethod
    def _every_first_run_failed(
        batch: Batch, ledger: _Ledger, stage: int, error: BaseException
    ) -> bool:
        key = (stage, type(error))
        failures = ledger.first_run_failures[key] = ledger.first_run_failures.get(key, 0) + 1
        return (
            failures == len(ledger.spans)
            and fewest_requests(batch.order.groups, ledger.spans) >= MIN_REQUESTS_FOR_BATCH_VERDICT
        )

    def _judge(self, ledger: _Ledger, key: Key, parts: Parts, *, whole: bool) -> Outcome:
        """Parts that failed alike with ``key`` point at a broken stage: the verdict once
        enough of their requests failed alone alike (up to four: ``MIN_REQUESTS_FOR_BATCH_
        VERDICT``), else lone probes of those requests first; bisection when no verdict may
        be given (a company's failure, a first stage that has served, a bad input)."""
        stage, error_type = key
        if key in ledger.company or not self._may_be_systemic(stage, parts[0][1]):
            return _bisect_all(self, parts, stage)
        requests = list(dict.fromkeys(owner for mb, _ in parts for owner in mb.owners))
        need = min(MIN_REQUESTS_FOR_BATCH_VERDICT, len(requests))
        evidence = ledger.alone_failed.get(key, set())
        if len(evidence) >= need:
            return self._conclude(ledger, key, parts, whole)
        pending = ledger.pending.get(key)
        if pending is not None:  # lone probes are already out for this verdict
            pending.held.extend(parts)
            pending.whole = pending.whole or whole
            return _NOTHING
        chosen = {r for r in requests if r not in evidence}
        chosen = set(sorted(chosen, key=requests.index)[: need - len(evidence)])
        probes: list[_MicroBatch] = []
        held: Parts = []
        unrun: Parts = []
        for mb, error in parts:
            if chosen.intersection(mb.owners):
                alone, rest = mb.lone_items(chosen)
                probes += alone
                unrun += [(piece, error) for piece in rest]
            else:
                held.append((mb, error))
        ledger.pending[key] = _Pending(held, unrun, whole, need, len(probes), parts[0])
        for probe in probes:
            probe.split = _Alone(ledger, key)
        return Outcome([], [], first=tuple(probes))

    def _probe_reported(self, alone: _Alone, failed_alike: bool) -> Outcome:
        """A lone probe of ``alone``'s verdict failed (alike or not) or was dropped: the
        verdict once the evidence is there, a release once every probe reported without."""
        ledger = alone.ledger
        pending = ledger.pending.get(alone.key)
        if pending is None:
            return _NOTHING
        pending.probes -= 1
        if failed_alike and self._enough(ledger, alone.key, pending):
            del ledger.pending[alone.key]
            return self._verdict(ledger, alone.key, pending, [])
        if pending.probes <= 0:
            del ledger.pending[alone.key]
            return self._release(pending, alone.stage)
        return _NOTHING

    def _given(self, ledger: _Ledger, key: Key, request: int) -> Outcome:
        """An item of ``request`` failed alone with ``key``: the verdicts waiting for that
        (the batch's, the request's own) that now have their evidence."""
        outcome = _NOTHING
        for pending_key in (key, (*key, request)):
            pending = ledger.pending.get(pending_key)
            if pending is not None and self._enough(ledger, pending_key, pending):
                del ledger.pending[pending_key]
                outcome = _merge(outcome, self._verdict(ledger, pending_key, pending, []))
        return outcome

    @staticmethod
    def _enough(ledger: _Ledger, pending_key: PendingKey, pending: _Pending) -> bool:
        evidence = ledger.alone_failed.get((pending_key[0], pending_key[1]), set())
        if len(pending_key) == 3:  # a request's own: an item of it failed alone
            return pending_key[2] in evidence
        return len(evidence) >= pending.need

    def _verdict(
        self, ledger: _Ledger, pending_key: PendingKey, pending: _Pending, parts: Parts
    ) -> Outcome:
        """The verdict ``pending`` waited for: the batch's (systemic), or a request's own
        (its parts fail as its failure)."""
        parts = [*pending.parts(), *parts]
        if len(pending_key) == 3:
            stage = pending_key[0]
            return Outcome([], [Fail(mb, error, stage, isolated=True) for mb, error in parts])
        key = (pending_key[0], pending_key[1])
        outcome = self._conclude(ledger, key, parts, whole=False)
        if pending.whole:  # every request of the batch not answered yet, with its error
            mb, error = pending.origin
            whole_fail = Fail(mb, error, key[0], isolated=False)
            outcome = _merge(outcome, Outcome([], [], whole_fail))
        return outcome

    def _own(self, ledger: _Ledger, key: Key, parts: Parts) -> Outcome:
        """One request's parts (halves) failed alike with ``key``: its own failure once an
        item of it failed alone alike, else one of its items runs alone first."""
        request = parts[0][0].owners[0]
        if request in ledger.alone_failed.get(key, set()):
            return Outcome([], [Fail(mb, error, key[0], isolated=True) for mb, error in parts])
        pending_key = (*key, request)
        pending = ledger.pending.get(pending_key)
        if pending is not None:
            pending.held.extend(parts)
            return _NOTHING
        (first, error), held = parts[0], parts[1:]
        alone, rest = first.lone_items({request})
        ledger.pending[pending_key] = _Pending(
            held, [(piece, error) for piece in rest], False, 1, len(alone), parts[0]
        )
        for probe in alone:
            probe.split = _Alone(ledger, pending_key)
        return Outcome([], [], first=tuple(alone))

    def _company(self, batch: Batch, stage: int) -> Outcome:
        """No verdict in ``stage`` for ``batch``: its pending verdicts there are released."""
        ledger = self._ledger(batch)
        outcome = _NOTHING
        for key in [k for k in ledger.pending if k[0] == stage]:
            if len(key) == 2:  # the batch's verdict; a request's own just bisects on
                ledger.company.add((key[0], key[1]))
            outcome = _merge(outcome, self._release(ledger.pending.pop(key), stage))
        return outcome

    @staticmethod
    def _conclude(ledger: _Ledger, key: Key, parts: Parts, whole: bool) -> Outcome:
        """The verdict: ``parts`` fail with their errors, and with ``whole`` every request
        of the batch not answered yet."""
        stage, error_type = key
        ledger.systemic[stage] = error_type
        fails = [Fail(mb, error, stage, isolated=False) for mb, error in parts]
        return Outcome([], fails, fails[0] if whole and fails else None)

    def _release(self, pending: _Pending, stage: int) -> Outcome:
        """No verdict: the parts held are bisected, the pieces of the probed parts run
        again."""
        again = Outcome([mb for mb, _ in pending.unrun], [])
        return _merge(again, _bisect_all(self, pending.held, stage))

    def _report(self, mb: _MicroBatch, error: BaseException | None) -> Outcome:
        """Gives ``mb``'s split its outcome: failed alike (``error``) or anything else."""
        split, mb.split = mb.split, None
        if split is None:
            return _NOTHING
        if isinstance(split, _Alone):  # dropped, or stopped: no evidence from it
            return self._probe_reported(split, failed_alike=False)
        split.outcomes += 1
        if error is not None:
            split.failed.append((mb, error))
        return self._resolve(split) if split.outcomes == 2 else _NOTHING

    def _bisect(
        self,
        mb: _MicroBatch,
        stage: int,
        error: BaseException,
        held: tuple[_MicroBatch, BaseException] | None = None,
    ) -> Outcome:
        if len(mb) == 1:  # never a probe (``held``): a probe holds two requests at least
            return Outcome([], [Fail(mb, error, stage, isolated=True)])
        within = mb.one_request()
        split = _Split(self._ledger(mb.batch), stage, type(error), held, within=within)
        halves = mb.halves()
        for half in halves:
            half.split = split
        return Outcome(list(halves), [])

    def _resolve(self, split: _Split) -> Outcome:
        """Both halves of ``split`` have an outcome in its stage."""
        waiting = [split.held] if split.held is not None else []
        key: Key = (split.stage, split.error_type)
        if split.ledger.systemic.get(split.stage) is split.error_type:
            return self._conclude(split.ledger, key, [*split.failed, *waiting], whole=False)
        if len(split.failed) == 2 and waiting:
            # Halves share no request: a probe and its held sibling failing alike are three
            # requests at least.
            return self._judge(split.ledger, key, [*split.failed, *waiting], whole=False)
        if split.within and len(split.failed) == 2:
            # One request's halves both failed: its failure, whichever instance is to blame,
            # once an item of it failed alone (its instances may fail only in each other's
            # company): a lone probe of one of its items first.
            return self._own(split.ledger, key, split.failed)
        outcome = _NOTHING
        if len(split.failed) == 2 and max(_requests(mb) for mb, _ in split.failed) > 1:
            # Both failed alike: probe the half of more requests, hold the other until the
            # verdict.
            (probe, probe_error), other = sorted(
                split.failed, key=lambda pair: (-_requests(pair[0]), -len(pair[0]))
            )
            outcome = self._bisect(probe, split.stage, probe_error, held=other)
        else:
            for mb, error in split.failed:
                outcome = _merge(outcome, self._bisect(mb, split.stage, error))
        if split.held is not None:
            # A probe whose halves did not both fail: no verdict, the held half is bisected.
            held_mb, held_error = split.held
            outcome = _merge(outcome, self._bisect(held_mb, split.stage, held_error))
        return outcome


def _bisect_all(isolator: Isolator, parts: Parts, stage: int) -> Outcome:
    outcome = _NOTHING
    for mb, error in parts:
        outcome = _merge(outcome, isolator._bisect(mb, stage, error))
    return outcome
