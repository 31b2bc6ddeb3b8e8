#!/usr/bin/env python3
"""How far an image's answer moves when it shares a forward with images of its own size.

    python benchmarks/dev/batch_exactness.py --out benchmarks/dev/results/batch_exactness

Nothing is padded when a micro-batch holds images of one size, so the rows the model sees
are exactly the image's; but the CPU kernels (oneDNN convolutions, matmuls) choose their
blocking by batch size, so the sums run in another order and the floats differ in the
last digits. This measures that, in-process and at one intra-op thread as the examples
serve, for both image examples with their untrained (seeded) weights:

- the segmenter (examples/image_segmenter, photos of 10 sizes capped at 520 px): each
  photo alone against the same photo in a stack of 1 (a second run), 2 and 4 photos of its
  model size; the largest logit difference, masks identical, pixels whose class flips;
  and, for a handler that would pad a smaller photo to its group's largest (a rounding in
  pixels), the same against the photo padded beside a larger one;
- the detector (examples/object_detector, photos of 6 sizes): each photo alone against the
  same in a list of 1, 2 and 4 photos of its size; the largest box and score difference,
  answers bitwise identical and identical after the example's rounding (0.1 px, 0.001).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "image_classifier")]

import prepare  # noqa: E402

from tests.helpers import load_module  # noqa: E402

STACKS = (1, 2, 4)


def segmenter_photos(copies: int, max_side: int) -> list[torch.Tensor]:
    """The benchmark corpus's sizes, ``copies`` each, as the handler's preprocess makes them."""
    handler = load_module("examples/image_segmenter/segmenter_handler.py", "seg_handler")
    build = load_module("examples/image_segmenter/build_mar.py", "seg_build")
    tensors = []
    for copy in range(copies):
        for index, size in enumerate(build.CORPUS_SIZES):
            image = Image.open(io.BytesIO(prepare.make_jpeg(700 + 20 * copy + index, size=size)))
            image = image.convert("RGB")
            capped = handler.capped(image.size, max_side)
            if capped != image.size:
                image = image.resize(capped, Image.BILINEAR)
            tensors.append(handler.SegmenterHandler.image_processing(image))
    return tensors


def companions(photos: list[torch.Tensor], index: int, count: int) -> list[int]:
    """``index`` and the next ``count - 1`` photos of its size (cyclic: with fewer photos of
    that size, one may come twice; the kernels choose by batch size, not content)."""
    same = [i for i, p in enumerate(photos) if p.shape == photos[index].shape]
    start = same.index(index)
    return [same[(start + k) % len(same)] for k in range(count)]


def measure_segmenter(copies: int, max_side: int) -> dict[str, Any]:
    build = load_module("examples/image_segmenter/build_mar.py", "seg_build")
    model = build.untrained_model()  # the weights the example packs without --weights
    photos = segmenter_photos(copies, max_side)
    with torch.inference_mode():
        alone = [model(p[None])["out"][0] for p in photos]
        rows: dict[str, Any] = {}
        for count in STACKS:
            diffs, flips, identical = [], [], 0
            for index in range(len(photos)):
                stack = torch.stack([photos[i] for i in companions(photos, index, count)])
                got = model(stack)["out"][0]
                diffs.append(float((got - alone[index]).abs().max()))
                flipped = int((got.argmax(0) != alone[index].argmax(0)).sum())
                flips.append(flipped / got[0].numel())
                identical += flipped == 0
            rows[f"stack {count}"] = summary(diffs, flips, identical, len(photos))
        rows["padded beside a larger photo"] = padded(model, photos, alone)
    pixels = sorted({p.shape[1] * p.shape[2] for p in photos})
    return {"photos": len(photos), "max_side": max_side, "pixels": pixels, **rows}


def padded(model: Any, photos: list[torch.Tensor], alone: list[torch.Tensor]) -> dict[str, Any]:
    """Each photo smaller than the largest, padded (zeros after normalization, bottom and
    right) to the largest's size and stacked with it: its region of the answer against alone."""
    largest = max(range(len(photos)), key=lambda i: photos[i].shape[1] * photos[i].shape[2])
    big = photos[largest]
    diffs, flips, identical, count = [], [], 0, 0
    for index, photo in enumerate(photos):
        _, height, width = photo.shape
        if height > big.shape[1] or width > big.shape[2] or photo.shape == big.shape:
            continue
        canvas = torch.zeros_like(big)
        canvas[:, :height, :width] = photo
        got = model(torch.stack([canvas, big]))["out"][0][:, :height, :width]
        diffs.append(float((got - alone[index]).abs().max()))
        flipped = int((got.argmax(0) != alone[index].argmax(0)).sum())
        flips.append(flipped / (height * width))
        identical += flipped == 0
        count += 1
    return {"to": list(big.shape[1:]), **summary(diffs, flips, identical, count)}


