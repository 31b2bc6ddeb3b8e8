"""A stage's record across batches: closed, or open (judged broken) for one exception type.

Inside a batch, ``ts_microbatch.core.isolation`` never judges a stage broken: it bisects a
failed micro-batch down to requests and each request down to one item run alone, so a
request that passes alone is never failed by what shares its batch, however many bad
requests there are. What keeps a broken model cheap is this state, which spans batches,
as a circuit breaker keeps it (Envoy's outlier detection: consecutive failures eject, a
success restores):

* **closed**: every run of one item that fails in the stage with an error that may be the
  model's (not a bad input's) adds to a streak of that exception type; a success in the
  stage (any micro-batch passing it) clears the streak, and so does a run of one item
  failing with another type (which starts its own);
* **opening**: at the end of a batch in which the stage served nothing and failed runs of
  one item of two requests or more, a streak of ``BROKEN_AFTER_FAILURES`` or more opens the
  breaker. Judged at the end of a batch, never in its middle, so a batch whose good
  requests pass (in whatever order the threads run them) never opens it; and never by
  batches of one request, which a breaker cannot make cheaper (a request alone is its own
  probe), so bad requests sent one at a time, as at night, never open it;
* **open**: the isolator fails a micro-batch that fails alike in the stage without
  bisecting it (500, the model's failure), after one probe per batch (an item run alone
  ahead of the queue) has failed alike too; the first success closes it again.

Counts only; the isolator calls every method under its lock except ``passed``.
"""

from __future__ import annotations

# Envoy's default for consecutive 5xx before ejecting a host: five runs of one item failing
# alike with nothing served in between, and a batch that served nothing to end it.
BROKEN_AFTER_FAILURES = 5


class StageBreaker:
    """The record of one stage."""

    __slots__ = ("successes", "error_type", "streak", "open")

    def __init__(self) -> None:
        # Bumped on every success without a lock: a batch compares it with its value at the
        # batch's start, and any change (even a lost increment of two racing ones) counts.
        self.successes = 0
        self.error_type: type[BaseException] | None = None  # the streak's type
        self.streak = 0  # runs of one item failing with error_type since the last success
        self.open = False

    def clear(self) -> None:
        self.error_type, self.streak, self.open = None, 0, False

    def failed_alone(self, error_type: type[BaseException]) -> None:
        """A run of one item failed with ``error_type`` (one that may be the model's)."""
        if error_type is not self.error_type:
            self.clear()
            self.error_type = error_type
        self.streak += 1

    def batch_done(self, successes_at_start: int, failed_alone: int) -> bool:
        """A batch ended: it failed runs of one item of ``failed_alone`` requests here, and
        this breaker's ``successes`` were ``successes_at_start`` at its start. True when this
        opened the breaker."""
        if (
            self.open
            or failed_alone < 2
            or self.successes != successes_at_start
            or self.streak < BROKEN_AFTER_FAILURES
        ):
            return False
        self.open = True
        return True

    def is_open(self, error_type: type[BaseException]) -> bool:
        return self.open and error_type is self.error_type
