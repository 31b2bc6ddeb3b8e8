"""Builds segmenter_mb.mar: DeepLabV3 (MobileNetV3-Large) behind ImageSegmenter with
micro-batching.

    python examples/image_segmenter/build_mar.py --export-path model_store [--weights FILE]

Nothing is downloaded: without ``--weights`` (torchvision's
``deeplabv3_mobilenet_v3_large-fc3c493d.pth``, or any state dict of that model) the weights
are untrained (seeded, with batch-norm statistics from photo-like images, so every build
packs the same ones and masks vary with the photo): the masks mean nothing, the serving
path is the real one. The Pascal VOC class names come from torchvision's own
metadata. Also writes sample photos of several sizes to ``--samples``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT / "examples" / "image_classifier")]

import prepare  # noqa: E402  (photo-like JPEGs, made here)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # the handler's normalization
# Sizes a phone, a webcam, a screenshot tool and a video frame grabber send (width, height).
SAMPLE_SIZES = [(640, 480), (480, 640), (1280, 720), (320, 320)]
# The benchmark's corpus: 10 sizes, which the default cap (520) brings to 7 model sizes.
CORPUS_SIZES = [
    (640, 480), (480, 640), (800, 600), (600, 800), (1024, 768),
    (1280, 720), (720, 1280), (320, 320), (512, 384), (400, 300),
]  # fmt: skip


def segmenter_class() -> type:
    """model.py's segmenter, imported by path under its own name ("model" may be another
    example's model in this process: the tests build several)."""
    spec = importlib.util.spec_from_file_location(
        "ts_microbatch_segmenter_model", HERE / "model.py"
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {HERE / 'model.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MobileNetSegmenter  # type: ignore[no-any-return]


def untrained_model() -> Any:
    """The segmenter with seeded random weights and batch-norm statistics taken from eight
    photo-like images. Without the statistics (mean 0, variance 1) the untrained network
    answers one class for every pixel of every photo, so a test could not tell two photos'
    masks apart; with them each pixel's class depends on the photo, as a trained model's."""
    import torch
    from torchvision.transforms import functional

    torch.manual_seed(0)
    model = segmenter_class()()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # the calibration batch's own statistics, not a blend
    photos = [prepare.make_jpeg(1000 + k, size=(128, 96)) for k in range(8)]
    images = [functional.to_tensor(Image.open(io.BytesIO(p)).convert("RGB")) for p in photos]
    threads = torch.get_num_threads()
    # One intra-op thread: on two busy cores a 2-wide team took 3.3 s for this forward,
    # one thread 0.2 s; and a build packs the same statistics whatever the thread setting.
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model.train()(functional.normalize(torch.stack(images), MEAN, STD))
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def write_weights(out: Path, weights: str | None) -> Path:
    import torch

    model = untrained_model() if not weights else segmenter_class()()
    path = out / "segmenter.pth"
    if weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if not k.startswith("aux_classifier.")}
        model.segmenter.load_state_dict(state)  # fails loudly on a wrong file
        print(f"Using the weights in {weights}")
    else:
        print(
            "!! No --weights given: UNTRAINED segmenter weights; masks are meaningless "
            "(the serving path is the real one)",
            file=sys.stderr,
        )
    torch.save(model.state_dict(), path)
    return path


def write_labels(out: Path) -> Path:
    from torchvision.models.segmentation import DeepLabV3_MobileNet_V3_Large_Weights

    categories = DeepLabV3_MobileNet_V3_Large_Weights.COCO_WITH_VOC_LABELS_V1.meta["categories"]
    path = out / "index_to_name.json"
    path.write_text(json.dumps({str(i): name for i, name in enumerate(categories)}))
    return path


def write_photos(out: Path, sizes: list[tuple[int, int]], copies: int = 1) -> list[Path]:
    """``copies`` photos of each size, each of its own seed."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for copy in range(copies):
        for index, (width, height) in enumerate(sizes):
            path = out / f"photo-{copy}-{width}x{height}.jpg"
            path.write_bytes(prepare.make_jpeg(500 + copy * 20 + index, size=(width, height)))
            paths.append(path)
    return paths


def write_corpus(out: Path, copies: int = 3) -> list[Path]:
    """The benchmark's corpus: ``copies`` photos of each size of CORPUS_SIZES."""
    return write_photos(out, CORPUS_SIZES, copies)


def build_mar(
    export_path: str | Path,
    *,
    model_name: str = "segmenter_mb",
    weights: str | None = None,
    work_dir: str | Path | None = None,
    model_config: str | Path = HERE / "model-config.yaml",
    overrides: dict[str, Any] | None = None,
    handler_settings: dict[str, Any] | None = None,
    self_contained: bool = False,
) -> Path:
    """Writes ``<export_path>/<model_name>.mar``; ``overrides`` are applied over the
    config's micro_batching section and ``handler_settings`` over its handler section
    (tests build a small cap this way). ``self_contained``: the .mar carries ts_microbatch's
    worker modules, imported ahead of any installed copy (a benchmark that must not see
    later edits of the checkout)."""
    work = Path(work_dir or ROOT / "build" / model_name)
    work.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(Path(model_config).read_text())
    config["handler"] = {**config.get("handler", {}), **(handler_settings or {})}
    config["micro_batching"] = {**config.get("micro_batching", {}), **(overrides or {})}
    packed_config = work / "model-config.yaml"
    packed_config.write_text(yaml.safe_dump(config, sort_keys=False))
    extra = [str(write_labels(work))]
    if self_contained:
        from ts_microbatch.tools.bundle import vendor

        extra.append(str(vendor(work / "vendor")))
    Path(export_path).mkdir(parents=True, exist_ok=True)
    arguments = {
        "--model-name": model_name,
        "--version": "1.0",
        "--model-file": str(HERE / "model.py"),
        "--serialized-file": str(write_weights(work, weights)),
        "--handler": str(HERE / "segmenter_handler.py"),
        "--config-file": str(packed_config),
        "--extra-files": ",".join(extra),
        "--export-path": str(export_path),
    }
    run_archiver(["--force", *(part for pair in arguments.items() for part in pair)])
    mar = Path(export_path) / f"{model_name}.mar"
    print(f"Built {mar}")
    return mar


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export-path", default=str(ROOT / "model_store"))
    parser.add_argument("--model-name", default="segmenter_mb")
    parser.add_argument("--weights", help="a state dict of deeplabv3_mobilenet_v3_large")
    parser.add_argument("--samples", default=str(ROOT / "build" / "segmenter_mb" / "samples"))
    parser.add_argument("--corpus", help="also write a corpus of photos of 10 sizes here")
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
    for path in write_photos(Path(args.samples), SAMPLE_SIZES):
        print(f"sample: {path}")
    if args.corpus:
        photos = write_corpus(Path(args.corpus))
        print(f"corpus: {len(photos)} photos in {args.corpus}")


if __name__ == "__main__":
    main()
