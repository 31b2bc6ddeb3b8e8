"""Why ab reports responses of different lengths for one image: measured in-process.

ab counts a response whose length differs from the *first* response's as failed. This
script runs the served handler in-process (the example .mar, untrained ResNet-18 unless
--mar names another), sends the same JPEG many times in batches cut at several
micro-batch sizes, serializes every answer exactly as TorchServe's worker does
(``json.dumps(output, indent=2)``), and reports, per micro-batch size, how many distinct
bodies and body lengths come out, and how far the probabilities move between sizes.

    python benchmarks/response_lengths.py --out benchmarks/results/response_lengths
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_lib  # noqa: E402

from ts_microbatch.tools import tune  # noqa: E402


def body(output: Any) -> str:
    return json.dumps(output, indent=2)  # as ts.protocol.otf_message_handler does


def run(mar: Path, image: bytes, batch: int, sizes: list[int]) -> dict[str, Any]:
    scratch = bench_lib.scratch_dir("response_lengths_")
    model_dir = tune.model_dir_of(mar, scratch)
    context = tune.make_context(model_dir, batch)
    _, mb = tune.load_handler(model_dir, context)
    by_size: dict[int, list[dict[str, float]]] = {}
    try:
        for size in sizes:
            mb.micro_batch_size = size
            tune.fresh_batch(context, batch)
            by_size[size] = mb.handle([{"body": image}] * batch, context)
    finally:
        mb.shutdown()
    report: dict[str, Any] = {"batch": batch, "sizes": {}}
    first = by_size[sizes[0]][0]
    for size, outputs in by_size.items():
        bodies = [body(o) for o in outputs]
        worst = max(abs(o[k] - first[k]) for o in outputs for k in first if k in o)
        report["sizes"][size] = {
            "distinct_bodies": len(set(bodies)),
            "distinct_lengths": sorted({len(b) for b in bodies}),
            "same_top5_labels": all(list(o) == list(first) for o in outputs),
            "max_abs_diff_vs_first_size": worst,
            "sample": outputs[0],
        }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mar", type=Path, default=ROOT / "model_store" / "resnet-18_mb.mar")
    parser.add_argument("--image", type=Path, default=None, help="default: the example JPEG")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sizes", default="32,16,8,4,3,2,1")
    parser.add_argument("--out", type=Path, default=None, help="write report.json here")
    args = parser.parse_args()
    if args.image is None:
        sys.path.insert(0, str(ROOT / "examples" / "image_classifier"))
        import prepare  # type: ignore[import-not-found]

        image = prepare.make_jpeg(seed=0)
    else:
        image = args.image.read_bytes()
    sizes = [int(s) for s in args.sizes.split(",")]
    report = run(args.mar, image, args.batch, sizes)
    for size, row in report["sizes"].items():
        print(
            f"micro-batch {size:>2}: {row['distinct_bodies']} distinct bodies, lengths "
            f"{row['distinct_lengths']}, top-5 labels same: {row['same_top5_labels']}, "
            f"max |p - p(size {sizes[0]})| = {row['max_abs_diff_vs_first_size']:.2e}"
        )
    bench_lib.save_json(args.out, "report.json", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
