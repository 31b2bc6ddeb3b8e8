#!/usr/bin/env python3
"""CPU time to read a shape from each body of the hostile-header corpus (issue 40).

    python benchmarks/dev/header_cpu.py [--repeat 5] [--base64] [--reference]

The corpus is tests/torchserve/hostile_headers.py at the reader's cap (1 MiB a body): every
PIL plugin's magic followed by noise, and JPEG, PNG, GIF, BMP, WEBP and TIFF structures
built to make a parser step per byte or per entry. For each body, ``image_shape`` is run
``--repeat`` times after one warm-up (a plugin's first import is not the body's cost) and
the least CPU time (``time.process_time``) kept: the body's cost without the noise of a
shared machine. ``--base64`` also reads each body as base64 text. ``--reference`` times PIL
on a ``BytesIO`` of the whole body (what the handlers run) and checks the reader's answer
against it: the same shape, or None (a PNG whose ancillary chunks PIL refuses, the zTXt and
iTXt bombs, gets its IHDR's shape: images.py says why). Prints the slowest bodies and the
maximum.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.torchserve.hostile_headers import corpus  # noqa: E402
from ts_microbatch.torchserve.images import image_shape  # noqa: E402


def cpu_s(call: Any, repeat: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
    return best


def pil_shape(body: bytes) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(body)) as image:
            return image.size
    except Exception:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base64", action="store_true")
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # PIL's bomb and MPO warnings on hostile headers
    rows, mismatched = [], []
    for name, body in corpus():
        bodies = [(name, body)]
        if args.base64:
            bodies.append((name + " (base64)", base64.b64encode(body).decode("ascii")))
        for label, sent in bodies:
            rows.append((cpu_s(lambda: image_shape(sent), args.repeat), label))  # noqa: B023
        if args.reference:
            shape, want = image_shape(body), pil_shape(body)
            if shape not in (want, None):
                mismatched.append((name, shape, want))
            rows.append((cpu_s(lambda: pil_shape(body), 1), name + " (PIL on BytesIO)"))  # noqa: B023
    rows.sort(reverse=True)
    for seconds, label in rows[:15]:
        print(f"{seconds * 1000:8.3f} ms  {label}")
    reader = [s for s, label in rows if "PIL on" not in label]
    print(f"{len(reader)} bodies read, max {max(reader) * 1000:.3f} ms CPU")
    if args.reference:
        print("shapes that differ from PIL's (None allowed):", mismatched or "none")


if __name__ == "__main__":
    main()
