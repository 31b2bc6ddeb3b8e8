"""Which requests of a failed micro-batch are to blame: bisection with a bounded cost.

A micro-batch that fails in a stage is split in halves that start over from the first
stage. What happens next depends on both halves' outcomes in that stage:

* one half fails, the other passes: the failing half is split again, so one bad request
  among n costs about 2*log2(n) extra stage calls;
* every micro-batch of the batch (four or more) fails its first run in the same stage
  with the same exception type: the failure is judged **systemic** at once, and every
  request of the batch not yet answered fails with that error. A broken stage so costs
  one call per micro-batch, plus the few halves already running;
* both halves fail there with the same exception type: that is evidence of a failure that
  is not one request's (a broken model fails every input). One more level is tried on
  one half, the *probe*, while the other half is held back. If both halves of the probe
  fail the same way as well, the failure is judged **systemic**: every request of the
  micro-batch fails with its error, and for the rest of the batch a micro-batch failing in
  that stage with that type is failed whole, without bisection. So a broken stage costs
  about one call per micro-batch plus four for the first one, instead of 2n - 1.
  Otherwise bisection goes on in the probe and in the held half as usual.

An error that means bad input (a ``RequestError``, a ``PredictionException`` with a 4xx
code, or a decoder error ``ts_microbatch.status`` maps to 4xx) never leads to a systemic
verdict: it is always bisected down to the request. For other errors, a request is
isolated exactly when its micro-batch holds at most two failing requests and fewer than
all of four or more micro-batches of its batch fail; otherwise the verdict can be
systemic, and requests that would have succeeded fail with the others.

Every decision is returned as an ``Outcome`` for the pipeline to carry out; this module
starts no threads and resolves no futures.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from .batch import Batch, _MicroBatch
from .status import status_code_for

# Below this many micro-batches, "every one failed" is weak evidence (two micro-batches
# with one bad request each fail both), so the probe decides instead.
MIN_MICRO_BATCHES_FOR_BATCH_VERDICT = 4


def declared_per_request(error: BaseException) -> bool:
    """True for errors that mean "this request's input is bad": a RequestError, a 4xx
    PredictionException, or a decoder error known to mean bad input (status.py)."""
    return status_code_for(error) < 500


class Fail(NamedTuple):
    """Fail ``mb``'s requests with the ``error`` raised in ``stage``; ``isolated`` when it
    holds one request that failed on its own."""

    mb: _MicroBatch
    error: BaseException
    stage: int
    isolated: bool


class Outcome(NamedTuple):
    rerun: list[_MicroBatch]  # to queue again at the first stage
    fail: list[Fail]
    # Set when a whole batch is judged systemic: fail every request of it not yet answered.
    fail_batch: Fail | None = None


_NOTHING = Outcome([], [])


class _Split:
    """One bisection step: a micro-batch that failed in ``stage`` with ``error_type``,
    waiting for the outcome of its two halves in that stage."""

    __slots__ = ("batch", "stage", "error_type", "held", "outcomes", "failed")

    def __init__(
        self,
        batch: Batch,
        stage: int,
        error_type: type[BaseException],
        held: tuple[_MicroBatch, BaseException] | None = None,
    ) -> None:
        self.batch = batch
        self.stage = stage
        self.error_type = error_type
        # Set on a probe: its sibling half and that half's error, waiting for the verdict.
        self.held = held
        self.outcomes = 0
        self.failed: list[tuple[_MicroBatch, BaseException]] = []


class Isolator:
    """Decides what to do with failed micro-batches; thread-safe.

    Args:
        enabled: bisect failed micro-batches; when False a failure fails its micro-batch.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()

    def passed(self, mb: _MicroBatch, stage: int) -> Outcome:
        """``mb`` got through ``stage``."""
        with self._lock:
            if stage == 0:
                mb.batch.first_stage_passed = True
            if mb.split is None or mb.split.stage != stage:
                return _NOTHING
            return self._report(mb, None)

    def dropped(self, mb: _MicroBatch) -> Outcome:
        """``mb`` was dropped unrun (its requests were answered already)."""
        with self._lock:
            return self._report(mb, None)

    def failed(self, mb: _MicroBatch, stage: int, error: BaseException) -> Outcome:
        """``mb`` failed in ``stage`` with ``error``."""
        with self._lock:
            verdict = mb.batch.systemic.get(stage)
            if not self.enabled or (verdict is not None and type(error) is verdict):
                isolated = len(mb) == 1 and verdict is None
                # Still an outcome for its split, which may hold a sibling back.
                return _merge(
                    Outcome([], [Fail(mb, error, stage, isolated)]), self._report(mb, None)
                )
            if declared_per_request(error):
                return _merge(self._bisect(mb, stage, error), self._report(mb, None))
            if mb.attempt == 0 and self._every_first_run_failed(mb.batch, stage, error):
                mb.batch.systemic[stage] = type(error)
                whole = Fail(mb, error, stage, isolated=False)
                return _merge(Outcome([], [whole], whole), self._report(mb, None))
            split = mb.split
            if split is not None and split.stage == stage and type(error) is split.error_type:
                return self._report(mb, error)
            # A failure unlike its parent's: bisected on its own, and an outcome for the split.
            return _merge(self._bisect(mb, stage, error), self._report(mb, None))

    @staticmethod
    def _every_first_run_failed(batch: Batch, stage: int, error: BaseException) -> bool:
        key = (stage, type(error))
        batch.first_run_failures[key] = batch.first_run_failures.get(key, 0) + 1
        total = batch.micro_batches
        return (
            total >= MIN_MICRO_BATCHES_FOR_BATCH_VERDICT and batch.first_run_failures[key] == total
        )

    def _report(self, mb: _MicroBatch, error: BaseException | None) -> Outcome:
        """Gives ``mb``'s split its outcome: failed alike (``error``) or anything else."""
        split, mb.split = mb.split, None
        if split is None:
            return _NOTHING
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
        if len(mb) == 1:
            return Outcome([], [Fail(mb, error, stage, isolated=True)])
        split = _Split(mb.batch, stage, type(error), held)
        halves = mb.halves()
        for half in halves:
            half.split = split
        return Outcome(list(halves), [])

    def _resolve(self, split: _Split) -> Outcome:
        """Both halves of ``split`` have an outcome in its stage."""
        waiting = [split.held] if split.held is not None else []
        verdict_given = split.batch.systemic.get(split.stage) is split.error_type
        if (len(split.failed) == 2 and waiting) or verdict_given:
            return self._systemic(split, [*split.failed, *waiting])
        outcome = _NOTHING
        if len(split.failed) == 2 and max(len(mb) for mb, _ in split.failed) > 1:
            # Both failed alike: probe the larger half, hold the other until the verdict.
            (probe, probe_error), other = sorted(split.failed, key=lambda pair: -len(pair[0]))
            outcome = self._bisect(probe, split.stage, probe_error, held=other)
        else:
            for mb, error in split.failed:
                outcome = _merge(outcome, self._bisect(mb, split.stage, error))
        if split.held is not None:
            # A probe whose halves did not both fail: no verdict, the held half is bisected.
            held_mb, held_error = split.held
            outcome = _merge(outcome, self._bisect(held_mb, split.stage, held_error))
        return outcome

    @staticmethod
    def _systemic(split: _Split, failed: list[tuple[_MicroBatch, BaseException]]) -> Outcome:
        split.batch.systemic[split.stage] = split.error_type
        return Outcome([], [Fail(mb, error, split.stage, False) for mb, error in failed])


def _merge(a: Outcome, b: Outcome) -> Outcome:
    if b is _NOTHING:
        return a
    if a is _NOTHING:
        return b
    return Outcome(a.rerun + b.rerun, a.fail + b.fail, a.fail_batch or b.fail_batch)
