"""Builds the ResNet-18 micro-batching .mar with torch-model-archiver.

    python examples/image_classifier/build_mar.py --export-path model_store \
        [--weights resnet18-f37072fd.pth]

The handler comes from handlers/, the micro-batching config from configs/; both can be
replaced (tests build a .mar with a broken config this way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import prepare  # noqa: E402


def build_mar(
    export_path: str | os.PathLike[str],
    *,
    model_name: str = "resnet-18_mb",
    weights: str | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    handler: str | os.PathLike[str] = ROOT / "handlers/micro_batching_handler.py",
    micro_batching_json: str | os.PathLike[str] = ROOT / "configs/micro_batching.json",
    model_config: str | os.PathLike[str] = HERE / "model-config.yaml",
    archive_format: str = "default",
    self_contained: bool = False,
    kserve: bool = False,
) -> Path:
    """Writes ``<export_path>/<model_name>.mar`` and returns its path.

    ``self_contained``: the .mar also carries ts_microbatch's worker modules, so a
    TorchServe without the package installed (KServe's runtime image) serves it.
    ``kserve``: the packed micro_batching.json gets ``"kserve": true`` (v1 ``instances`` and
    v2 ``inputs`` bodies are KServe requests, malformed ones 400), for a KServe bundle."""
    work = Path(work_dir or ROOT / "build" / model_name)
    work.mkdir(parents=True, exist_ok=True)
    weights_path = prepare.write_weights(str(work), weights)
    labels = prepare.write_labels(str(work))
    # torch-model-archiver names extra files by their base name; the handler looks for this one.
    config_copy = work / "micro_batching.json"
    config_bytes = Path(micro_batching_json).read_bytes()
    if kserve:
        config_bytes = json.dumps({**json.loads(config_bytes), "kserve": True}, indent=4).encode()
    config_copy.write_bytes(config_bytes)
    extra = [str(labels), str(config_copy)]
    if self_contained:
        from ts_microbatch.tools.bundle import vendor

        extra.append(str(vendor(work / "vendor")))
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
            weights_path,
            "--handler",
            str(handler),
            "--config-file",
            str(model_config),
            "--extra-files",
            ",".join(extra),
            "--export-path",
            str(export_path),
            "--archive-format",
            archive_format,
        ]
    )
    mar = Path(export_path) / f"{model_name}.mar"
    print(f"Built {mar}")
    return mar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-path", default=str(ROOT / "model_store"))
    parser.add_argument("--model-name", default="resnet-18_mb")
    parser.add_argument(
        "--weights",
        default=os.environ.get("WEIGHTS") or None,
        help=f"torchvision {prepare.STANDARD_WEIGHTS}; untrained weights if omitted",
    )
    parser.add_argument("--micro-batching-json", default=str(ROOT / "configs/micro_batching.json"))
    parser.add_argument("--model-config", default=str(HERE / "model-config.yaml"))
    parser.add_argument(
        "--self-contained",
        action="store_true",
        help="carry ts_microbatch's worker modules (for a TorchServe without the package)",
    )
    parser.add_argument(
        "--kserve",
        action="store_true",
        help='pack the micro-batching JSON with "kserve": true (for a KServe bundle)',
    )
    args = parser.parse_args()
    work = ROOT / "build" / args.model_name
    build_mar(
        args.export_path,
        model_name=args.model_name,
        weights=args.weights,
        work_dir=work,
        micro_batching_json=args.micro_batching_json,
        model_config=args.model_config,
        self_contained=args.self_contained,
        kserve=args.kserve,
    )
    with open(work / "kitten.jpg", "wb") as f:
        f.write(prepare.make_jpeg(seed=0))


if __name__ == "__main__":
    main()
