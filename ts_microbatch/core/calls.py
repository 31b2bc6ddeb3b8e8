"""One stage call on a micro-batch, under the pipeline's contract for what goes in and out.

With allowed sizes, the padded stages see only those sizes: the input of the first padded
stage is padded to the next allowed size, the output of the last is cut back to the real
items (``ts_microbatch.core._padding``). The pipeline's last stage must return a list with
one output per row; a mismatch raises StageOutputError giving both counts. ``timed`` is
the call as a stage thread makes it: watched for a stuck call, reported to the observer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._checks import _sizes
from ._padding import pad, pad_rows, padded_range, padded_size, unpad
from .errors import StageOutputError
from .metrics import PipelineObserver
from .micro_batch import _MicroBatch, set_current_micro_batch
from .stages import StageWorkers

StageFn = Callable[[Any], Any]


def method_stage(owner: Any, name: str) -> StageFn:
    """A stage that calls ``owner``'s method ``name``, looked up on each call, so that an
    object may swap a stage method at run time (a test, a handler that reloads)."""
    return lambda data: getattr(owner, name)(data)


class StageCalls:
    """Calls the stages of a pipeline, padding where allowed sizes say.

    Args:
        stages: stage name to function, in pipeline order.
        allowed_sizes: the only micro-batch sizes ``padded_stages`` are called with.
        padded_stages: consecutive stages: the input of the first is padded to an allowed
            size, the output of the last is cut back to the real items.

    Raises:
        ConfigError: bad allowed sizes, or padded stages that are not consecutive ones.
    """

    def __init__(
        self,
        stages: Mapping[str, StageFn],
        allowed_sizes: Sequence[int] | None,
        padded_stages: Sequence[str] | None,
    ) -> None:
        self.names = list(stages)
        self._fns = [stages[name] for name in self.names]
        self._padded = padded_range(self.names, allowed_sizes, padded_stages)
        # Sorted; [] and [0, 4] refused too.
        self.allowed = _sizes(allowed_sizes, "micro_batching.allowed_micro_batch_sizes")

    def size(self, stage: int, n: int) -> int:
        """The rows stage ``stage`` is called with for a micro-batch of ``n`` items."""
        return padded_size(self.allowed, n) if stage in self._padded else n

    def __call__(
        self, stage: int, payload: Any, n: int, size: int, observer: PipelineObserver
    ) -> Any:
        """Calls the stage on ``payload`` (``n`` items), padded to ``size`` when it is the
        first padded stage; returns the output for the ``n`` items: cut back when it is the
        last padded stage, checked for one output per row when it is the pipeline's last."""
        padded, name = self._padded, self.names[stage]
        if padded and stage == padded.start:
            observer.on_padding(name, n, size)  # every micro-batch, so the metric gives a share
            if size != n and stage == 0:  # the requests themselves: a list by contract
                payload = pad_rows(list(payload), size)
            elif size != n:
                payload = pad(payload, n, size, f"{self.names[stage - 1]}'s output")
        output = self._fns[stage](payload)
        if stage == len(self.names) - 1:
            output = _check_outputs(name, output, size)
            return output if size == n else output[:n]
        if size != n and stage == padded[-1]:
            return unpad(output, n, size, f"{name}'s output")
        return output

    def timed(
        self, stage: int, mb: _MicroBatch, workers: StageWorkers, observer: PipelineObserver
    ) -> tuple[Any, int, float]:
        """Calls the stage on ``mb`` as its thread's micro-batch, watched for a stuck call and
        reported to ``observer`` whether it fails or not; returns the output, the size it was
        called with and the seconds it took. Raises what the call raised, once reported."""
        name = self.names[stage]
        size = self.size(stage, len(mb))
        started = time.monotonic()
        workers.begin_call(name, mb)
        # The call and its report see this micro-batch as the thread's: stage helpers read
        # its requests, metric lines carry its first request's id.
        set_current_micro_batch(mb.info(padding=size - len(mb)))
        failed = True
        try:
            try:
                output = self(stage, mb.payload, len(mb), size, observer)
                failed = False
            finally:
                workers.end_call()  # before the report: a call reported is over
                run_s = time.monotonic() - started
                # Guarded: it cannot raise, so the caller always carries out the outcome.
                observer.on_stage(name, len(mb), started - mb.enqueued_at, run_s, failed=failed)
        finally:
            set_current_micro_batch(None)
        return output, size, run_s


def _check_outputs(name: str, output: Any, expected: int) -> list[Any]:
    if not isinstance(output, list):
        raise StageOutputError(
            f"stage {name} returned {type(output).__name__}, expected a list of {expected} outputs"
        )
    if len(output) != expected:
        raise StageOutputError(
            f"stage {name} returned {len(output)} outputs for {expected} requests"
        )
    return output
