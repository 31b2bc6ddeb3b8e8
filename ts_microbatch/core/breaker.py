"""A stage's record across batches: closed, on trial, or open (judged broken).

Inside a batch, ``ts_microbatch.core.isolation`` never judges a stage broken: it bisects a
failed micro-batch down to requests and each request down to one item run alone, so a
request that passes alone is never failed by what shares its batch, however many bad
requests there are. What keeps a broken model cheap is this state, which spans batches,
as a circuit breaker keeps it (Envoy's outlier detection: consecutive failures eject, a
success restores). **It judges the model, not the inputs on trial**: a stage is judged
broken only when an input it once served fails there alone (a load balancer's health
check hits a fixed path, not the failing user request). Failures of the inputs on trial,
however many and of whatever types, only put it on trial.

* **known-good inputs**: every micro-batch that gets through the stage leaves its first item
  (``KnownGood``: the item, its length or shape, and a private copy of its own request's
  row of the context, never its batch nor the batch's context), so it can run again alone
  as it ran then. The stage's witnesses are warm-up's sample, when there was one (user
  traffic never replaces it), and the last two items served, of two requests.
  A stage's input is the previous stage's output, so the known-good input of stage k is
  the first-stage item whose run stage k received in a call that passed; it runs from the
  first stage again, with its private context (what a stage writes there goes nowhere),
  and its answer goes nowhere. So a stage must be safe to run again on an input it served
  (replay-safe);
* **closed**: every run of one item that fails in the stage with an error that may be the
  model's (not a bad input's) adds to a streak, whatever its exception type (a feature
  store refusing some calls and timing out on others is one broken model); a success in
  the stage (any micro-batch passing it) clears the streak;
* **on trial**: at the end of a batch in which the stage served nothing and failed runs of
  one item of two requests or more, a streak of ``BROKEN_AFTER_FAILURES`` or more puts it
  on trial. Judged at the end of a batch, never in its middle, so a batch whose good
  requests pass (in whatever order the threads run them) never does; and never by batches
  of one request, which a breaker cannot make cheaper (a request alone is its own probe);
* **the probe**: on trial or open, the first micro-batch of a batch that fails in the stage
  with an error that may be the model's waits, with every other one of that batch failing
  there, for the batch's probe run alone ahead of the queue: its witnesses in turn, until
  one gets through. Every witness failing alone in the stage with an error that may be the
  model's, two or more of them or warm-up's sample as the only one, opens the breaker (the
  model fails what it served) and what waited fails whole (500, in the server's words:
  ``Isolator._shared``); one getting through closes it (the failures were the inputs'), and
  what waited is isolated by the rule. A witness that failed with no verdict (one failing
  where another passed, warm-up's sample included: a sample or a replayed request goes
  stale when the row it looks up is deleted; the only request served failing) is known-good
  no longer; so is one whose probe timed out;
* **open**: judged broken, it stays so until the first success closes it; each batch pays
  one call per micro-batch and its probe (one to three witnesses).

**With no known-good input** (the stage has passed nothing since the pipeline started:
no warm-up, and every call so far failed; or the only request it served failed its replay,
and it has served nothing since), there is nothing to judge the model with, and
the breaker behaves as before known-good inputs: the verdict at a batch's end opens it at
once, and the probe is the first item of the failing micro-batch, an input on trial. So a
model broken from load still costs one call per micro-batch and a probe per batch from its
second batch on; the price is the one exposure left: before the stage's first success since
load, after a batch of two or more bad requests failing five runs of one item, a good
request that shares a failing micro-batch with a bad first item fails with it (500). Its
first success, of any request, gives it a known-good input and closes it.

Counts only; the isolator calls every method under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from .batch import Batch
from .micro_batch import _MicroBatch
from .order import Order, Shape

# Envoy's default for consecutive 5xx before ejecting a host: five runs of one item failing
# with nothing served in between, and a batch that served nothing to end it.
BROKEN_AFTER_FAILURES = 5

logger = logging.getLogger(__name__)

CLOSED, ON_TRIAL, OPEN = "closed", "on trial", "open"


class KnownGood(NamedTuple):
    """An item a stage served (the first item of a micro-batch that got through it) with
    only what it needs to run alone as it ran then: its length or shape, and its own row
    of its batch's context, copied (``private_row``). Never its batch, nor its context."""

    item: Any
    source: tuple[int, int]  # (its batch's id, its request): one request is one witness
    warm: bool  # warm-up's sample: the operator's input, never a replayed user request
    lengths: tuple[int, ...] | None
    pad_length: Callable[[int], int]
    shapes: tuple[Shape | None, ...] | None
    context: Any  # its request's row alone: reads as it did, writes go nowhere

    @classmethod
    def of(cls, mb: _MicroBatch) -> KnownGood:
        """The first item of ``mb``, which got through a stage; a replay stays the input it
        replays (served or warm-up's), in every stage it passes: its private batch is quiet,
        yet not warm-up's."""
        if mb.batch.replays is not None:
            return mb.batch.replays  # type: ignore[no-any-return]
        if mb.witness is None:  # made at the first stage it passes, kept for the others
            mb.witness = cls._made(mb)
        return mb.witness  # type: ignore[no-any-return]

    @classmethod
    def _made(cls, mb: _MicroBatch) -> KnownGood:
        batch, at = mb.batch, range(mb.offset, mb.offset + 1)
        order = batch.order
        (request,) = order.requests_at(at)
        return cls(
            mb.items[0],
            (id(batch), request),
            batch.quiet,
            order.lengths_at(at),
            order.pad_length,
            order.shapes_at(at),
            private_row(batch.context, request),
        )

    def micro_batch(self) -> _MicroBatch:
        """The item alone, in a private batch of its own that nobody awaits (quiet: no
        metrics), as a probe: its one row is request 0 of its private context."""
        own = Order(1, lengths=self.lengths, pad_length=self.pad_length, shapes=self.shapes)
        batch = Batch(1, self.context, quiet=True, order=own)
        batch.replays = self
        return _MicroBatch(batch, 0, 0, [self.item])


