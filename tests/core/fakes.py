"""Fake stages for pipeline tests: milliseconds each, behaviour chosen per item."""

from __future__ import annotations

import random
import threading
import time
from typing import Any


class Bad(Exception):
    """What a fake stage raises for an item it is told to reject."""


class FakeHandler:
    """preprocess/inference/postprocess over integers; each can be told to fail on items.

    Items are ints; outputs are ``{"item": x, "value": x*10+1}``.
    """

    def __init__(self, jitter_s: float = 0.0, seed: int = 0) -> None:
        self.fail_on: dict[str, set[int]] = {
            "preprocess": set(),
            "inference": set(),
            "postprocess": set(),
        }
        self.always_fail: set[str] = set()
        self.jitter_s = jitter_s
        self.calls: dict[str, list[list[int]]] = {
            "preprocess": [],
            "inference": [],
            "postprocess": [],
        }
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.context: Any = None

    def _step(self, stage: str, items: list[int]) -> None:
        with self._lock:
            self.calls[stage].append(list(items))
            delay = self._rng.uniform(0, self.jitter_s)
        if delay:
            time.sleep(delay)  # induces reordering between threads; nothing asserts on time
        if stage in self.always_fail:
            raise RuntimeError(f"{stage} is broken")
        bad = self.fail_on[stage].intersection(items)
        if bad:
            raise Bad(f"{stage} rejects {sorted(bad)}")

    def preprocess(self, data: list[int]) -> list[int]:
        self._step("preprocess", data)
        return [x * 10 for x in data]

    def inference(self, batch: list[int]) -> list[int]:
        self._step("inference", [x // 10 for x in batch])
        return [x + 1 for x in batch]

    def postprocess(self, batch: list[int]) -> list[dict[str, int]]:
        self._step("postprocess", [x // 10 for x in batch])
        return [{"item": x // 10, "value": x} for x in batch]


def expected(items: list[int]) -> list[dict[str, int]]:
    return [{"item": x, "value": x * 10 + 1} for x in items]


def cause(result: Any) -> Any:
    """What a stage raised for ``result``: a failure shared by several requests answers in
    the server's words (``SharedFailureError``), caused by the stage's exception."""
    from ts_microbatch.core.errors import SharedFailureError

    return result.__cause__ if isinstance(result, SharedFailureError) else result
