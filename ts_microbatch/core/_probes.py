"""The isolator's data (``ts_microbatch.core.isolation``): its two kinds of probe, a batch's
trial of a stage, and a batch's record. Data only; every field is read and written under
the isolator's lock.

A probe is one input run alone from the first stage, ahead of the queue, while something
waits for its outcome in ``stage``. The two kinds differ in what their failure means:

* ``ItemProbe``: an item of the batch itself, the first of a micro-batch that failed. Its
  failure is its own request's. What waits is the rest of that micro-batch when it was
  one request's (``rest``), or, when the stage is on trial with no known-good input to
  test it with, the batch's parts held for that trial (``trial``).
* ``KnownGoodProbe``: an input the stage once served (``KnownGood``), replayed in a private
  batch that nobody awaits. Its failure is no request's: it is evidence on the stage. What
  waits is always a ``trial``.
"""

from __future__ import annotations

import enum
from typing import Union

from .batch import Batch
from .breaker import KnownGood, StageBreaker
from .micro_batch import _MicroBatch

Parts = list[tuple[_MicroBatch, BaseException]]


class Verdict(enum.Enum):
    """A batch's verdict on a stage on trial or open, which its probe gives."""

    PENDING = "pending"  # its probe runs: the batch's parts failing there are held for it
    BROKEN = "broken"  # the probe failed there too: the batch's failures there fail whole
    ISOLATE = "isolate"  # the probe passed or failed otherwise: its failures are bisected


class Trial:
    """One batch's trial of one stage on trial or open: its verdict, the parts that failed
    there held until the verdict, the known-good inputs still to run and those that failed."""

    __slots__ = ("stage", "verdict", "held", "witnesses", "failed")

    def __init__(self, stage: int, witnesses: tuple[KnownGood, ...]) -> None:
        self.stage = stage
        self.verdict = Verdict.PENDING
        self.held: Parts = []
        self.witnesses = list(witnesses)  # run one at a time, while each fails
        self.failed: list[KnownGood] = []

    def settle(self, verdict: Verdict) -> Parts:
        """The probe gave ``verdict``: the parts that were held for it."""
        self.verdict, held, self.held = verdict, self.held, []
        return held


class ItemProbe:
    """The first item of a failed micro-batch, run alone: its failure is its request's.
    What waits for it: ``rest`` (the others of its one-request micro-batch) or ``trial``."""

    __slots__ = ("stage", "rest", "trial")

    def __init__(self, stage: int, rest: _MicroBatch | None, trial: Trial | None) -> None:
        self.stage = stage
        self.rest = rest
        self.trial = trial


class KnownGoodProbe:
    """``good``, an input ``trial.stage`` once served, replayed for ``trial``, a trial of
    ``until``'s: its failure is no request's."""

    __slots__ = ("trial", "good", "until")

    def __init__(self, trial: Trial, good: KnownGood, until: Batch) -> None:
        self.trial = trial
        self.good = good
        self.until = until

    @property
    def stage(self) -> int:
        return self.trial.stage


Probe = Union[ItemProbe, KnownGoodProbe]  # a runtime alias: "|" needs Python 3.10


class BatchRecord:
    """A batch's part in the stages' records: each breaker's successes at its start, the
    requests that failed a run of one item in each stage, and its trials by stage."""

    __slots__ = ("successes", "failed_alone", "trials")

    def __init__(self, breakers: list[StageBreaker]) -> None:
        self.successes = [breaker.successes for breaker in breakers]
        self.failed_alone: list[set[int]] = [set() for _ in breakers]
        self.trials: dict[int, Trial] = {}
