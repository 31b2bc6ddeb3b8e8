#!/usr/bin/env python3
"""The text-of-variable-length benchmark's two steps besides running it
(benchmarks/text_lengths.sh runs everything):

    python benchmarks/text_lengths.py pick RUN/sweep --mar bert_mb.mar --out RUN/bert_ours.mar
    python benchmarks/text_lengths.py report RUN --out benchmarks/results/text_lengths

``pick`` reads a one-round sweep of our length settings (benchmark-ab.py ``--mar`` results)
and writes the .mar with the fastest one as packaged; ``report`` gathers the runs of every
corpus and batch size into results.json, results.csv, tables.md and plot.png: medians,
per-round ratios, CPU per request, the useful-token share, and each target met or not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from text_lengths_report import report  # noqa: E402

from ts_microbatch.tools.mar import override_mar  # noqa: E402


def pick(sweep: Path, mar: Path, out: Path) -> dict[str, Any]:
    """The sweep's fastest variant (its median run's throughput); ``out``: ``mar`` with its
    override (none for "ours", the .mar as packaged). Writes ``out``.choice.json."""
    data = json.loads((sweep / "results.json").read_text())
    best = max(data["results"], key=lambda row: row["requests_per_s"])
    override = data["variants"][best["handler"]]["override"]
    effective = override_mar(mar, out, override)
    choice = {
        "variant": best["handler"],
        "override": override,
        "micro_batching": effective,
        "sweep": {r["handler"]: round(r["requests_per_s"], 1) for r in data["results"]},
    }
    Path(f"{out}.choice.json").write_text(json.dumps(choice, indent=2) + "\n")
    print(f"picked {best['handler']} ({choice['sweep']}): {json.dumps(effective)}")
    return choice


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pick")
    p.add_argument("sweep", type=Path)
    p.add_argument("--mar", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report")
    r.add_argument("run", type=Path)
    r.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "pick":
        pick(args.sweep, args.mar, args.out)
    else:
        report(args.run, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
