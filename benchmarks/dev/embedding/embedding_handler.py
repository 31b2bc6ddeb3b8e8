"""A sentence embedding handler with micro-batching: ``{"text": ...}`` in, a unit vector out.

A request is a JSON object with a ``text`` string, sent as ``application/json`` or as raw
bytes. The text is lowercased, split on whitespace, each word cut into pieces of at most 6
characters and each piece hashed (crc32) to an id in 1..VOCAB-1; at most MAX_TOKENS pieces
are kept. The answer is ``{"embedding": [256 floats]}``, rounded to 6 decimals.

A body that is not JSON (or not UTF-8), has no ``text``, a ``text`` that is not a string or
one with no word gets its own 400 naming what is wrong; the other requests of its batch are
answered as they would be alone (rows are padded to the micro-batch's longest and the pad
masked out of attention and pooling).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import InvalidInputError, MicroBatchingMixin

# As in model.py (the test checks they agree): the handler is imported before the model.
VOCAB = 32768
MAX_TOKENS = 512
PIECE_CHARS = 6
DECIMALS = 6


class EmbeddingHandler(MicroBatchingMixin, BaseHandler):  # type: ignore[misc]
    def preprocess(self, data: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [tokenize(read_text(row)) for row in data]
        longest = max(len(ids) for ids in rows)
        ids = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return ids.to(self.device), (ids != 0).to(self.device)

    def inference(
        self, data: tuple[torch.Tensor, torch.Tensor], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        ids, mask = data
        with torch.inference_mode():
            return self.model(ids, mask)  # type: ignore[no-any-return]

    def postprocess(self, data: torch.Tensor) -> list[dict[str, list[float]]]:
        return [{"embedding": [round(v, DECIMALS) for v in row]} for row in data.float().tolist()]


def read_text(row: Any) -> str:
    """The ``text`` of one row: a plain body (bytes, str, or the object TorchServe parsed
    from JSON), or TorchServe's ``{"data" or "body": ...}`` around one.

    Raises:
        InvalidInputError: the body is not a JSON object with a ``text`` string.
    """
    body = row
    if isinstance(row, dict) and ("data" in row or "body" in row):
        body = row["data"] if row.get("data") is not None else row.get("body")
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"the request body is not UTF-8 JSON ({exc})") from exc
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError as exc:
            raise InvalidInputError(f"the request body is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise InvalidInputError(f'send a JSON object {{"text": "..."}}; got {type(body).__name__}')
    if "text" not in body:
        raise InvalidInputError(
            f'send a JSON object {{"text": "..."}}; got keys {sorted(map(str, body))[:5]}'
        )
    text = body["text"]
    if not isinstance(text, str):
        raise InvalidInputError(f'"text" must be a string; got {type(text).__name__}')
    return text


def tokenize(text: str) -> list[int]:
    """The token ids of ``text`` (at most MAX_TOKENS).

    Raises:
        InvalidInputError: the text has no word (empty or only whitespace).
    """
    ids = []
    for word in text.lower().split():
        for start in range(0, len(word), PIECE_CHARS):
            piece = word[start : start + PIECE_CHARS].encode("utf-8", errors="surrogatepass")
            ids.append(1 + zlib.crc32(piece) % (VOCAB - 1))
            if len(ids) == MAX_TOKENS:
                return ids
    if not ids:
        raise InvalidInputError('"text" has no words: send at least one')
    return ids
