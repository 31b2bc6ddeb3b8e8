"""Builds detector_mb.mar: Faster R-CNN (MobileNetV3-Large 320 FPN) behind ObjectDetector
with micro-batching.

    python examples/object_detector/build_mar.py --export-path model_store [--weights FILE]

Nothing is downloaded: without ``--weights`` (torchvision's
``fasterrcnn_mobilenet_v3_large_320_fpn-907ea3f9.pth``, or any state dict of that model)
the weights are untrained, and the packed config answers every box (threshold 0), so the
answers show the serving path, not detections. The COCO category names come from
torchvision's own metadata. Also writes sample photos of several sizes to ``--samples``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "examples" / "image_classifier")]

import prepare  # noqa: E402  (photo-like JPEGs, made here)

# Photo sizes a phone, a webcam and a screenshot tool send (width, height).
SAMPLE_SIZES = [(640, 480), (480, 640), (800, 600), (320, 320), (1024, 768), (600, 800)]
# The mixed corpus the detection benchmark sends: these sizes, four photos each.
CORPUS_SIZES = [*SAMPLE_SIZES, (512, 384)]


def detector_class() -> type:
    """model.py's detector, imported by path under its own name ("model" may be another
    example's model in this process: the tests build several)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ts_microbatch_detector_model", HERE / "model.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / 'model.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MobileNetDetector  # type: ignore[no-any-return]


def write_weights(out: Path, weights: str | None) -> Path:
    import torch

    torch.manual_seed(0)  # untrained weights, the same at every build: two builds compare
    model = detector_class()()
    path = out / "detector.pth"
    if weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.detector.load_state_dict(state)  # fails loudly on a wrong file
        print(f"Using the weights in {weights}")
    else:
        print(
            "!! No --weights given: UNTRAINED detector weights; boxes are meaningless "
            "(the serving path is the real one)",
            file=sys.stderr,
        )
    torch.save(model.state_dict(), path)
    return path


def write_labels(out: Path) -> Path:
    from torchvision.models.detection import FasterRCNN_MobileNet_V3_Large_320_FPN_Weights

    categories = FasterRCNN_MobileNet_V3_Large_320_FPN_Weights.COCO_V1.meta["categories"]
    path = out / "index_to_name.json"
    path.write_text(json.dumps({str(i): name for i, name in enumerate(categories)}))
    return path


def write_samples(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed, (width, height) in enumerate(SAMPLE_SIZES):
        path = out / f"photo-{width}x{height}.jpg"
        path.write_bytes(prepare.make_jpeg(seed, size=(width, height)))
        paths.append(path)
    return paths


def write_corpus(out: Path, per_size: int = 4) -> list[Path]:
    """Photos of every size of CORPUS_SIZES, ``per_size`` each (a benchmark corpus)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for copy in range(per_size):
        for index, (width, height) in enumerate(CORPUS_SIZES):
            path = out / f"photo-{copy}-{width}x{height}.jpg"
            path.write_bytes(prepare.make_jpeg(100 + copy * 10 + index, size=(width, height)))
            paths.append(path)
    return paths


def build_mar(
    export_path: str | Path,
    *,
    model_name: str = "detector_mb",
    weights: str | None = None,
    work_dir: str | Path | None = None,
    model_config: str | Path = HERE / "model-config.yaml",
    overrides: dict[str, object] | None = None,
    self_contained: bool = False,
) -> Path:
    """Writes ``<export_path>/<model_name>.mar``; ``overrides`` are applied over the
    config's micro_batching section (tests and benchmarks build variants this way).
    ``self_contained``: the .mar carries ts_microbatch's worker modules, which the worker
    imports ahead of any installed copy (a TorchServe without the package; a benchmark
    that must not see later edits of the checkout)."""
    work = Path(work_dir or ROOT / "build" / model_name)
    work.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(Path(model_config).read_text())
    if not weights:
        config.setdefault("handler", {})["threshold"] = 0.0
    config["micro_batching"] = {**config.get("micro_batching", {}), **(overrides or {})}
    packed_config = work / "model-config.yaml"
    packed_config.write_text(yaml.safe_dump(config, sort_keys=False))
    extra = [str(write_labels(work))]
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
            str(write_weights(work, weights)),
            "--handler",
            str(HERE / "detector_handler.py"),
            "--config-file",
            str(packed_config),
            "--extra-files",
            ",".join(extra),
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
    parser.add_argument("--model-name", default="detector_mb")
    parser.add_argument("--weights", help="a state dict of fasterrcnn_mobilenet_v3_large_320_fpn")
    parser.add_argument("--samples", default=str(ROOT / "build" / "detector_mb" / "samples"))
    parser.add_argument("--corpus", help="also write a mixed-size photo corpus here")
    parser.add_argument(
        "--self-contained",
        action="store_true",
        help="carry ts_microbatch's worker modules (for a TorchServe without the package)",
    )
    args = parser.parse_args()
    build_mar(
        args.export_path,
        model_name=args.model_name,
        weights=args.weights,
        self_contained=args.self_contained,
    )
    for path in write_samples(Path(args.samples)):
        print(f"sample: {path}")
    if args.corpus:
        print(f"corpus: {len(write_corpus(Path(args.corpus)))} photos in {args.corpus}")


if __name__ == "__main__":
    main()
