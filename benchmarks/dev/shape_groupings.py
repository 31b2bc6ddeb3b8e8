#!/usr/bin/env python3
"""What each ``shape_groups`` setting costs the segmentation example in batching and in
exactness, in-process through TorchServe's own loader and ``Service.predict``.

    python benchmarks/dev/shape_groupings.py --out benchmarks/dev/results/shape_groupings

The example's corpus (photos of 10 sizes, 3 each; 7 sizes after the 520 px cap) in a
seeded shuffled order, cut into batches of 8 as the frontend would hand them over, served
at micro-batch 2 with each grouping: none, ``exact`` (by the handler's ``item_shape``,
the size the model sees), ``aspect``, ``orientation`` and a rounding of 128 px. For each:
the mean micro-batch size (the pipeline's cut), the mean rows per forward (the example's
inference stacks each same-size group of a micro-batch: nothing is padded), and each mask
against the photo's mask alone. The same on the detector example (photos of 7 sizes,
micro-batch 2, whose model pads a list to its largest): there the grouping decides what
the model sees.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from tests.helpers import load_module  # noqa: E402
from tests.image_answers import boxes_close, flipped_fraction  # noqa: E402
from tests.torchserve.ts_machinery import decode, load_service, request  # noqa: E402
from ts_microbatch.tools.mar import override_mar  # noqa: E402

GROUPINGS: list[str | int | None] = [None, "exact", "aspect", "orientation", 128]
EXAMPLES = {
    "image_segmenter": ("segmenter_mb", "segmenter_handler.py"),
    "object_detector": ("detector_mb", "detector_handler.py"),
}


def service_for(example: str, work: Path, grouping: str | int | None) -> Any:
    """The example's .mar (built once per example: the detector's untrained weights are
    drawn at each build) with this grouping at micro-batch 2, loaded in-process."""
    name, handler = EXAMPLES[example]
    base = work / example / "store" / f"{name}.mar"
    if not base.exists():
        build = load_module(f"examples/{example}/build_mar.py", f"groupings_{example}_build")
        build.build_mar(base.parent, work_dir=work / example / "work")
    tag = work / example / f"grouping-{grouping}"
    mar = tag / f"{name}.mar"
    override_mar(base, mar, {"shape_groups": grouping, "micro_batch_size": 2})
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(tag / "model")
    # TorchServe's loader imports the model file as "model": the other example's, once
    # this process has loaded it, unless it is dropped (a worker serves one model).
    sys.modules.pop("model", None)
    return load_service(tag / "model", model_name=name, handler=handler)


def predict(service: Any, bodies: list[bytes]) -> list[tuple[int, Any]]:
    code, answers = decode(service.predict([request(i, b) for i, b in enumerate(bodies)]))
    if code != 200:
        raise RuntimeError(f"batch answered {code}")
    return [(status, json.loads(body)) for _, status, body in answers]


def recorded(service: Any) -> tuple[list[int], list[int]]:
    """Wraps preprocess and the model: rows per micro-batch and per forward."""
    handler = service._entry_point.__self__
    preprocess, model = handler.preprocess, handler.model
    micro_batches: list[int] = []
    forwards: list[int] = []

    def recording_preprocess(data: list[Any]) -> Any:
        micro_batches.append(len(data))
        return preprocess(data)

    def recording_model(batch: Any) -> Any:
        forwards.append(len(batch))
        return model(batch)

    handler.preprocess, handler.model = recording_preprocess, recording_model
    return micro_batches, forwards


def study(example: str, photos: list[bytes], work: Path, batch: int) -> dict[str, Any]:
    close = _mask_compare if example == "image_segmenter" else _boxes_compare
    alone_service = service_for(example, work, "exact")  # a batch of one: alone
    alone = [predict(alone_service, [photo])[0] for photo in photos]
    alone_service._entry_point.__self__.micro_batching.shutdown()
    rows: dict[str, Any] = {}
    for grouping in GROUPINGS:
        service = service_for(example, work, grouping)
        micro_batches, forwards = recorded(service)
        started = time.perf_counter()
        answers = [
            answer
            for first in range(0, len(photos), batch)
            for answer in predict(service, photos[first : first + batch])
        ]
        seconds = time.perf_counter() - started
        service._entry_point.__self__.micro_batching.shutdown()
        statuses = [status for status, _ in answers]
        compared = [close(got, want) for (_, got), (_, want) in zip(answers, alone)]
        rows[str(grouping)] = {
            "all_200": statuses == [200] * len(photos),
            "micro_batches": len(micro_batches),
            "mean_micro_batch_size": sum(micro_batches) / len(micro_batches),
            "forwards": len(forwards) if example == "image_segmenter" else len(micro_batches),
            "mean_rows_per_forward": sum(forwards) / len(forwards) if forwards else None,
            "identical_to_alone": f"{sum(c['identical'] for c in compared)} of {len(photos)}",
            "within_tolerance": f"{sum(c['close'] for c in compared)} of {len(photos)}",
            "worst": max(c["worst"] for c in compared),
            "seconds_wall": round(seconds, 1),
        }
        print(f"{example} {grouping}: {rows[str(grouping)]}", flush=True)
    return rows


def _mask_compare(got: Any, want: Any) -> dict[str, Any]:
    fraction = flipped_fraction(got, want)
    return {"identical": got == want, "close": fraction <= 1e-3, "worst": fraction}


def _boxes_compare(got: Any, want: Any) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(got, want)) if len(got) == len(want) else 0
    return {
        "identical": got == want,
        "close": boxes_close(got, want),
        "worst": 1 - same / max(len(want), 1),  # the fraction of boxes not as alone
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/dev/results/shape_groupings")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", default="image_segmenter,object_detector")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for example in args.examples.split(","):
            build = load_module(f"examples/{example}/build_mar.py", f"groupings_{example}_build")
            paths = build.write_corpus(Path(tmp) / f"{example}-corpus")
            random.Random(args.seed).shuffle(paths)
            photos = [path.read_bytes() for path in paths]
            report = {
                "batch": args.batch,
                "micro_batch_size": 2,
                "seed": args.seed,
                "photos": [path.name for path in paths],
                "groupings": study(example, photos, Path(tmp), args.batch),
            }
            path = args.out / f"{example}.json"
            path.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
