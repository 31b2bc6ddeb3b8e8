"""BaseHandler with micro-batching for TinyNet: a request is a JSON list of 16 numbers, the
answer the model's 4 outputs. The model is compiled by TorchServe's ``pt2:`` section."""

from __future__ import annotations

import json
import threading
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import InvalidInputError, MicroBatchingMixin


class TinyHandler(MicroBatchingMixin, BaseHandler):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.postprocessed: list[int] = []  # sizes postprocess was called with, for tests
        self._lock = threading.Lock()

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        rows = []
        for row in data:
            body = row.get("data") or row.get("body")
            try:
                values = json.loads(body) if isinstance(body, (bytes, bytearray)) else body
                rows.append(torch.tensor(values, dtype=torch.float32).reshape(16))
            except (TypeError, ValueError, RuntimeError) as exc:
                raise InvalidInputError(f"expected a JSON list of 16 numbers ({exc})") from exc
        return torch.stack(rows)

    def postprocess(self, data: torch.Tensor) -> list[list[float]]:
        with self._lock:
            self.postprocessed.append(len(data))
        return data.tolist()  # type: ignore[no-any-return]

    def warmup_input(self) -> dict[str, bytes]:
        return {"body": json.dumps([0.5] * 16).encode()}
