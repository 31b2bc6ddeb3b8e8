"""An asynchronous TorchServe handler, without ts_microbatch: a body ``big`` gets an answer
of 200,000 bytes at once; any other ``ok`` after 4 s of awaited work."""

from __future__ import annotations

import asyncio
from typing import Any


class BigAsyncHandler:
    def initialize(self, context: Any) -> None:
        self.initialized = True

    async def handle(self, data: list[Any], context: Any) -> list[bytes]:
        bodies = [bytes(row.get("body") or row.get("data") or b"") for row in data]
        if b"big" in bodies:
            return [b"x" * 200_000] * len(data)
        await asyncio.sleep(4)
        return [b"ok"] * len(data)
