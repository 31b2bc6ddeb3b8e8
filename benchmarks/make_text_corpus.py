#!/usr/bin/env python3
"""Writes a text corpus (a directory of .txt bodies) with a given mix of lengths in words.

    python benchmarks/make_text_corpus.py --mix "70:8-64,25:65-256,5:257-512" --count 500 \\
        --out benchmarks/corpora/long_tail

``--mix`` is ``PERCENT:MIN-MAX`` words, comma-separated; each bin gets its share of
``--count`` bodies (largest remainders), each body a length drawn evenly from its bin. The
texts come from examples/bert_classifier/texts.py's ``make_text(seed, n_words)``
(``--generator module:function`` names another), imported only when run. Files are named
``<index>-<words>w.txt``, so a body's name says how long it is; the same arguments write the
same files.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_GENERATOR = "examples.bert_classifier.texts:make_text"


def parse_mix(text: str) -> list[tuple[float, int, int]]:
    """``"70:8-64,30:65-128"`` -> [(70.0, 8, 64), (30.0, 65, 128)]."""
    bins = []
    for part in text.split(","):
        try:
            share, span = part.split(":")
            low, high = (int(v) for v in span.split("-"))
            bins.append((float(share), low, high))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"got {part!r}, expected PERCENT:MIN-MAX words (e.g. 70:8-64)"
            ) from None
        if bins[-1][0] <= 0 or not 1 <= low <= high:
            raise argparse.ArgumentTypeError(
                f"got {part!r}, expected a share > 0 and 1 <= MIN <= MAX"
            )
    return bins


def counts(total: int, shares: list[float]) -> list[int]:
    """``total`` split by ``shares`` (largest remainders)."""
    raw = [total * s / sum(shares) for s in shares]
    parts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - parts[i], reverse=True):
        if sum(parts) >= total:
            break
        parts[i] += 1
    return parts


def lengths(mix: list[tuple[float, int, int]], total: int, seed: int) -> list[int]:
    """Every body's length in words, bin after bin."""
    rng = random.Random(seed)
    n_per_bin = counts(total, [share for share, _, _ in mix])
    return [rng.randint(low, high) for (_, low, high), n in zip(mix, n_per_bin) for _ in range(n)]


def write_corpus(
    out: Path,
    mix: list[tuple[float, int, int]],
    total: int,
    make_text: Callable[[int, int], str],
    seed: int = 0,
) -> list[Path]:
    """The corpus as ``out/<index>-<words>w.txt``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n_words in enumerate(lengths(mix, total, seed)):
        path = out / f"{i:05d}-{n_words}w.txt"
        path.write_text(make_text(seed * 1_000_003 + i, n_words), encoding="utf-8")
        paths.append(path)
    return paths


def load_generator(spec: str) -> Callable[[int, int], str]:
    module, _, name = spec.partition(":")
    sys.path.insert(0, str(ROOT))
    generator: Callable[[int, int], str] = getattr(importlib.import_module(module), name)
    return generator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", type=parse_mix, required=True, help="PERCENT:MIN-MAX,...")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--generator", default=DEFAULT_GENERATOR, help="module:function")
    args = parser.parse_args()
    paths = write_corpus(args.out, args.mix, args.count, load_generator(args.generator), args.seed)
    print(f"wrote {len(paths)} bodies to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
