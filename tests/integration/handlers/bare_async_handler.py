"""A bare asynchronous TorchServe handler, without ts_microbatch: what any user of
``asyncCommunication: true`` writes (a streaming LLM handler has the same shape). 2 ms of
awaited work per request, an answer per row."""

from __future__ import annotations

import asyncio
from typing import Any


class BareAsyncHandler:
    def initialize(self, context: Any) -> None:
        self.initialized = True

    async def handle(self, data: list[Any], context: Any) -> list[bytes]:
        await asyncio.sleep(0.002)
        return [b"ok"] * len(data)
