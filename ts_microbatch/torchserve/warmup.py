"""Warm-up: micro-batches of chosen sizes run at load, before the worker is ready.

Through the pipeline's own threads, so the inference thread that will serve is the one that
compiles (``torch.compile``, a fixed-shape model); warm-up batches are reported to no
metric and to no automatic size. With allowed sizes, one micro-batch that gets padded is
compared with the same input unpadded: padding that mistook a dimension for the batch is
refused at load, before the worker serves wrong answers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from ..core._padding import same_answer
from ..core.config import MicroBatchingConfig
from ..core.errors import WarmupError
from ..core.pipeline import Pipeline
from ._submission import unpack
from .compiled import CompiledInference
from .status import exception_text

logger = logging.getLogger(__name__)


class WarmUp:
    """Warm-up runs on ``pipeline`` as ``config`` says; ``compiled`` counts the compiles."""

    def __init__(
        self,
        pipeline: Pipeline,
        config: MicroBatchingConfig,
        compiled: CompiledInference | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.config = config
        self.compiled = compiled

    def run(
        self, sample: Any, sizes: Sequence[int] | None = None, iterations: int | None = None
    ) -> float:
        """Runs ``iterations`` micro-batches of each size, made of ``sample``'s items
        (read as a request's are: a KServe body gives its instances, repeated to fill a
        micro-batch; a plain body is one item), through the pipeline's own threads, so the
        inference thread that will serve is the one that compiles; returns the seconds it
        took. Warm-up batches are not reported to metrics or to the automatic size.

        Args:
            sample: one request's row, as TorchServe passes it.
            sizes: the sizes to run; the config's ``warmup_sizes()`` when None.
            iterations: runs of each size; the config's ``warmup.iterations`` (else 1) when None.

        Raises:
            WarmupError: ``sample`` is a malformed KServe body, or a warm-up run failed
                (names the size and chains the error).
        """
        items = self._items(sample)
        sizes = tuple(sizes) if sizes is not None else self.config.warmup_sizes()
        if iterations is None:
            warmup = self.config.warmup
            iterations = warmup.iterations if warmup is not None else 1
        started = time.monotonic()
        warming = self.compiled.warming_up() if self.compiled else contextlib.nullcontext()
        with warming:
            for size in sizes:
                self._size(items, size, iterations)
            self._check_padding(items[0], sizes)
        return time.monotonic() - started

    def _items(self, sample: Any) -> list[Any]:
        """The pipeline items of ``sample``, unpacked as ``handle`` unpacks a request."""
        requests, items = unpack([sample], self.config.kserve)
        error = requests[0].error if requests else None
        if error is not None or not items:
            raise WarmupError(
                f"warm-up: the sample cannot be read as a request: {error or 'no instances'}"
            ) from error
        return items

    def _check_padding(self, sample: Any, sizes: tuple[int, ...]) -> None:
        """Runs a micro-batch that gets padded and compares each answer with the answer of
        the same input unpadded: padding that mistook a dimension for the batch (``pad:
        tensors`` on a flat tensor) is refused here, before the worker serves wrong answers.

        Raises:
            WarmupError: the padded run failed or answered differently.
        """
        n = self.config.padded_check_size(sizes)
        if n is None:
            if self.config.allowed_micro_batch_sizes is not None:
                logger.warning(
                    "warm-up: no size of %s is reached by padding, so padding was not checked",
                    list(sizes),
                )
            return
        size = self.config.padded_size(n)
        unpadded = self._answers([sample], size)[0]
        for row, answer in enumerate(self._answers([sample], n)):
            if not same_answer(answer, unpadded):
                raise WarmupError(
                    f"warm-up: a micro-batch of {n} padded to {size} answered row {row} "
                    f"differently from the same input unpadded (pad: {self.config.pad}); with "
                    "pad: tensors every part of preprocess's and inference's outputs must be "
                    "batch-major: use pad: requests"
                )
        logger.info("warm-up: a micro-batch of %d padded to %d answered as unpadded", n, size)

    def _answers(self, items: Sequence[Any], size: int) -> list[Any]:
        """The answers of one micro-batch of ``size`` made of ``items``, repeated in turn."""
        rows = [items[i % len(items)] for i in range(size)]
        batch = self.pipeline.submit_batch(rows, micro_batch_size=size, quiet=True)
        batch.wait()
        outcomes = [batch.outcome(item) for item in range(len(batch))]
        errors = [o.error for o in outcomes if o is not None and o.error is not None]
        if errors:
            raise WarmupError(
                f"warm-up with a micro-batch of {size} failed: "
                f"{type(errors[0]).__name__}: {exception_text(errors[0])}"
            ) from errors[0]
        return [o.value if o is not None else None for o in outcomes]

    def _size(self, items: Sequence[Any], size: int, iterations: int) -> None:
        started = time.monotonic()
        for _ in range(iterations):
            self._answers(items, size)
        logger.info(
            "warm-up: %d x micro-batch of %d in %.2f s",
            iterations,
            size,
            time.monotonic() - started,
        )
