"""From a ``MicroBatchingConfig`` to a running pipeline, and what may change in place.

``new_pipeline`` builds the pipeline a config describes; ``apply_size`` is the one place a
micro-batch size gets in, at construction as at run time (the setter, ``configure()``), so
``"auto"`` means the same whenever it is set: a count chosen within
``min_micro_batch_size``..``max_micro_batch_size`` per batch, or, with lengths, a token
budget with at most ``max_micro_batch_size`` items. ``in_place`` says which changes a
running pipeline takes without being replaced.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..core.autobudget import AutoTokenBudget
from ..core.autosize import AutoMicroBatchSize
from ..core.calls import StageFn
from ..core.config import (
    NO_EFFECT_KEYS,
    STAGES,
    MicroBatchingConfig,
    Parallelism,
    check_micro_batch_size,
)
from ..core.metrics import PipelineObserver
from ..core.pipeline import Pipeline
from .status import is_input_error


def new_pipeline(
    stages: Mapping[str, StageFn],
    config: MicroBatchingConfig,
    observer: PipelineObserver,
    item_length: Callable[[Any], Any],
    item_shape: Callable[[Any], Any],
) -> Pipeline:
    """The pipeline ``config`` describes, running ``stages``."""
    pipeline = Pipeline(
        stages,
        parallelism=config.parallelism.as_dict(),
        max_queued_micro_batches=config.max_queued_micro_batches,
        isolate_failures=config.isolate_failures,
        join_timeout_s=config.join_timeout_s,
        observer=observer,
        allowed_sizes=config.allowed_micro_batch_sizes,
        padded_stages=padded_stages(config),
        is_input_error=is_input_error,
        lengths=config.length_rule(item_length),
        intra_op_threads=config.intra_op_threads.as_dict(),
        shape_rule=config.shape_rule(item_shape),
    )
    apply_size(pipeline, config.micro_batch_size, config)
    return pipeline


def apply_size(pipeline: Pipeline, size: Any, config: MicroBatchingConfig) -> None:
    """Puts ``size`` (an integer or "auto") in force on ``pipeline``, checked once against
    ``config``'s allowed sizes; "auto" within ``config``'s bounds, never the fixed size in
    force before.

    Raises:
        ConfigError: ``size`` is neither "auto" nor an integer >= 1 within the allowed sizes.
    """
    checked = check_micro_batch_size(size, config.allowed_micro_batch_sizes)
    if isinstance(checked, int):
        pipeline.token_budget = None
        pipeline.micro_batch_size = checked
        return
    auto = replace(config, micro_batch_size="auto")
    if auto.length_rule(body_length) is not None:
        # With lengths, the cut is by token budget, chosen per batch from measured costs.
        largest = auto.largest_micro_batch()
        pipeline.micro_batch_size = largest
        pipeline.token_budget = AutoTokenBudget(largest, config.max_micro_batch_tokens)
        return
    pipeline.token_budget = None
    pipeline.micro_batch_size = AutoMicroBatchSize(
        config.min_micro_batch_size,
        config.max_micro_batch_size,
        allowed_sizes=config.allowed_micro_batch_sizes,
    )


def in_place(old: MicroBatchingConfig, new: MicroBatchingConfig) -> bool:
    """Whether going from ``old`` to ``new`` changes only what a running pipeline changes
    in place: the size, the threads, ``on_recompile``, and the keys that change nothing
    (``NO_EFFECT_KEYS``)."""
    return _rest(old) == _rest(new)


def _rest(config: MicroBatchingConfig) -> MicroBatchingConfig:
    default = MicroBatchingConfig()
    return replace(
        config,
        micro_batch_size=1,
        parallelism=Parallelism(),
        on_recompile="warn",
        **{key: getattr(default, key) for key in NO_EFFECT_KEYS},
    )


def shape_count(config: MicroBatchingConfig) -> int | None:
    """The input shapes inference can see: allowed sizes x allowed sequence lengths; None
    when sizes are not bounded."""
    allowed = config.allowed_micro_batch_sizes
    if allowed is None:
        return None
    return len(allowed) * len(config.allowed_sequence_lengths or (None,))


def padded_stages(config: MicroBatchingConfig) -> tuple[str, ...] | None:
    """The stages that see only allowed sizes (ts_microbatch.core._padding): every stage when
    whole requests are padded, inference alone when the handler's tensors are."""
    if config.allowed_micro_batch_sizes is None:
        return None
    return ("inference",) if config.pad == "tensors" else STAGES


def body_length(item: Any) -> int:
    """The default length of an item: its body's size in bytes or characters (a TorchServe
    row's ``data`` or ``body``, or a KServe instance), JSON's length for other values."""
    body = item.get("data", item.get("body", item)) if isinstance(item, Mapping) else item
    if isinstance(body, (bytes, bytearray, str)):
        return len(body)
    try:
        return len(json.dumps(body, default=str))
    except (TypeError, ValueError):  # a value JSON cannot hold (a NaN key, a cycle)
        return len(str(body))
