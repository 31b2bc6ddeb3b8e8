"""The fraud scorer's weights and request bodies, made here from fixed seeds.

    python examples/tabular_scorer/prepare.py --out build/tabular_mb [--weights FILE] \
        [--corpus-size 512]

``write_weights`` copies a state dict of model.py's ``FraudMLP`` you give (checked by
loading it) or makes untrained weights and says so loudly; ``make_features`` makes one
transaction's 128 features (standard normal, 4 decimals: what standardized tabular features
look like); ``write_corpus`` writes a ``.jsonl`` corpus of ``{"features": [...]}`` bodies,
one a line, as ``ts_microbatch.tools.corpus`` reads it (``ts-microbatch-benchmark
--corpus``, ``ts-microbatch-tune --corpus``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
N_FEATURES = 128
WEIGHTS_FILE = "fraud_mlp.pth"
CORPUS_FILE = "corpus.jsonl"
SAMPLE_FILE = "sample.json"
# Corpus bodies take seeds from here on; the sample is seed 0.
CORPUS_SEED = 1000


def model_class() -> Any:
    """model.py's FraudMLP, imported by path under its own name ("model" may be another
    example's model in this process: the tests load several)."""
    spec = importlib.util.spec_from_file_location("tabular_scorer_model", HERE / "model.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / 'model.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FraudMLP


def write_weights(out: Path, weights: str | None) -> Path:
    """``out/fraud_mlp.pth``: a copy of ``weights`` (a FraudMLP state dict, checked), or
    untrained weights from seed 0, the same at every build."""
    import torch

    path = out / WEIGHTS_FILE
    torch.manual_seed(0)
    model = model_class()()
    if weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)  # fails loudly on a wrong file
        shutil.copyfile(weights, path)
        print(f"Using the weights in {weights}")
        return path
    torch.save(model.state_dict(), path)
    print(
        "!! No --weights given: created UNTRAINED fraud scorer weights; scores are "
        "meaningless (the serving path is the real one)",
        file=sys.stderr,
    )
    return path


def make_features(seed: int) -> list[float]:
    """One transaction's features: 128 standard normal values to 4 decimals."""
    import numpy as np

    values = np.random.default_rng(seed).standard_normal(N_FEATURES)
    return [round(float(v), 4) for v in values]


def write_sample(out: Path) -> Path:
    path = out / SAMPLE_FILE
    path.write_text(json.dumps({"features": make_features(0)}) + "\n", encoding="utf-8")
    return path


def write_corpus(path: Path, count: int = 512) -> Path:
    """``count`` bodies, one JSON object a line, each from its own seed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"features": make_features(CORPUS_SEED + i)}) for i in range(count))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "tabular_mb")
    parser.add_argument("--weights", help="a state dict of model.py's FraudMLP")
    parser.add_argument("--corpus-size", type=int, default=512)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"weights: {write_weights(args.out, args.weights)}")
    print(f"sample: {write_sample(args.out)}")
    print(f"corpus: {write_corpus(args.out / CORPUS_FILE, args.corpus_size)}")


if __name__ == "__main__":
    main()
