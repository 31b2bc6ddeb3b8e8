#!/usr/bin/env python3
"""Writes a text corpus (a directory of .txt bodies) with a given mix of lengths in words,
or in tokens of a tokenizer.

    python benchmarks/make_text_corpus.py --mix "70:8-64,25:65-256,5:257-512" --count 500 \\
        --out benchmarks/corpora/long_tail

``--mix`` is ``PERCENT:MIN-MAX`` words, comma-separated; each bin gets its share of
``--count`` bodies (largest remainders), each body a length drawn evenly from its bin. The
texts come from examples/bert_classifier/texts.py's ``make_text(seed, n_words)``
(``--generator module:function`` names another), imported only when run. Files are named
``<index>-<words>w.txt``, so a body's name says how long it is; the same arguments write the
same files.

With ``--tokenizer DIR`` (a ``save_pretrained`` tokenizer directory, e.g. the BERT
example's ``build/bert_mb/model``) the mix is in TOKENS as the model sees them, [CLS] and
[SEP] included (what the example's ``item_length`` counts): each body is the longest text
of its seed whose token count is at most the length drawn, and files are named
``<index>-<tokens>t.txt`` with the count the tokenizer really gives.
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


def fit_tokens(
    make_text: Callable[[int, int], str], count_tokens: Callable[[str], int], seed: int, target: int
) -> tuple[str, int]:
    """The text of ``seed`` with the most words whose token count is at most ``target``
    (one word if even that is longer), and its token count. Counts grow with words, so a
    binary search over the word count finds it. A last word of several tokens can leave
    the count a little under ``target``, even under its bin: ``describe`` says so."""
    low, high = 1, max(1, target)  # a word is at least one token
    best = make_text(seed, 1)
    best_count = count_tokens(best)
    while low <= high:
        words = (low + high) // 2
        text = make_text(seed, words)
        count = count_tokens(text)
        if count <= target:
            if count >= best_count or best_count > target:
                best, best_count = text, count
            low = words + 1
        else:
            high = words - 1
    return best, best_count


def write_token_corpus(
    out: Path,
    mix: list[tuple[float, int, int]],
    total: int,
    make_text: Callable[[int, int], str],
    count_tokens: Callable[[str], int],
    seed: int = 0,
) -> list[tuple[Path, int]]:
    """The corpus as ``out/<index>-<tokens>t.txt``, lengths drawn in tokens; the paths
    written with their real token counts."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, target in enumerate(lengths(mix, total, seed)):
        text, count = fit_tokens(make_text, count_tokens, seed * 1_000_003 + i, target)
        path = out / f"{i:05d}-{count}t.txt"
        path.write_text(text, encoding="utf-8")
        written.append((path, count))
    return written


def token_counter(tokenizer_dir: Path) -> Callable[[str], int]:
    """Tokens of a text as a ``save_pretrained`` tokenizer makes them, special ones included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return lambda text: len(tokenizer(text)["input_ids"])


def describe(counts: list[int], mix: list[tuple[float, int, int]]) -> str:
    """The real distribution: per bin of the mix, its share and min/median/max."""
    lines = []
    for _, low, high in mix:
        inside = sorted(c for c in counts if low <= c <= high)
        if inside:
            lines.append(
                f"  {low}-{high}: {len(inside)} bodies ({len(inside) / len(counts):.0%}), "
                f"min {inside[0]}, median {inside[len(inside) // 2]}, max {inside[-1]}"
            )
    outside = [c for c in counts if not any(lo <= c <= hi for _, lo, hi in mix)]
    if outside:
        lines.append(f"  outside the bins: {len(outside)} bodies {sorted(outside)[:10]}")
    return "\n".join(lines)


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
    parser.add_argument(
        "--tokenizer", type=Path, help="a tokenizer directory: the mix is in its tokens"
    )
    args = parser.parse_args()
    make_text = load_generator(args.generator)
    if args.tokenizer is None:
        paths = write_corpus(args.out, args.mix, args.count, make_text, args.seed)
        print(f"wrote {len(paths)} bodies to {args.out}")
        return 0
    written = write_token_corpus(
        args.out, args.mix, args.count, make_text, token_counter(args.tokenizer), args.seed
    )
    print(f"wrote {len(written)} bodies to {args.out}; tokens per body:")
    print(describe([count for _, count in written], args.mix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
