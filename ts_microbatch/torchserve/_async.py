"""What TorchServe's asynchronous worker (``asyncCommunication: true``) needs: knowing
that the caller is its event loop, one wake-up of that loop per answered batch, and a
predict that does not deep-copy the model's context for every request (``lean_predict``)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


def in_event_loop() -> bool:
    """Whether the calling thread runs an asyncio event loop (the asynchronous worker)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def call_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    """Resolves ``future`` on its loop's thread (one wake-up of the loop per batch)."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it
        loop.call_soon_threadsafe(_resolve_once, future)


def _resolve_once(future: asyncio.Future[None]) -> None:
    if not future.done():  # cancelled when handle_async's caller gave up
        future.set_result(None)


# -- TorchServe's asynchronous predict, made cheap -------------------------------------------

# The TorchServe whose ``ts.async_service.predict`` ``lean_predict`` replaces: what it does
# per request was read from that release, so another one keeps its own.
PINNED_TORCHSERVE = "0.12.0"


def install_lean_predict() -> bool:
    """Makes TorchServe's asynchronous worker use ``lean_predict`` for this process;
    returns whether it does.

    Called while the model loads, before the worker wraps its service in ``AsyncService``,
    which binds ``ts.async_service.predict`` then. Only on the pinned release, and only
    over TorchServe's own function (a predict someone else installed is left alone).
    """
    try:
        from ts import async_service
        from ts.version import __version__
    except ImportError:  # not in a TorchServe worker
        return False
    current = async_service.predict
    if current is lean_predict:
        return True
    if (
        __version__ != PINNED_TORCHSERVE
        or getattr(current, "__module__", "") != async_service.__name__
    ):
        logger.info(
            "TorchServe %s: its asynchronous predict is kept (lean_predict is for %s)",
            __version__,
            PINNED_TORCHSERVE,
        )
        return False
    async_service.predict = lean_predict
    logger.info("asynchronous worker: each request's context is a shallow copy (lean_predict)")
    return True


async def lean_predict(self: Any, batch: Any) -> Any:
    """``ts.async_service.predict`` of TorchServe 0.12.0 without what it costs per request
    for nothing: a deep copy of the model's whole context (manifest, model config, metrics
    cache) and a debug ``print`` the frontend logs. Each request gets a shallow copy
    instead, with its own request ids, request processors and metrics cache copy, which is
    all a request writes. The answers, statuses and errors are TorchServe's own."""
    from ts.handler_utils.utils import create_predict_response
    from ts.service import PREDICTION_METRIC, PredictionException, Service

    headers, input_batch, req_id_map = Service.retrieve_data_for_inference(batch)
    context = copy.copy(self.context)
    context.request_ids = req_id_map
    context.request_processor = headers
    context.cl_socket = self.cl_socket
    metrics = context.metrics = copy.copy(self.context.metrics)
    metrics.request_ids = req_id_map
    start = time.time()
    try:
        ret = await self._entry_point(input_batch, context)
    except MemoryError:
        logger.error("System out of memory", exc_info=True)
        return create_predict_response(None, req_id_map, "Out of resources", 507)
    except PredictionException as e:
        logger.error("Prediction error", exc_info=True)
        return create_predict_response(None, req_id_map, e.message, e.error_code)
    except Exception as exc:
        logger.warning("Invoking custom service failed.", exc_info=True)
        out_of_memory = "CUDA" in str(exc)
        message, code = ("Out of resources", 507) if out_of_memory else ("Prediction failed", 503)
        return create_predict_response(None, req_id_map, message, code)
    if not isinstance(ret, list) or len(ret) != len(input_batch):
        logger.warning(
            "model: %s, invalid output for %d requests", context.model_name, len(input_batch)
        )
        return create_predict_response(None, req_id_map, "Invalid model predict output", 503)
    metrics.add_time(PREDICTION_METRIC, round((time.time() - start) * 1000, 2))
    return create_predict_response(ret, req_id_map, "Prediction success", 200, context=context)
