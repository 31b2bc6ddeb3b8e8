"""What TorchServe's asynchronous worker (``asyncCommunication: true``) needs: knowing
that the caller is its event loop, one wake-up of that loop per answered batch, and a
predict that does not deep-copy the model's context for every request (``lean_predict``)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
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
    """Makes TorchServe's asynchronous worker cheaper per request for this process: its
    predict (``lean_predict``), its transport (``lean_receive_requests``,
    ``lean_call_predict``) and no log line per request received. Returns whether it did.

    Called while the model loads, before the worker wraps its service in ``AsyncService``,
    which binds ``ts.async_service.predict`` then. Only on the pinned release, and only
    over TorchServe's own functions (what someone else installed is left alone).
    """
    try:
        from ts import async_service
        from ts.version import __version__
    except ImportError:  # not in a TorchServe worker
        return False
    current = async_service.predict
    if current is lean_predict:
        return True
    service = async_service.AsyncService
    theirs = (current, service.receive_requests, service.call_predict)
    if __version__ != PINNED_TORCHSERVE or any(
        getattr(f, "__module__", "") != async_service.__name__ for f in theirs
    ):
        logger.info(
            "TorchServe %s: its asynchronous worker is kept as it is (lean_predict is for %s)",
            __version__,
            PINNED_TORCHSERVE,
        )
        return False
    async_service.predict = lean_predict
    service.receive_requests = lean_receive_requests
    service.call_predict = lean_call_predict
    logging.getLogger().addFilter(_no_received_line)
    logger.info(
        "asynchronous worker: requests read in large reads and handed to the event loop, "
        "responses sent from it, each context a shallow copy (lean_predict)"
    )
    return True


def lean_predict_installed() -> bool:
    """Whether this worker's predict is ``lean_predict`` (which leaves PredictionTime to the
    handler); TorchServe's own writes it for every request."""
    try:
        from ts import async_service
    except ImportError:
        return False
    return async_service.predict is lean_predict


def _no_received_line(record: logging.LogRecord) -> bool:
    """Drops TorchServe's "Backend received inference at" line: written to the root logger
    for each predict message, which on this worker is each request, and read back by the
    frontend line by line."""
    return not (record.name == "root" and record.msg == _RECEIVED_LINE)


_RECEIVED_LINE = "Backend received inference at: %d"  # ts.protocol.otf_message_handler


class _BufferedSocket:
    """``recv`` for TorchServe's message reader from a large buffered reader: a request of
    100 kB is read in a few system calls, not one per arriving piece, each of which takes
    the interpreter's lock back from the stage threads."""

    def __init__(self, sock: Any) -> None:
        self._file = sock.makefile("rb", buffering=1 << 20)

    def recv(self, length: int) -> bytes:
        data: bytes = self._file.read(length)
        return data  # b"" at end of stream: the reader exits as it does on a closed socket


def lean_receive_requests(self: Any) -> None:
    """``AsyncService.receive_requests`` reading through ``_BufferedSocket`` and handing each
    request straight to the event loop (TorchServe's goes through a queue and a batching
    thread that forms batches of one)."""
    from ts.protocol.otf_message_handler import retrieve_msg

    conn = _BufferedSocket(self.service.cl_socket)
    loop = self.loop
    while True:
        cmd, msg = retrieve_msg(conn)
        if cmd == b"I":
            loop.call_soon_threadsafe(_start_predict, self, msg)
        else:
            logger.debug("unexpected command %r", cmd)


def _start_predict(service: Any, msg: Any) -> None:
    service.loop.create_task(service.call_predict(msg))


async def lean_call_predict(self: Any, batch: Any) -> None:
    """``AsyncService.call_predict`` sending the response from the event loop itself
    (TorchServe's hands it to a sending thread through a coroutine run on this loop)."""
    response = await self.service.predict(batch)
    if response is not None:  # None on a rank other than 0
        self.service.cl_socket.sendall(response)


async def lean_predict(self: Any, batch: Any) -> Any:
    """``ts.async_service.predict`` of TorchServe 0.12.0 without what it costs per request
    for nothing: a deep copy of the model's whole context (manifest, model config, metrics
    cache), a debug ``print`` the frontend logs, and a PredictionTime metric line per
    request, which the frontend reads back (``MicroBatching`` writes it, and HandlerTime,
    once per micro-batch). Each request gets a shallow copy of the context instead, with its
    own request ids, request processors and metrics cache copy, which is all a request
    writes. The answers, statuses and errors are TorchServe's own."""
    from ts.handler_utils.utils import create_predict_response
    from ts.service import PredictionException, Service

    headers, input_batch, req_id_map = Service.retrieve_data_for_inference(batch)
    context = copy.copy(self.context)
    context.request_ids = req_id_map
    context.request_processor = headers
    context.cl_socket = self.cl_socket
    metrics = context.metrics = copy.copy(self.context.metrics)
    metrics.request_ids = req_id_map
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
    return create_predict_response(ret, req_id_map, "Prediction success", 200, context=context)
