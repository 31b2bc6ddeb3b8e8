"""ImageClassifier with micro-batching and a fault a test triggers per request (tests only).

A request whose body starts with ``HANG`` blocks its preprocess call forever, as a
decoder stuck on a pathological input would. The handler logs that the fault was entered,
so a test can prove it happened before asserting on the outcome.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatchingMixin

logger = logging.getLogger(__name__)

HANG = b"HANG"
ENTERED = "fault injected: preprocess hangs forever"


class FaultHandler(MicroBatchingMixin, ImageClassifier):  # type: ignore[misc]
    def preprocess(self, data: list[Any]) -> Any:
        for row in data:
            body = row.get("data") or row.get("body") if isinstance(row, dict) else row
            if isinstance(body, (bytes, bytearray)) and bytes(body[:4]) == HANG:
                logger.warning(ENTERED)
                threading.Event().wait()  # forever
        return super().preprocess(data)
