"""How close and how fast the image handler's decoders are, against the exact PIL path.

The corpus generated here (no downloads; ``benchmarks/corpus.py``): photo-like JPEGs at
camera and screen sizes, a portrait stored sideways with an EXIF orientation tag,
thumbnails and a PNG screenshot. Each image goes through the handler's
preprocess with ``pil`` (ImageClassifier's path, the reference), ``torchvision`` and
``pil-draft``; reported per image: max and mean absolute difference of the normalized
3x224x224 tensor from ``pil``, the cosine similarity of the model's logits to ``pil``'s and
whether the top-5 classes agree (meaningful only with real weights: the example .mar has
untrained ones unless built with WEIGHTS=), and the median time of preprocess on one thread.

    python benchmarks/dev/decoder_accuracy.py --mar model_store/resnet-18_mb.mar \\
        --out benchmarks/dev/results/decoder_accuracy
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples" / "image_classifier"))

import bench_lib  # noqa: E402
import corpus  # noqa: E402

from ts_microbatch.tools import inprocess  # noqa: E402

DECODERS = ("pil", "torchvision", "pil-draft")


def load(mar: Path, decoder: str) -> tuple[Any, Any]:
    scratch = bench_lib.scratch_dir(f"decoder_{decoder}_")
    model_dir = inprocess.model_dir_of(mar, scratch)
    context = inprocess.make_context(model_dir, 1, None, {"handler": {"decoder": decoder}})
    return inprocess.load_handler(model_dir, context)


def measure(mar: Path, repeats: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    images = {name: body.data for name, body in corpus.bodies().items()}
    handlers = {d: load(mar, d)[0] for d in DECODERS}
    report: dict[str, Any] = {"images": {}}
    previous: torch.Tensor | None = None
    try:
        for name, body in images.items():
            row: dict[str, Any] = {"bytes": len(body)}
            tensors, logits = {}, {}
            for decoder, handler in handlers.items():
                times = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    tensors[decoder] = handler.preprocess([{"body": body}])
                    times.append((time.perf_counter() - started) * 1000)
                with torch.inference_mode():
                    logits[decoder] = handler.inference(tensors[decoder])[0]
                row[f"{decoder}_ms"] = statistics.median(times)
            for decoder in DECODERS[1:]:
                diff = (tensors[decoder] - tensors["pil"]).abs()
                cosine = torch.nn.functional.cosine_similarity(
                    logits[decoder], logits["pil"], dim=0
                ).item()
                top5 = [torch.topk(logits[d], 5).indices.tolist() for d in ("pil", decoder)]
                row[decoder] = {
                    "max_abs_diff": diff.max().item(),
                    "mean_abs_diff": diff.mean().item(),
                    "logits_cosine": cosine,
                    "top5_same": top5[0] == top5[1],
                }
            if previous is not None:
                # What the cosine can resolve: two *different* images, same decoder. With
                # untrained weights this is close to 1 too, and the cosine says little.
                row["different_image_cosine"] = torch.nn.functional.cosine_similarity(
                    logits["pil"], previous, dim=0
                ).item()
            previous = logits["pil"]
            report["images"][name] = row
            draft = row["pil-draft"]
            print(
                f"{name}: pil {row['pil_ms']:.1f} ms, torchvision {row['torchvision_ms']:.1f} "
                f"ms, pil-draft {row['pil-draft_ms']:.1f} ms; pil-draft vs pil max "
                f"{draft['max_abs_diff']:.3f} mean {draft['mean_abs_diff']:.4f} cosine "
                f"{draft['logits_cosine']:.6f} (another image: "
                f"{row.get('different_image_cosine', float('nan')):.6f})",
                flush=True,
            )
    finally:
        for handler in handlers.values():
            handler.micro_batching.shutdown()
    report["note"] = (
        "differences in normalized units (1/255/std is one uint8 level, about 0.017); "
        "top5_same is meaningful only with real weights"
    )
    report["torch_threads"] = 1
    report["repeats"] = repeats
    report["numpy"] = np.__version__
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mar", type=Path, default=ROOT / "model_store" / "resnet-18_mb.mar")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = measure(args.mar, args.repeats)
    bench_lib.save_json(args.out, "report.json", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
