"""A text classification handler with micro-batching: UTF-8 text in, label probabilities out.

Tokens are hashed into buckets (zlib.crc32, stable across processes), so no vocabulary file
is needed. A body that is not UTF-8, or has no words, gets its own 400.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import InvalidInputError, MicroBatchingMixin

LABELS = ("negative", "positive")
VOCAB_BUCKETS = 2**16
WORD = re.compile(r"[a-z0-9']+")


class TextClassifierHandler(MicroBatchingMixin, BaseHandler):  # type: ignore[misc]
    def preprocess(self, data: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        ids: list[int] = []
        offsets: list[int] = []
        for row in data:
            body = row.get("data") or row.get("body") if isinstance(row, dict) else row
            if isinstance(body, (bytes, bytearray)):
                try:
                    body = body.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidInputError(f"the request body is not UTF-8 text ({exc})") from exc
            if not isinstance(body, str):
                raise InvalidInputError("send the text as the request body")
            words = WORD.findall(body.lower())
            if not words:
                raise InvalidInputError("the text has no words to classify")
            offsets.append(len(ids))
            ids.extend(zlib.crc32(w.encode()) % VOCAB_BUCKETS for w in words)
        return torch.tensor(ids, device=self.device), torch.tensor(offsets, device=self.device)

    def inference(
        self, data: tuple[torch.Tensor, torch.Tensor], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(*data)  # type: ignore[no-any-return]

    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        probs = torch.softmax(data, dim=1).tolist()
        return [dict(zip(LABELS, row)) for row in probs]
