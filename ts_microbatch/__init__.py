"""Micro-batching for TorchServe handlers: a pipeline that answers every request (by
``timeout_s``, else before TorchServe's responseTimeout) and isolates bad requests.

Three wings:

* ``ts_microbatch.core``: the pipeline and everything it needs (stage threads, batches and
  their micro-batches, isolation, padding, the adaptive size, config, errors, the observer
  interface). It imports nothing from TorchServe.
* ``ts_microbatch.torchserve``: the adapter that runs inside a TorchServe worker
  (``MicroBatching``, the mixin, the pinned context, answers and status codes, KServe
  bodies, TorchServe metrics, compiled-model rules). ``core`` and ``torchserve`` are what a
  self-contained .mar vendors.
* ``ts_microbatch.tools``: what drives a server from outside (server, serve, scrape, tune,
  bundle); never imported in a worker.
"""

from __future__ import annotations

from .core.batch import Batch, RequestFailure
from .core.config import MicroBatchingConfig, Parallelism, WarmupConfig, load_config
from .core.errors import (
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
from .core.metrics import PipelineObserver
from .core.micro_batch import MicroBatchInfo
from .core.pipeline import Pipeline, PipelineStats
from .torchserve.context import BatchContext
from .torchserve.metrics import TorchServeMetricsObserver
from .torchserve.micro_batching import MicroBatching
from .torchserve.mixin import MicroBatchingMixin
from .torchserve.status import error_status, status_code_for

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
