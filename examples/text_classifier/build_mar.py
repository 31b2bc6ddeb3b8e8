"""Builds text_mb.mar: the bag-of-words model with untrained weights made here.

python examples/text_classifier/build_mar.py --export-path model_store
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def build_mar(export_path: str, work_dir: Path = ROOT / "build" / "text_mb") -> Path:
    import importlib.util

    import torch

    # By path, under its own name: another "model" module may be imported already.
    spec = importlib.util.spec_from_file_location("text_classifier_model", HERE / "model.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / 'model.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    TextClassifier = module.TextClassifier  # noqa: N806

    work_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    weights = work_dir / "text_classifier.pth"
    torch.save(TextClassifier().state_dict(), weights)
    print(
        "Created UNTRAINED text classifier weights: predictions are meaningless.", file=sys.stderr
    )
    run_archiver(
        [
            "--force",
            "--model-name",
            "text_mb",
            "--version",
            "1.0",
            "--model-file",
            str(HERE / "model.py"),
            "--serialized-file",
            str(weights),
            "--handler",
            str(HERE / "text_handler.py"),
            "--config-file",
            str(HERE / "model-config.yaml"),
            "--export-path",
            export_path,
        ]
    )
    mar = Path(export_path) / "text_mb.mar"
    print(f"Built {mar}")
    return mar


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-path", default=str(ROOT / "model_store"))
    Path(parser.parse_args().export_path).mkdir(parents=True, exist_ok=True)
    build_mar(parser.parse_args().export_path)
