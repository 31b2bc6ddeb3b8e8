"""An asynchronous TorchServe handler, without ts_microbatch, that never answers a body
``hang`` (an await that never returns) and answers any other at once."""

from __future__ import annotations

import asyncio
from typing import Any


class HangAsyncHandler:
    def initialize(self, context: Any) -> None:
        self.initialized = True

    async def handle(self, data: list[Any], context: Any) -> list[bytes]:
        bodies = [bytes(row.get("body") or row.get("data") or b"") for row in data]
        if b"hang" in bodies:
            await asyncio.sleep(3600)
        return [b"ok"] * len(data)