def private_row(context: Any, request: int) -> Any:
    """The probe's own context: ``context.private_row(request)`` when the context offers it
    (the adapter's ``BatchContext``: that request's id and headers, its status and response
    headers written nowhere); otherwise None, since the core cannot copy a context it does
    not know, and a probe must never write into a batch that may still be in flight."""
    copy = getattr(context, "private_row", None)
    return copy(request) if callable(copy) else None


class StageBreaker:
    """The record of one stage."""

    __slots__ = ("successes", "warm", "served", "streak", "state")

    def __init__(self) -> None:
        self.successes = 0  # every success; a batch compares it with its value at its start
        # The known-good inputs:
        self.warm: KnownGood | None = None  # warm-up's sample, replaced by warm-up only
        self.served: tuple[KnownGood, ...] = ()  # the last two served, of two requests
        self.streak = 0  # runs of one item failed, of any type, since the last success
        self.state = CLOSED

    @property
    def open(self) -> bool:
        """Judged broken."""
        return self.state == OPEN

    @property
    def suspect(self) -> bool:
        """On trial or open: a failing micro-batch waits for a probe."""
        return self.state != CLOSED

    def success(self, good: KnownGood) -> bool:
        """``good``'s micro-batch got through the stage: it is kept, counted, and the stage
        closed. True when it was open (judged broken) until now."""
        was_open = self.open
        self.keep(good)
        self.successes += 1
        self.clear()
        return was_open

    def keep(self, good: KnownGood) -> None:
        """``good`` got through the stage."""
        if good.warm:
            self.warm = good
            return
        served = self.served
        if served and served[0].source == good.source:
            self.served = (good, *served[1:])
        else:
            self.served = (good, *served[:1])

    def witnesses(self) -> tuple[KnownGood, ...]:
        """The known-good inputs a probe runs, in turn until one gets through: warm-up's
        sample first when there is one, then the last two served (newest first)."""
        warm = self.warm
        return ((warm,) if warm is not None else ()) + self.served

    def forget(self, good: KnownGood) -> None:
        """``good`` is known-good no longer."""
        if self.warm is good:
            self.warm = None
        self.served = tuple(g for g in self.served if g is not good)

    def clear(self) -> None:
        """A success in the stage."""
        self.streak, self.state = 0, CLOSED

    def failed_alone(self) -> None:
        """A run of one item failed with an error that may be the model's."""
        self.streak += 1

    def batch_done(self, successes_at_start: int, failed_alone: int) -> str | None:
        """A batch ended: it failed runs of one item of ``failed_alone`` requests here, and
        this breaker's ``successes`` were ``successes_at_start`` at its start. The state it
        entered (``ON_TRIAL``, or ``OPEN`` without a known-good input), or None."""
        if (
            self.state != CLOSED
            or failed_alone < 2
            or self.successes != successes_at_start
            or self.streak < BROKEN_AFTER_FAILURES
        ):
            return None
        self.state = ON_TRIAL if self.witnesses() else OPEN
        return self.state

    def probe_failed(self) -> bool:
        """The batch's probe failed in the stage with an error that may be the model's: open.
        True when this opened it (the known-good input failed: a verdict)."""
        opened = self.state != OPEN
        self.state = OPEN
        return opened


def log_judged(name: str, state: str, streak: int) -> None:
    """Logs the state stage ``name`` entered at a batch's end (``StageBreaker.batch_done``)."""
    if state == ON_TRIAL:
        logger.warning(
            "stage %s on trial: %d runs of one item failed and it served nothing in between; "
            "its next failing micro-batch waits for its known-good input run alone",
            name,
            streak,
        )
    elif state == OPEN:
        logger.error(
            "stage %s judged broken: %d runs of one item failed and it has served nothing "
            "since the pipeline started (no known-good input to test it with); its "
            "micro-batches that fail now fail whole after one probe per batch, until it "
            "serves again",
            name,
            streak,
        )
