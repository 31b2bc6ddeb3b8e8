"""Builds embedding_mb.mar, the sentence embedding workload for the latency tuner's study.

    python benchmarks/dev/embedding/build.py --export-path model_store

Nothing is downloaded: the weights of model.py's ``SentenceEncoder`` are untrained, from
seed 0, and the bodies are made from fixed seeds out of a vocabulary of pseudo-words. Also
writes a sample body (``sample.json``, 40 words) and a corpus of 512 bodies
(``corpus.jsonl``, 5 to 300 words, counts log-uniform) to the work directory,
``build/<model name>/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WEIGHTS_FILE = "sentence_encoder.pth"
SAMPLE_FILE = "sample.json"
CORPUS_FILE = "corpus.jsonl"
WORDS_SEED = 7  # the pseudo-word vocabulary
VOCABULARY_SIZE = 2000
SAMPLE_SEED = 0
SAMPLE_WORDS = 40
CORPUS_SEED = 1000
MIN_WORDS, MAX_WORDS = 5, 300


def _sibling(name: str) -> Any:
    """A module beside this file by path, under a name of its own ("model" may be another
    example's model in this process: the tests load several)."""
    path = HERE / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ts_microbatch_embedding_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model: Any = _sibling("model")


def write_weights(out: Path) -> Path:
    """``out/sentence_encoder.pth``: untrained weights from seed 0, the same at every build."""
    import torch

    path = out / WEIGHTS_FILE
    torch.manual_seed(0)
    torch.save(model.SentenceEncoder().state_dict(), path)
    return path


def vocabulary() -> list[str]:
    """``VOCABULARY_SIZE`` pseudo-words of 2 to 10 random lowercase letters, from one seed."""
    import numpy as np

    rng = np.random.default_rng(WORDS_SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        "".join(letters[i] for i in rng.integers(0, 26, size=int(rng.integers(2, 11))))
        for _ in range(VOCABULARY_SIZE)
    ]


def make_text(rng: Any, words: list[str], count: int) -> str:
    """``count`` words drawn uniformly from ``words`` with ``rng``, joined by spaces."""
    return " ".join(words[i] for i in rng.integers(0, len(words), size=count))


def write_sample(out: Path) -> Path:
    import numpy as np

    path = out / SAMPLE_FILE
    text = make_text(np.random.default_rng(SAMPLE_SEED), vocabulary(), SAMPLE_WORDS)
    path.write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    return path


def word_counts(rng: Any, count: int) -> list[int]:
    """``count`` word counts, log-uniform over MIN_WORDS..MAX_WORDS (as many short bodies
    as long ones on a log scale: a length mix, not one typical length)."""
    logs = rng.uniform(math.log(MIN_WORDS), math.log(MAX_WORDS + 1), size=count)
    return [min(MAX_WORDS, int(math.exp(v))) for v in logs]


def write_corpus(path: Path, count: int = 512) -> Path:
    """``count`` bodies ``{"text": ...}``, one JSON object a line: the counts, then each
    body's words, drawn from one generator seeded with CORPUS_SEED."""
    import numpy as np

    rng = np.random.default_rng(CORPUS_SEED)
    words = vocabulary()
    counts = word_counts(rng, count)
    lines = [json.dumps({"text": make_text(rng, words, n)}) for n in counts]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def build_mar(
    export_path: str | os.PathLike[str],
    *,
    model_name: str = "embedding_mb",
    work_dir: str | os.PathLike[str] | None = None,
    model_config: str | os.PathLike[str] = HERE / "model-config.yaml",
) -> Path:
    """Writes ``<export_path>/<model_name>.mar`` and the sample and corpus into the work
    directory; returns the .mar's path."""
    work = Path(work_dir or ROOT / "build" / model_name)
    work.mkdir(parents=True, exist_ok=True)
    weights_path = write_weights(work)
    write_sample(work)
    write_corpus(work / CORPUS_FILE)
    Path(export_path).mkdir(parents=True, exist_ok=True)
    run_archiver(
        [
            "--force",
            "--model-name",
            model_name,
            "--version",
            "1.0",
            "--model-file",
            str(HERE / "model.py"),
            "--serialized-file",
            str(weights_path),
            "--handler",
            str(HERE / "embedding_handler.py"),
            "--config-file",
            str(model_config),
            "--export-path",
            str(export_path),
        ]
    )
    return Path(export_path) / f"{model_name}.mar"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-path", default=str(ROOT / "model_store"))
    parser.add_argument("--model-name", default="embedding_mb")
    parser.add_argument("--work-dir", help="default: build/<model name>")
    parser.add_argument("--model-config", default=str(HERE / "model-config.yaml"))
    args = parser.parse_args()
    work = Path(args.work_dir or ROOT / "build" / args.model_name)
    mar = build_mar(
        args.export_path,
        model_name=args.model_name,
        work_dir=work,
        model_config=args.model_config,
    )
    print(f"Built {mar} (untrained weights from seed 0)")
    print(f"sample: {work / SAMPLE_FILE}; corpus: {work / CORPUS_FILE}")


if __name__ == "__main__":
    main()
