"""``MicroBatchingMixin``: micro-batching for any ``BaseHandler`` subclass in one line.

    class MyHandler(MicroBatchingMixin, ImageClassifier):
        pass

``initialize`` validates the model's micro-batching config first (so a bad config fails
registration before the weights are loaded), then initializes the handler, then starts the
pipeline and, with a ``warmup:`` setting, runs the warm-up through it before TorchServe
marks the worker ready; ``handle`` runs batches through it. A handler that loads its model
itself (``from_pretrained``: no serialized file for ``BaseHandler.initialize``) overrides
``initialize`` and ends it with ``start_micro_batching(context)``.

A compiled model (TorchServe's ``pt2:`` section makes ``self.model`` a ``torch.compile``d
module) gets one inference thread: a second is refused at load
(``ts_microbatch.torchserve.compiled`` says why).

A batch must be answered before TorchServe's ``responseTimeout``, or the frontend kills the
worker and every request of the batch fails: ``timeout_s`` null runs with 90% of it, and a
``timeout_s`` at or above it is refused at load (:func:`check_timeout`).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core.config import YAML_SECTION, MicroBatchingConfig, WarmupConfig, load_config
from ..core.errors import ConfigError
from ..core.metrics import PipelineObserver
from ._gc import freeze_loaded
from .compiled import check_inference_threads, is_compiled, recompile_limit
from .metrics import TorchServeMetricsObserver
from .micro_batching import MicroBatching
from .timeouts import DEFAULT_RESPONSE_TIMEOUT_S, default_timeout_s, response_timeout_s

logger = logging.getLogger(__name__)


class MicroBatchingMixin:
    """Put it first among the bases of a ``BaseHandler`` subclass."""

    micro_batching: MicroBatching | None = None
    _metrics_interval_s = 1.0  # the config's metrics_interval_s, set before the observer is made

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
        return TorchServeMetricsObserver(context.metrics, interval_s=self._metrics_interval_s)

    def initialize(self, context: Any) -> None:
        config = self._checked_config(context)  # a bad config fails before the weights load
        super().initialize(context)  # type: ignore[misc]
        self.start_micro_batching(context, config)

    def start_micro_batching(self, context: Any, config: MicroBatchingConfig | None = None) -> None:
        """Starts the pipeline (and the warm-up) for ``self``'s stages: the end of
        ``initialize``, callable on its own.

        A handler that loads its model itself instead of through ``BaseHandler.initialize``
        (which wants a serialized .pt/.pth file: a ``from_pretrained`` directory has none)
        overrides ``initialize``, sets ``self.model`` and calls this last.

        Raises:
            ConfigError: the model's micro-batching config is invalid.
        """
        if config is None:
            config = self._checked_config(context)
        compiled = is_compiled(getattr(self, "model", None))
        if compiled:
            check_compiled_config(config)
        if self.micro_batching is not None:
            self.micro_batching.shutdown()
        self._metrics_interval_s = config.metrics_interval_s
        self.micro_batching = pipeline = MicroBatching(
            self, config=config, observer=self.micro_batching_observer(context), compiled=compiled
        )
        if config.warmup is not None:
            self._warm_up(pipeline, context, config.warmup)
        if config.freeze_gc:
            freeze_loaded()

    def _checked_config(self, context: Any) -> MicroBatchingConfig:
        warn_if_async_batches_break(context)
        config = check_timeout(
            self.micro_batching_config(context), getattr(context, "model_yaml_config", None)
        )
        # In the model log, so what a worker actually runs with is never a guess.
        logger.info("micro-batching config: %s", json.dumps(config.as_dict(), sort_keys=True))
        warn_if_no_effect(config)
        return config

    def warmup_input(self) -> Any:
        """One request's input for warm-up when ``warmup.sample`` names no file; a handler
        that can make one (the image handler makes a JPEG) overrides this. A text handler
        with ``allowed_sequence_lengths`` defines ``warmup_input(self, length)``: a body whose
        ``item_length`` is ``length``, called once per allowed length."""
        raise ConfigError(
            f"{YAML_SECTION}.warmup.sample: not set, and {type(self).__name__} defines no "
            "warmup_input(): name a sample request body shipped in the .mar "
            "(torch-model-archiver --extra-files)"
        )

    def _warm_up_samples(self, context: Any, warmup: WarmupConfig) -> list[tuple[int | None, Any]]:
        """The request bodies warm-up runs, each with its bucket: the sample file, or the
        handler's input; with ``allowed_sequence_lengths``, one per length when
        ``warmup_input`` takes a length, so every (size, length) shape a compiled model can
        see is compiled at load (and, under a token budget, only those)."""
        buckets = (
            self.micro_batching.config.allowed_sequence_lengths if self.micro_batching else None
        )
        if warmup.sample is not None:
            if buckets:
                logger.warning(
                    "warm-up: warmup.sample is one request body, so of allowed_sequence_lengths "
                    "%s only its bucket is warmed up: to warm up every bucket, remove "
                    "warmup.sample and define warmup_input(self, length) in %s",
                    list(buckets),
                    type(self).__name__,
                )
            return [(None, {"body": bytearray(_read_sample(context, warmup.sample))})]
        if buckets and "length" in inspect.signature(self.warmup_input).parameters:
            samples = [self.warmup_input(length=length) for length in buckets]  # type: ignore[call-arg]
            self._check_sample_lengths(buckets, samples)
            return list(zip(buckets, samples))
        if buckets:
            logger.warning(
                "warm-up: %s.warmup_input() takes no length, so of allowed_sequence_lengths "
                "%s only the bucket of its one input is warmed up",
                type(self).__name__,
                list(buckets),
            )
        return [(None, self.warmup_input())]

    def _check_sample_lengths(self, buckets: Sequence[int], samples: list[Any]) -> None:
        """Warns when ``warmup_input(length=n)`` gave a body whose ``item_length`` falls in
        another bucket than n's (a tokenizer that adds [CLS] and [SEP]): that bucket would
        compile on the request path instead."""
        pipeline = self.micro_batching
        if pipeline is None:
            return
        for bucket, sample in zip(buckets, samples):
            try:
                measured = pipeline.item_length(sample)
            except Exception:  # the warm-up run reports an unreadable sample
                continue
            lands_in = next((b for b in buckets if b >= measured), None)
            if lands_in != bucket:
                logger.warning(
                    "warm-up: warmup_input(length=%d) gave an input of length %d, outside "
                    "that bucket: the bucket %d is not warmed up (item_length counts every "
                    "token the model sees, [CLS] and [SEP] included)",
                    bucket,
                    measured,
                    bucket,
                )

    def _warm_up(self, pipeline: MicroBatching, context: Any, warmup: WarmupConfig) -> None:
        try:
            # The config's sizes (those a micro-batch of its bucket can have) and iterations.
            seconds = sum(
                pipeline.warm_up(sample, sizes=pipeline.config.warmup_sizes(bucket))
                for bucket, sample in self._warm_up_samples(context, warmup)
            )
        except BaseException:
            pipeline.shutdown(wait=False, cancel_pending=True)
            raise
        startup_s = (getattr(context, "model_yaml_config", None) or {}).get("startupTimeout", 120)
        logger.info(
            "warm-up of sizes %s took %.1f s (startupTimeout %s s)",
            list(pipeline.config.warmup_sizes()),
            seconds,
            startup_s,
        )
        if pipeline.compiled is not None:
            logger.info(
                "warm-up compiled %d graphs on threads %s",
                pipeline.compiled.compiles,
                ", ".join(sorted(pipeline.compiled.compiled_on)) or "none",
            )
        if isinstance(startup_s, (int, float)) and seconds > startup_s / 2:
            logger.warning(
                "warm-up took %.1f s, over half of startupTimeout (%s s): raise startupTimeout "
                "in model-config.yaml, or keep TORCHINDUCTOR_CACHE_DIR on a volume that "
                "survives restarts so compiles are read from the cache",
                seconds,
                startup_s,
            )

    def handle(self, data: list[Any], context: Any) -> Any:
        if self.micro_batching is None:
            raise RuntimeError("handle() called before initialize(): the pipeline is not started")
        return self.micro_batching(data, context)

    handle.micro_batched = True  # type: ignore[attr-defined]  # skipped by plain_handle


def check_compiled_config(config: MicroBatchingConfig) -> None:
    """Refuses what a compiled model cannot run; warns about what makes it slow."""
    check_inference_threads(config.parallelism.inference)
    # With allowed sizes, the inference thread's recompile limit is raised to cover them
    # (CompiledInference.recompile_limit).
    if config.allowed_micro_batch_sizes is None:
        logger.warning(
            "compiled model without allowed_micro_batch_sizes: each new micro-batch size "
            "compiles on the request path (and past %d graphs the model runs eagerly)",
            recompile_limit(),
        )


def check_timeout(
    config: MicroBatchingConfig, model_yaml_config: Mapping[str, Any] | None
) -> MicroBatchingConfig:
    """``config`` with a ``timeout_s`` that ends a batch before TorchServe's responseTimeout.

    With ``timeout_s`` null it is 90% of responseTimeout, so ``handle()`` always returns,
    with a 504 for each request still unanswered, before the frontend gives up on the worker.

    Raises:
        ConfigError: ``timeout_s`` is at or above responseTimeout: the frontend would kill
            the worker first, failing every request of the batch and the ones queued behind.
    """
    response_s = response_timeout_s(model_yaml_config)
    if config.timeout_s is None:
        return replace(config, timeout_s=default_timeout_s(model_yaml_config))
    if config.timeout_s >= response_s:
        raise ConfigError(
            f"{YAML_SECTION}.timeout_s: got {config.timeout_s:g}, expected less than "
            f"TorchServe's responseTimeout ({response_s:g} s: model-config.yaml's, else "
            f"TorchServe's default {DEFAULT_RESPONSE_TIMEOUT_S} s): the frontend kills the "
            "worker at responseTimeout, failing every request of the batch; lower timeout_s "
            "or raise responseTimeout in model-config.yaml"
        )
    return config


def _read_sample(context: Any, name: str) -> bytes:
    model_dir = (getattr(context, "system_properties", None) or {}).get("model_dir") or "."
    path = os.path.join(model_dir, name)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(
            f"{YAML_SECTION}.warmup.sample: got {name!r}, cannot read {path} ({exc}); ship the "
            "file in the .mar with torch-model-archiver --extra-files"
        ) from exc


def warn_if_no_effect(config: MicroBatchingConfig) -> None:
    """Logs one warning naming the keys set that change nothing (``NO_EFFECT_KEYS``:
    ``max_window_ms``, ``max_latency_ms``), so a config written for continuous
    micro-batching, which was removed, loads without hiding that it no longer does anything."""
    keys = config.keys_without_effect()
    if keys:
        logger.warning(
            "%s: no effect (accepted so this config loads): continuous micro-batching was "
            "removed; the asynchronous worker runs each call's requests through the ordinary "
            "pipeline (docs/continuous.md)",
            ", ".join(f"{YAML_SECTION}.{key}" for key in keys),
        )


def warn_if_async_batches_break(context: Any) -> None:
    """Logs how TorchServe 0.12's asynchronous frontend will fail, before it does.

    With ``asyncCommunication: true`` its ``AsyncBatchAggregator``:

    * removes jobs from the map it is iterating when it polls more than one request, and the
      worker dies with a ConcurrentModificationException (batchSize > 1);
    * keeps every job it sent in ``jobs_in_backend`` for the life of the worker (a plain
      response never removes it) and reads that map from the Netty thread while its worker
      thread adds to it, unsynchronized: when the map grows past a resize threshold (1536
      jobs, then 3072, ...) under load, a response can miss its job, the frontend throws
      "Unexpected job in sendResponse()", drops the worker, and the requests in flight wait
      for their client's timeout. Reproduced with a handler without this package
      (docs/continuous.md).

    The package's Java agent fixes both in the frontend (ts_microbatch/agent/README.md); the
    worker cannot tell whether the frontend runs it.

    Failing the load would not help: the asynchronous frontend does not fail a registration
    whose worker dies at load, it retries forever. So these are logged, naming the fix.
    """
    yaml_config = getattr(context, "model_yaml_config", None) or {}
    if yaml_config.get("asyncCommunication") is not True:
        return
    batch_size = (getattr(context, "system_properties", None) or {}).get("batch_size", 1)
    if (batch_size or 1) > 1:
        logger.error(
            "asyncCommunication: true with batchSize %s: TorchServe 0.12's asynchronous "
            "frontend fails on batches of more than one request "
            "(ConcurrentModificationException in AsyncBatchAggregator) unless its frontend "
            "runs the package's Java agent (`python -m ts_microbatch.agent`; "
            "docs/continuous.md). Without it, set batchSize: 1 (each request is then a "
            "micro-batch of its own) or remove asyncCommunication.",
            batch_size,
        )
    logger.warning(
        "asyncCommunication: true: TorchServe 0.12's asynchronous frontend keeps every job "
        "in an unsynchronized map and, under load, drops the worker when that map resizes "
        "(about the 1536th request, then the 3072nd, ...; 'Unexpected job in "
        "sendResponse()' in ts_log.log), and the requests in flight time out. Load the "
        "package's Java agent in the frontend (`python -m ts_microbatch.agent` prints the "
        "config.properties line; its log says 'ts-microbatch-agent: patched') or serve "
        "production traffic on the synchronous worker (docs/continuous.md)."
    )
