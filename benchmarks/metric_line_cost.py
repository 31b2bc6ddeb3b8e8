#!/usr/bin/env python3
"""What one pipeline metric costs the worker: microseconds per ``on_stage`` call (3 metric
lines) through TorchServe's own metrics cache, with 1 and with 32 request ids in the batch.

    python benchmarks/metric_line_cost.py

The lines go to a null stream, as the worker's go to its stdout; the frontend's parsing of
them is not included.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ts_microbatch.tools.tune import make_context  # noqa: E402
from ts_microbatch.torchserve.metrics import TorchServeMetricsObserver  # noqa: E402

CALLS = 5000


def main() -> int:
    with open(os.devnull, "w") as null, tempfile.TemporaryDirectory() as model_dir:
        logging.basicConfig(stream=null, level=logging.INFO, format="%(message)s", force=True)
        (Path(model_dir) / "MAR-INF").mkdir()
        manifest = {"model": {"modelName": "m", "handler": "handler.py"}}
        (Path(model_dir) / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
        context = make_context(Path(model_dir), 32, yaml_config={})
        results = {}
        for ids in (1, 32):
            context.request_ids = {i: str(uuid.uuid4()) for i in range(ids)}
            context.metrics.request_ids = context.request_ids
            observer = TorchServeMetricsObserver(context.metrics)
            start = time.perf_counter()
            for _ in range(CALLS):
                observer.on_stage("preprocess", 4, 0.001, 0.002, failed=False)
            results[ids] = (time.perf_counter() - start) / CALLS * 1e6
    for ids, us in results.items():
        print(f"{ids:2} request ids: {us:5.1f} us per on_stage (3 lines), {us / 3:5.1f} per line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
