"""A batch's probes and its verdicts on the stages on trial, for ``ts_microbatch.core.
isolation``: data only, every field read and written under the isolator's lock (a probe's
marker is set before it is queued and read only by the thread running it)."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from .batch import Batch
from .breaker import KnownGood, StageBreaker
from .micro_batch import _MicroBatch

Parts = list[tuple[_MicroBatch, BaseException]]


class OwnProbe:
    """On the first item of a failed micro-batch of one request: the rest, waiting for it."""

    __slots__ = ("stage", "rest")

    def __init__(self, stage: int, rest: _MicroBatch | None) -> None:
        self.stage = stage
        self.rest = rest


class BrokenProbe:
    """On a batch's (``until``'s) one probe in a stage on trial or open. With a known-good
    input (``good``), the probe is that input in a private batch (its answer goes nowhere),
    ``rest`` the witnesses still to run should it fail and ``failed`` those that failed;
    otherwise the probe is the first item of the batch's failing micro-batch."""

    __slots__ = ("record", "stage", "until", "good", "rest", "failed")

    def __init__(
        self, record: BatchRecord, stage: int, until: Batch, witnesses: Sequence[KnownGood]
    ) -> None:
        self.record = record
        self.stage = stage
        self.until = until
        self.good: KnownGood | None = witnesses[0] if witnesses else None
        self.rest = list(witnesses[1:])
        self.failed: list[KnownGood] = []


class Verdict(enum.Enum):
    """A batch's verdict on a stage on trial or open, which its probe gives."""

    PENDING = "pending"  # its probe runs: the batch's parts failing there are held for it
    BROKEN = "broken"  # the probe failed there too: the batch's failures there fail whole
    ISOLATE = "isolate"  # the probe passed or failed otherwise: its failures are bisected


class BatchRecord:
    """A batch's part in the stages' records: each breaker's successes at its start, how
    many of its requests failed a run of one item there, and, while a breaker is on trial
    or open, the batch's verdict on its stage and the parts held for it."""

    __slots__ = ("successes", "failed_alone", "verdicts", "held")

    def __init__(self, breakers: Sequence[StageBreaker]) -> None:
        self.successes = [breaker.successes for breaker in breakers]
        self.failed_alone: list[set[int]] = [set() for _ in breakers]
        self.verdicts: dict[int, Verdict] = {}
        self.held: dict[int, Parts] = {}

    def settle(self, stage: int, verdict: Verdict) -> Parts:
        """``stage``'s probe gave ``verdict``: the parts that were held for it."""
        self.verdicts[stage] = verdict
        return self.held.pop(stage, [])
