"""The deadline rule's figures (docs/failures.md, "Which requests fail"): a batch of 16 with
4 bodies that each take 200 ms to refuse, against an all-good batch, on both workers, under
this rule and under halving (``SLOW_FAILURE`` out of reach), through TorchServe's worker
machinery in-process (tests/torchserve/test_slow_failures.py's handler, ``timeout_s: 2``).

    .venv/bin/python benchmarks/dev/slow_failures.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ts_microbatch.core.isolation as isolation  # noqa: E402
from tests.torchserve.test_slow_failures import HANDLER, Worker  # noqa: E402

BAD_AT = {4: (1, 6, 11, 12), 8: (0, 5, 9, 14)}  # one or two in every micro-batch


def main() -> None:
    for rule, threshold in (("slow -> requests", isolation.SLOW_FAILURE), ("halving", 1e9)):
        isolation.SLOW_FAILURE = threshold
        for kind in ("synchronous", "asynchronous"):
            for size, bad_at in BAD_AT.items():
                worker = Worker(kind, Path(tempfile.mkdtemp()) / "s", size, HANDLER, timeout_s=2)
                good = [f"good {n}" for n in range(16)]
                mixed = [f"bad {n}" if n in bad_at else f"good {n}" for n in range(16)]
                worker.send(good)  # the stage's pace
                started = time.monotonic()
                worker.send(good)
                good_s = time.monotonic() - started
                started = time.monotonic()
                statuses = sorted({status for status, _ in worker.send(mixed)})
                mixed_s = time.monotonic() - started
                print(
                    f"{rule}, {kind}, micro-batch {size}: all good {good_s * 1000:.0f} ms, "
                    f"4 slow bad {mixed_s * 1000:.0f} ms, statuses {statuses}",
                    flush=True,
                )
                worker.close()


if __name__ == "__main__":
    main()
