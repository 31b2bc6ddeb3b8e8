"""``MicroBatchingMixin``: micro-batching for any ``BaseHandler`` subclass in one line.

    class MyHandler(MicroBatchingMixin, ImageClassifier):
        pass

``initialize`` validates the model's micro-batching config first (so a bad config fails
registration before the weights are loaded), then initializes the handler, then starts the
pipeline; ``handle`` runs batches through it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .config import MicroBatchingConfig, load_config
from .metrics import PipelineObserver
from .micro_batching import MicroBatching
from .torchserve_metrics import TorchServeMetricsObserver

logger = logging.getLogger(__name__)


class MicroBatchingMixin:
    """Put it first among the bases of a ``BaseHandler`` subclass."""

    micro_batching: MicroBatching | None = None

    def micro_batching_config(self, context: Any) -> MicroBatchingConfig:
        """The config to use; by default the model's micro_batching.json and model-config.yaml."""
        return load_config(
            context.system_properties.get("model_dir"),
            getattr(context, "model_yaml_config", None),
        )

    def micro_batching_observer(self, context: Any) -> PipelineObserver | None:
        """The observer the pipeline reports to: TorchServe's metrics when the context has them."""
        if getattr(context, "metrics", None) is None:
            return None
        return TorchServeMetricsObserver(context.metrics)

    def initialize(self, context: Any) -> None:
        warn_if_async_batches_break(context)
        config = self.micro_batching_config(context)
        # In the model log, so what a worker actually runs with is never a guess.
        logger.info("micro-batching config: %s", json.dumps(config.as_dict(), sort_keys=True))
        super().initialize(context)  # type: ignore[misc]
        if self.micro_batching is not None:
            self.micro_batching.shutdown()
        self.micro_batching = MicroBatching(
            self, config=config, observer=self.micro_batching_observer(context)
        )

    def handle(self, data: list[Any], context: Any) -> Any:
        if self.micro_batching is None:
            raise RuntimeError("handle() called before initialize(): the pipeline is not started")
        return self.micro_batching(data, context)


def warn_if_async_batches_break(context: Any) -> None:
    """Logs why an asynchronous worker with batchSize > 1 will fail, before it does.

    With ``asyncCommunication: true`` TorchServe 0.12's frontend (``AsyncBatchAggregator``)
    removes jobs from the map it is iterating when it polls more than one request, and the
    worker dies with a ConcurrentModificationException. Failing the load here would not
    help: the asynchronous frontend does not fail a registration whose worker dies at load,
    it retries forever. So this is a warning, naming the fix.
    """
    yaml_config = getattr(context, "model_yaml_config", None) or {}
    batch_size = (getattr(context, "system_properties", None) or {}).get("batch_size", 1)
    if yaml_config.get("asyncCommunication") is True and (batch_size or 1) > 1:
        logger.error(
            "asyncCommunication: true with batchSize %s: TorchServe 0.12's asynchronous "
            "frontend fails on batches of more than one request "
            "(ConcurrentModificationException in AsyncBatchAggregator). Set batchSize: 1 "
            "(requests are still awaited concurrently and share the pipeline), or remove "
            "asyncCommunication to let the frontend batch.",
            batch_size,
        )
