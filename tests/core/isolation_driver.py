"""Drives the isolator as the pipeline does, without threads.

``Drive`` keeps one ``Isolator`` across batches (its breakers span them) and carries out
every outcome with the pipeline's own ``Outcomes`` (a probe at the front of the queue,
re-runs at its back, a failed request's other items answered). A micro-batch taken from the
queue runs through the stages in order; ``fails(stage, items)`` says whether a stage call
fails, so a failure can depend on an item alone (a bad input) or on its company (images of
two sizes stacked: ``mixed``). Items are their indices in the batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from ts_microbatch.core.batch import Batch, RequestFailure
from ts_microbatch.core.errors import RequestError
from ts_microbatch.core.isolation import Isolator
from ts_microbatch.core.micro_batch import _MicroBatch, cut
from ts_microbatch.core.outcomes import Outcomes

Fails = Callable[[int, list[int]], bool]


class Boom(Exception):
    """A stage error with no 4xx meaning: it may count towards a broken stage."""


def mixed(items: Sequence[int]) -> bool:
    """Stands for "images of two sizes stacked": an item's parity is its size."""
    return len({item % 2 for item in items}) > 1


def owners_of(sizes: Sequence[int]) -> list[int]:
    return [request for request, n in enumerate(sizes) for _ in range(n)]


class Drive:
    def __init__(
        self,
        fails: Fails,
        *,
        stages: int = 2,
        first_stage_served: bool = False,
        input_errors: bool = False,
    ) -> None:
        self.fails = fails
        self.stages = stages
        self.input_errors = input_errors  # fail with RequestError (a bad input) instead
        self.isolator = Isolator([f"stage{i}" for i in range(stages)])
        self.isolator.first_stage_served = first_stage_served
        self.outcomes = Outcomes(self.isolator._names, self.isolator, self._enqueue)
        self.queue: list[_MicroBatch] = []
        self.calls: list[tuple[int, list[int]]] = []

    def _enqueue(self, stage: int, mb: _MicroBatch, front: bool = False) -> None:
        assert stage == 0  # outcomes re-run from the first stage
        if front:
            self.queue.insert(0, mb)
        else:
            self.queue.append(mb)

    def batch(
        self, sizes: Sequence[int], micro_batch_size: int, rng: random.Random | None = None
    ) -> Result:
        """Runs one batch of requests of ``sizes`` items until nothing is queued, taking
        the queue in ``rng``'s order (queue order when None: one thread per stage)."""
        owners = owners_of(sizes)
        batch = Batch(len(owners), owners=owners)
        self.isolator.track(batch)
        calls_before = len(self.calls)
        self.queue.extend(cut(batch, list(range(len(owners))), micro_batch_size))
        while self.queue:
            mb = self.queue.pop(rng.randrange(len(self.queue)) if rng else 0)
            self._run(mb)
        return Result(batch, owners, self.calls[calls_before:])

    def _run(self, mb: _MicroBatch) -> None:
        for stage in range(self.stages):
            if mb.answered():
                self.outcomes.dropped(mb)
                return
            items = list(mb.items)
            self.calls.append((stage, items))
            if self.fails(stage, items):
                error: Exception = Boom(f"stage {stage}: {items}")
                if self.input_errors:
                    error = RequestError(f"bad input in {items}")
                self.outcomes.stage_failed(stage, mb, error)
                return
            self.outcomes.passed(mb, stage)
        self.outcomes.finish(mb.batch, mb.indices, outputs=list(mb.items))


class Result:
    def __init__(self, batch: Batch, owners: list[int], calls: list[tuple[int, list[int]]]):
        self.batch = batch
        self.owners = owners
        self.calls = calls

    @property
    def runs(self) -> int:
        """Runs from the first stage: first runs, halves and probes."""
        return sum(1 for stage, _ in self.calls if stage == 0)

    def calls_in(self, stage: int) -> int:
        return sum(1 for s, _ in self.calls if s == stage)

    def failed_requests(self) -> set[int]:
        failed = set()
        for item, owner in enumerate(self.owners):
            outcome = self.batch.outcome(item)
            assert outcome is not None, f"item {item} never answered"
            if outcome.error is not None:
                failed.add(owner)
        return failed

    def failures(self) -> list[RequestFailure]:
        """Where each failed item failed (items not run for a sibling have none)."""
        return [f for item in range(len(self.owners)) if (f := self.batch.failure(item))]

    def ran(self, stage: int, items: list[int]) -> bool:
        return (stage, items) in self.calls