def summary(diffs: list[float], flips: list[float], identical: int, total: int) -> dict[str, Any]:
    return {
        "max_abs_logit_diff": max(diffs),
        "median_abs_logit_diff": sorted(diffs)[len(diffs) // 2],
        "masks_identical": f"{identical} of {total}",
        "max_flipped_fraction": max(flips),
        "mean_flipped_fraction": sum(flips) / len(flips),
    }


def measure_detector(copies: int) -> dict[str, Any]:
    build = load_module("examples/object_detector/build_mar.py", "det_build")
    torch.manual_seed(0)
    model = build.detector_class()().eval()
    photos = []
    for copy in range(copies):
        for index, size in enumerate(build.SAMPLE_SIZES):
            image = Image.open(io.BytesIO(prepare.make_jpeg(900 + 20 * copy + index, size=size)))
            photos.append(torch.as_tensor(_to_tensor(image.convert("RGB"))))
    rows: dict[str, Any] = {}
    with torch.inference_mode():
        alone = [model([p])[0] for p in photos]
        for count in STACKS:
            box_diffs, score_diffs, bitwise, rounded = [], [], 0, 0
            for index in range(len(photos)):
                got = model([photos[i] for i in companions(photos, index, count)])[0]
                want = alone[index]
                if torch.equal(got["labels"], want["labels"]):
                    box_diffs.append(float((got["boxes"] - want["boxes"]).abs().max()))
                    score_diffs.append(float((got["scores"] - want["scores"]).abs().max()))
                bitwise += all(torch.equal(got[k], want[k]) for k in want)
                rounded += _rounded(got) == _rounded(want)
            rows[f"list {count}"] = {
                "max_abs_box_diff_px": max(box_diffs, default=None),
                "max_abs_score_diff": max(score_diffs, default=None),
                "same_labels_in_order": f"{len(box_diffs)} of {len(photos)}",
                "bitwise_identical": f"{bitwise} of {len(photos)}",
                "identical_rounded": f"{rounded} of {len(photos)}",
            }
    return {"photos": len(photos), **rows}


def _to_tensor(image: Image.Image) -> torch.Tensor:
    from torchvision.transforms.functional import to_tensor

    return to_tensor(image)


def _rounded(answer: dict[str, torch.Tensor]) -> list[Any]:
    """The detector example's answer: boxes to 0.1 px, scores to 0.001."""
    return [
        ([round(v, 1) for v in box], round(score, 3), label)
        for box, score, label in zip(
            answer["boxes"].tolist(), answer["scores"].tolist(), answer["labels"].tolist()
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/dev/results/batch_exactness")
    parser.add_argument("--copies", type=int, default=3, help="photos of each size")
    parser.add_argument("--max-side", type=int, default=520, help="the segmenter's cap")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.time()
    report = {
        "torch": torch.__version__,
        "threads": args.threads,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "segmenter": measure_segmenter(args.copies, args.max_side),
        "detector": measure_detector(args.copies),
    }
    report["seconds"] = round(time.time() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"results-threads{args.threads}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
