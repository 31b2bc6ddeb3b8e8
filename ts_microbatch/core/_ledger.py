"""The isolator's bookkeeping: what it decides (``Outcome``) and what it keeps per batch
while it decides (``_Ledger``): bisection steps waiting for their halves (``_Split``), and
verdicts waiting for their lone probes (``_Pending``, ``_Alone``). Data only; the rules
that read and write it are ``ts_microbatch.core.isolation``'s."""

from __future__ import annotations

from typing import Any, NamedTuple

from .micro_batch import _MicroBatch


class Fail(NamedTuple):
    """Fail ``mb``'s items with the ``error`` raised in ``stage``; ``isolated`` when they
    all belong to one request that failed on its own."""

    mb: _MicroBatch
    error: BaseException
    stage: int
    isolated: bool


class Outcome(NamedTuple):
    rerun: list[_MicroBatch]  # to queue again at the first stage
    fail: list[Fail]
    # Set when a whole batch is judged systemic: fail every item of it not yet answered.
    fail_batch: Fail | None = None
    # To queue at the front of the first stage: a lone probe others wait for.
    first: tuple[_MicroBatch, ...] = ()


_NOTHING = Outcome([], [])
Key = tuple[int, type[BaseException]]  # (stage index, exception type)
# A pending verdict: a Key (the batch's, systemic), or a Key and a request (that request's
# own, when its halves failed alike).
PendingKey = tuple[Any, ...]
Parts = list[tuple[_MicroBatch, BaseException]]


class _Pending:
    """A verdict waiting for its lone probes: the failed parts held back, the pieces of the
    probed parts (not run since), whether the whole batch goes with them (the batch rule),
    how many requests must have failed alone alike, and the probes still out."""

    __slots__ = ("held", "unrun", "whole", "need", "probes", "origin")

    def __init__(
        self,
        held: Parts,
        unrun: Parts,
        whole: bool,
        need: int,
        probes: int,
        origin: tuple[_MicroBatch, BaseException],
    ) -> None:
        self.held = held
        self.unrun = unrun
        self.whole = whole
        self.need = need
        self.probes = probes
        self.origin = origin  # the failed part it began with: its batch and its error

    def parts(self) -> Parts:
        return [*self.held, *self.unrun]


class _Ledger:
    """The isolator's bookkeeping for one batch."""

    __slots__ = ("spans", "systemic", "first_run_failures", "alone_failed", "company", "pending")

    def __init__(self, spans: list[range]) -> None:
        self.spans = spans  # the item ranges of its micro-batches' first runs
        # The stage index -> exception type judged systemic for the batch.
        self.systemic: dict[int, type[BaseException]] = {}
        # How many first runs failed, by (stage index, exception type).
        self.first_run_failures: dict[Key, int] = {}
        # The requests whose item failed alone (a run of one item), by stage and type.
        self.alone_failed: dict[Key, set[int]] = {}
        # An item of a failed part passed alone where its company failed: no verdict.
        self.company: set[Key] = set()
        self.pending: dict[PendingKey, _Pending] = {}


class _Split:
    """One bisection step: a micro-batch that failed in ``stage`` with ``error_type``,
    waiting for the outcome of its two halves in that stage."""

    __slots__ = ("ledger", "stage", "error_type", "held", "within", "outcomes", "failed")

    def __init__(
        self,
        ledger: _Ledger,
        stage: int,
        error_type: type[BaseException],
        held: tuple[_MicroBatch, BaseException] | None = None,
        *,
        within: bool = False,
    ) -> None:
        self.ledger = ledger
        self.stage = stage
        self.error_type = error_type
        self.within = within  # halves of one request's items
        # Set on a probe: its sibling half and that half's error, waiting for the verdict.
        self.held = held
        self.outcomes = 0
        self.failed: Parts = []


class _Alone:
    """On a lone probe (one item of a failed part, run alone ahead of the queue): the
    verdict (``ledger.pending[key]``) its outcome in ``stage`` helps give or takes away."""

    __slots__ = ("ledger", "key", "stage")

    def __init__(self, ledger: _Ledger, key: PendingKey) -> None:
        self.ledger = ledger
        self.key = key  # its verdict's key in ``ledger.pending``
        self.stage: int = key[0]


def _merge(a: Outcome, b: Outcome) -> Outcome:
    if b is _NOTHING:
        return a
    if a is _NOTHING:
        return b
    return Outcome(
        a.rerun + b.rerun, a.fail + b.fail, a.fail_batch or b.fail_batch, a.first + b.first
    )
