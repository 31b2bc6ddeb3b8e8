"""BaseHandler with micro-batching for TinySeqNet: a request is a JSON list of token ids
(ints below 1000) or UTF-8 text of space-separated ids; the answer is the model's 3 logits.

Each micro-batch's rows are padded to its ``padded_length`` (with ``allowed_sequence_lengths``
the bucket over its longest item), so a compiled model sees only the warmed-up shapes; a
row longer than that (``truncate: true``) is cut to it."""

from __future__ import annotations

import json
import threading
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import InvalidInputError, MicroBatchingMixin

VOCAB = 1000
WARMUP_LENGTH = 8


def token_ids(item: Any) -> list[int]:
    """The token ids of one request row.

    Raises:
        InvalidInputError: the body is not a non-empty list of ids below 1000.
    """
    body = (item.get("data") or item.get("body")) if isinstance(item, dict) else item
    try:
        if isinstance(body, (bytes, bytearray)):
            body = body.decode("utf-8")
        if isinstance(body, str):
            text = body.strip()
            body = json.loads(text) if text.startswith("[") else [int(t) for t in text.split()]
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidInputError(f"expected token ids: {exc}") from exc
    if not isinstance(body, list) or not body:
        raise InvalidInputError("expected a non-empty list of token ids")
    for token in body:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < VOCAB:
            raise InvalidInputError(f"expected token ids in 0..{VOCAB - 1}, got {token!r}")
    return body


class TinySeqHandler(MicroBatchingMixin, BaseHandler):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        # For tests: the lengths each row had when it reached preprocess, and what it was
        # padded (or cut) to.
        self.seen: list[tuple[int, int]] = []
        self.shapes: list[tuple[int, ...]] = []  # the token ids' shape of each inference call
        self._lock = threading.Lock()

    def item_length(self, item: Any) -> int:
        return len(token_ids(item))

    def preprocess(self, data: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [token_ids(row) for row in data]
        info = self.micro_batching.current_micro_batch() if self.micro_batching else None
        padded = info.padded_length if info is not None else None
        length = padded or max(len(row) for row in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.bool)
        for i, row in enumerate(rows):
            row = row[:length]  # longer only with truncate: true
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = True
        with self._lock:
            self.seen.extend((len(row), length) for row in rows)
        return ids, mask

    def inference(self, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.shapes.append(tuple(data[0].shape))  # one inference thread: no lock needed
        with torch.inference_mode():
            return self.model(*data)  # type: ignore[no-any-return]

    def postprocess(self, data: torch.Tensor) -> list[list[float]]:
        return data.tolist()  # type: ignore[no-any-return]

    def warmup_input(self, length: int | None = None) -> dict[str, bytes]:
        count = WARMUP_LENGTH if length is None else length
        return {"body": " ".join(str((7 * i + 1) % VOCAB) for i in range(count)).encode()}
