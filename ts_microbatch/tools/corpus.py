"""Request bodies read from a corpus, and the one fixed order every run sends them in.

A corpus is a directory of bodies (the content type from each extension) or a ``.jsonl``
file (a string a text body, an object a JSON body); a single file is a corpus of one.
Requests take the bodies in an order shuffled from a seed, so every run, config and the
tuner's in-process batches see the same sequence, and a mix is measured as a mix.
"""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

# TorchServe hands text/* to the handler as str and application/json parsed.
CONTENT_TYPES = {
    ".txt": "text/plain",
    ".json": "application/json",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
}
OCTET_STREAM = "application/octet-stream"
DEFAULT_SEED = 0


class CorpusError(ValueError):
    """A corpus cannot be read: missing, empty, or a line that is not a body."""


class Body(NamedTuple):
    """One request body: what it is called, its bytes and the content type it is sent with."""

    name: str
    data: bytes
    content_type: str

    @property
    def is_text(self) -> bool:
        return self.content_type.startswith("text/") or self.content_type == "application/json"

    @property
    def length(self) -> int:
        """Characters for a text or JSON body, bytes for anything else."""
        return len(self.data.decode("utf-8", errors="replace")) if self.is_text else len(self.data)

    def torchserve_value(self) -> Any:
        """The body as TorchServe's worker hands it to the handler (``data[i]["body"]``);
        bytes when decoding fails, as there."""
        try:
            if self.content_type == "application/json":
                return json.loads(self.data.decode("utf-8"))
            if self.content_type.startswith("text"):
                return self.data.decode("utf-8")
        except ValueError:  # UnicodeDecodeError and JSONDecodeError
            pass
        return self.data


def content_type_of(path: Path) -> str:
    return CONTENT_TYPES.get(path.suffix.lower(), OCTET_STREAM)


@dataclass(frozen=True)
class Corpus:
    """Bodies and their fixed order. ``source`` is the directory or file they came from."""

    source: str
    bodies: tuple[Body, ...]
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        if not self.bodies:
            raise CorpusError(f"{self.source}: no request bodies")

    @property
    def order(self) -> list[int]:
        """Every body's index once, shuffled with ``seed``: the order requests take them in."""
        indices = list(range(len(self.bodies)))
        random.Random(self.seed).shuffle(indices)
        return indices

    def sequence(self, count: int) -> list[int]:
        """The body index of each of ``count`` requests: ``order`` over and over."""
        order = self.order
        return [order[i % len(order)] for i in range(count)]

    def batches(self, batch_size: int, count: int) -> list[list[Body]]:
        """``count`` batches of ``batch_size`` bodies, taken in turn from ``sequence``."""
        indices = self.sequence(batch_size * count)
        return [
            [self.bodies[i] for i in indices[k * batch_size : (k + 1) * batch_size]]
            for k in range(count)
        ]

    @property
    def unit(self) -> str:
        return "chars" if all(b.is_text for b in self.bodies) else "bytes"

    @property
    def label(self) -> str:
        """What the corpus is: a body's file name, or how many bodies and how long."""
        if len(self.bodies) == 1:
            return self.bodies[0].name
        lengths = [b.length for b in self.bodies]
        median = statistics.median(lengths)
        return (
            f"{Path(self.source).name}: {len(lengths)} bodies, {min(lengths)}-{max(lengths)} "
            f"{self.unit}, median {median:g}"
        )

    def describe(self, requests: int) -> dict[str, Any]:
        """What ``requests`` requests send, each body with its share: for results files."""
        sent = Counter(self.sequence(requests))
        return {
            "source": self.source,
            "label": self.label,
            "seed": self.seed,
            "requests": requests,
            "unit": self.unit,
            "bodies": [
                {
                    "name": b.name,
                    "content_type": b.content_type,
                    "length": b.length,
                    "bytes": len(b.data),
                    "requests": sent[i],
                    "share": sent[i] / requests,
                }
                for i, b in enumerate(self.bodies)
            ],
        }


def read_corpus(path: Path | str, seed: int = DEFAULT_SEED) -> Corpus:
    """A directory of bodies, a ``.jsonl`` file, or any other file as a corpus of one.

    Raises:
        CorpusError: missing, no body, or a JSONL line not a string or an object.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        bodies = [Body(p.name, p.read_bytes(), content_type_of(p)) for p in files]
    elif path.suffix.lower() == ".jsonl" and path.is_file():
        bodies = read_jsonl(path)
    elif path.is_file():
        bodies = [Body(path.name, path.read_bytes(), content_type_of(path))]
    else:
        raise CorpusError(f"{path}: no such file or directory")
    return Corpus(str(path), tuple(bodies), seed)


def read_jsonl(path: Path) -> list[Body]:
    """One body per non-blank line, named ``<file>:<line>``."""
    bodies = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise CorpusError(f"{where}: not JSON: {exc}") from None
        name = f"{path.name}:{number}"
        if isinstance(value, str):
            bodies.append(Body(name, value.encode("utf-8"), "text/plain"))
        elif isinstance(value, dict):
            bodies.append(
                Body(name, json.dumps(value, ensure_ascii=False).encode(), "application/json")
            )
        else:
            raise CorpusError(
                f"{where}: got {type(value).__name__}, expected a string (a text body) or an "
                "object (a JSON body)"
            )
    return bodies


def rows_of(bodies: Sequence[Body]) -> list[dict[str, Any]]:
    """A batch as TorchServe's worker gives it to a handler."""
    return [{"body": b.torchserve_value()} for b in bodies]
