"""Builds tabular_mb.mar: the fraud scorer (an MLP over 128 features) with micro-batching.

    python examples/tabular_scorer/build_mar.py --export-path model_store [--weights FILE]

Nothing is downloaded: without ``--weights`` (a state dict of model.py's ``FraudMLP``) the
weights are untrained, from a fixed seed (prepare.py). Also writes a sample body
(``sample.json``) and a corpus of 512 bodies (``corpus.jsonl``) to the work directory,
``build/<model name>/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from typing import Any

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _prepare() -> Any:
    """prepare.py by path under its own name: the image example's is also "prepare", and
    the tests import both examples in one process."""
    spec = importlib.util.spec_from_file_location("tabular_scorer_prepare", HERE / "prepare.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / 'prepare.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare: Any = _prepare()


def build_mar(
    export_path: str | os.PathLike[str],
    *,
    model_name: str = "tabular_mb",
    weights: str | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    micro_batching_json: str | os.PathLike[str] = HERE / "micro_batching.json",
    model_config: str | os.PathLike[str] = HERE / "model-config.yaml",
) -> Path:
    """Writes ``<export_path>/<model_name>.mar`` and the sample and corpus into the work
    directory; returns the .mar's path."""
    work = Path(work_dir or ROOT / "build" / model_name)
    work.mkdir(parents=True, exist_ok=True)
    weights_path = prepare.write_weights(work, weights)
    prepare.write_sample(work)
    prepare.write_corpus(work / prepare.CORPUS_FILE)
    # torch-model-archiver names extra files by their base name; the mixin looks for this one.
    config_copy = work / "micro_batching.json"
    config_copy.write_bytes(Path(micro_batching_json).read_bytes())
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
            str(HERE / "tabular_handler.py"),
            "--config-file",
            str(model_config),
            "--extra-files",
            str(config_copy),
            "--export-path",
            str(export_path),
        ]
    )
    mar = Path(export_path) / f"{model_name}.mar"
    print(f"Built {mar}")
    return mar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-path", default=str(ROOT / "model_store"))
    parser.add_argument("--model-name", default="tabular_mb")
    parser.add_argument(
        "--weights",
        default=os.environ.get("WEIGHTS") or None,
        help="a state dict of model.py's FraudMLP; untrained weights if omitted",
    )
    parser.add_argument("--micro-batching-json", default=str(HERE / "micro_batching.json"))
    parser.add_argument("--model-config", default=str(HERE / "model-config.yaml"))
    args = parser.parse_args()
    build_mar(
        args.export_path,
        model_name=args.model_name,
        weights=args.weights,
        micro_batching_json=args.micro_batching_json,
        model_config=args.model_config,
    )
    work = ROOT / "build" / args.model_name
    print(f"sample: {work / prepare.SAMPLE_FILE}; corpus: {work / prepare.CORPUS_FILE}")


if __name__ == "__main__":
    main()
