"""What TorchServe's asynchronous worker (``asyncCommunication: true``) needs: knowing
that the caller is its event loop, and one wake-up of that loop per answered batch."""

from __future__ import annotations

import asyncio
import contextlib


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
