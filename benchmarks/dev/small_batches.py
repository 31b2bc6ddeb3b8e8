"""What a small batch costs the worker in-process: a .mar's handler as packaged, with one
inference intra-op thread, and with micro-batching off (the handler's own ``handle``).

    .venv/bin/python benchmarks/dev/small_batches.py model_store/tabular_mb.mar \\
        build/tabular_mb/corpus.jsonl [--batch 1] [--count 3000] [--passes 3]

Loads the handler as the latency tuner does (ts_microbatch.tools.inprocess), runs
``--count`` batches of ``--batch`` bodies of the corpus through it per pass, the variants
interleaved, after 200 unmeasured, and prints the wall and process CPU milliseconds a batch
(median of the passes). Below saturation batches are small, and what the pipeline costs a
batch beside the stages' calls is what a fast model pays (docs/metrics.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from ts_microbatch import MicroBatchingConfig  # noqa: E402
from ts_microbatch.tools import inprocess  # noqa: E402
from ts_microbatch.tools.corpus import read_corpus, rows_of  # noqa: E402

WARM = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mar", type=Path)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    corpus = read_corpus(args.corpus)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = inprocess.model_dir_of(args.mar, Path(scratch))
        context = inprocess.make_context(model_dir, args.batch)
        _, mb = inprocess.load_handler(model_dir, context)
        base = mb.config
        variants = {
            "as packaged": base.as_dict(),
            "inference at 1 intra-op thread": {
                **base.as_dict(),
                "intra_op_threads": {"inference": 1},
            },
            "micro-batching off": {**base.as_dict(), "enabled": False},
        }
        measured: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for _ in range(args.passes):
            for name, settings in variants.items():
                mb.configure(MicroBatchingConfig.from_mapping(settings, base))
                batches = corpus.batches(args.batch, args.count + WARM)
                for batch in batches[:WARM]:
                    inprocess.measure_with_cpu(mb, context, [batch, batch])
                cpu, start = time.process_time(), time.perf_counter()
                for batch in batches[WARM:]:
                    inprocess.fresh_batch(context, len(batch))
                    mb(rows_of(batch), context)
                wall_ms = 1000 * (time.perf_counter() - start) / args.count
                cpu_ms = 1000 * (time.process_time() - cpu) / args.count
                measured[name].append((wall_ms, cpu_ms))
        mb.shutdown()
    print(f"batches of {args.batch}, {args.count} a pass, median of {args.passes} passes")
    print("| variant | wall ms a batch | CPU ms a batch | per pass (wall) |")
    print("|---|---|---|---|")
    for name, runs in measured.items():
        walls = ", ".join(f"{w:.3f}" for w, _ in runs)
        print(
            f"| {name} | {statistics.median(w for w, _ in runs):.3f} | "
            f"{statistics.median(c for _, c in runs):.3f} | {walls} |"
        )


if __name__ == "__main__":
    main()
