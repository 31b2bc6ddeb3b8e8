"""TorchServe's own worker machinery, driven in-process: its model loader, Service.predict
and the binary response the frontend reads."""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.model_loader import TsModelLoader


def load_service(
    directory: Path,
    envelope: str | None = None,
    model_name: str = "drop_in",
    handler: str = "drop_in_handler.py",
    batch_size: int = 8,
) -> Any:
    """As the backend worker loads a model: TorchServe's default metrics cache, its loader."""
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    sys.path.insert(0, str(directory))
    try:
        service = TsModelLoader().load(
            model_name,
            str(directory),
            handler,
            None,
            batch_size,
            envelope,
            metrics_cache=metrics,
        )
    finally:
        sys.path.remove(str(directory))
    service.set_cl_socket(None)
    return service


def write_manifest(directory: Path, model_name: str, handler: str, **files: str) -> None:
    """``MAR-INF/MANIFEST.json`` as torch-model-archiver writes it, for a directory laid out
    as a .mar extracts; ``files`` are manifest keys such as ``serializedFile="m.pth"``."""
    (directory / "MAR-INF").mkdir()
    manifest = {"model": {"modelName": model_name, "handler": handler, **files}}
    (directory / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest), encoding="utf-8")


def request(i: int, body: Any, content_type: str = "image/jpeg") -> dict[str, Any]:
    return {
        "requestId": f"req-{i}".encode(),
        "parameters": [{"name": "body", "value": body, "contentType": content_type}],
    }


def decode(message: bytes) -> tuple[int, list[tuple[str, int, bytes]]]:
    """Reads a predict response as TorchServe's frontend does: (batch code, per request
    (request id, HTTP status, body))."""
    offset = 0

    def integer() -> int:
        nonlocal offset
        (value,) = struct.unpack_from("!i", message, offset)
        offset += 4
        return int(value)

    def chunk(length: int) -> bytes:
        nonlocal offset
        offset += length
        return bytes(message[offset - length : offset])

    code = integer()
    chunk(integer())  # batch message
    answers = []
    while (length := integer()) != -1:
        request_id = chunk(length).decode()
        chunk(integer())  # content type
        status = integer()
        chunk(integer())  # reason phrase
        for _ in range(integer()):  # response headers
            chunk(integer())
            chunk(integer())
        answers.append((request_id, status, chunk(integer())))
    return code, answers


def predict_message(request_id: int, body: bytes) -> bytes:
    """One predict command of one request, as the frontend writes it."""

    def chunk(data: bytes) -> bytes:
        return struct.pack("!i", len(data)) + data

    rid = str(request_id).encode()
    header = chunk(b"Content-Type") + chunk(b"application/octet-stream")
    parameter = chunk(b"body") + chunk(b"application/octet-stream") + chunk(body)
    end = struct.pack("!i", -1)
    return b"I" + chunk(rid) + header + end + parameter + end + end


class ResponseReader:
    """Reads whole responses off the frontend's end of a worker's socket."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = bytearray()

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.conn.recv(1 << 16)
            if not data:
                raise EOFError("the worker closed the socket")
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def integer(self) -> int:
        return int(struct.unpack("!i", self.take(4))[0])

    def response(self) -> int:
        """Reads one response; returns its number of answers."""
        self.integer()  # code
        self.take(self.integer())  # message
        answers = 0
        while (length := self.integer()) != -1:
            self.take(length)  # request id
            self.take(self.integer())  # content type
            self.integer()  # status
            self.take(self.integer())  # phrase
            for _ in range(self.integer()):
                self.take(self.integer())
                self.take(self.integer())
            self.take(self.integer())  # body
            answers += 1
        return answers
