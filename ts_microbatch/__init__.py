"""Micro-batching for TorchServe handlers: a pipeline that answers every request (by
``timeout_s``, else before TorchServe's responseTimeout) and isolates bad requests."""

from __future__ import annotations

from .batch import Batch, MicroBatchInfo, RequestFailure
from .config import MicroBatchingConfig, Parallelism, WarmupConfig, load_config
from .context import BatchContext
from .errors import (
    ConfigError,
    InvalidInputError,
    MicroBatchingError,
    PayloadTooLargeError,
    PipelineClosedError,
    PipelineStalledError,
    RequestError,
    RequestTimeoutError,
    StageOutputError,
    WarmupError,
)
from .metrics import PipelineObserver
from .micro_batching import MicroBatching
from .mixin import MicroBatchingMixin
from .pipeline import Pipeline, PipelineStats
from .status import error_status, status_code_for
from .torchserve_metrics import TorchServeMetricsObserver

__all__ = [
    "Batch",
    "BatchContext",
    "ConfigError",
    "InvalidInputError",
    "MicroBatchInfo",
    "MicroBatching",
    "MicroBatchingConfig",
    "MicroBatchingError",
    "MicroBatchingMixin",
    "Parallelism",
    "PayloadTooLargeError",
    "Pipeline",
    "PipelineClosedError",
    "PipelineStalledError",
    "PipelineObserver",
    "PipelineStats",
    "RequestError",
    "RequestFailure",
    "RequestTimeoutError",
    "StageOutputError",
    "TorchServeMetricsObserver",
    "WarmupConfig",
    "WarmupError",
    "error_status",
    "load_config",
    "status_code_for",
]

__version__ = "0.1.0"
