"""Drives apache bench (`ab`) against a TorchServe and reads what it printed, for the
benchmark scripts here whose committed results were measured with it (the package sends
its own load through ts_microbatch.tools.drive)."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ts_microbatch.tools.drive import latencies

AB_MISSING = "`ab` not found: apt-get install apache2-utils (make bench does it)"


class AbError(RuntimeError):
    """`ab` exited with an error."""


def ab_problem() -> str | None:
    """Why `ab` cannot run here, or None when it can."""
    return None if shutil.which("ab") else AB_MISSING


def start_ab(
    url: str,
    body: Path,
    requests: int,
    concurrency: int,
    *,
    token: str | None = None,
    output: Sequence[str] = (),
    content_type: str = "application/octet-stream",
    label: str = "ab",
    progress: Callable[[str], None] | None = None,
) -> Callable[[], str]:
    """Starts `ab` POSTing ``body`` to ``url``; returns a function that waits for it and
    returns its output. ``output`` adds ab's file options (``-e``, ``-g``); ``progress``
    gets ab's "Completed N requests" lines, prefixed with ``label``.

    Raises (from the returned function):
        AbError: ab exited with an error.
    """
    # -k: TorchServe answers ab's HTTP/1.0 requests with "connection: keep-alive" and keeps
    # the socket open, so without keep-alive ab waits on every response until its timeout.
    cmd = ["ab", "-k", "-n", str(requests), "-c", str(concurrency), "-p", str(body)]
    cmd += ["-T", content_type, "-s", "180", *output]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    proc = subprocess.Popen(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr or ():
            if line.startswith("Completed"):
                if progress is not None:
                    progress(f"  {label}: {line.strip()} of {requests}")
            elif not line.startswith("Finished"):
                errors.append(line)

    reader = threading.Thread(target=read_stderr, name="ts-microbatch-ab-stderr", daemon=True)
    reader.start()

    def wait() -> str:
        stdout = proc.stdout.read() if proc.stdout else ""  # the reader thread owns stderr
        proc.wait()
        reader.join(5)
        if proc.returncode != 0:
            raise AbError(f"ab failed ({proc.returncode}): {''.join(errors)}\n{stdout}")
        return stdout

    return wait


def run_ab(
    url: str,
    body: Path,
    requests: int,
    concurrency: int,
    csv_path: Path,
    *,
    token: str | None = None,
    content_type: str = "application/octet-stream",
    label: str = "ab",
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """One `ab` run to its end: its summary (``parse_ab``) and latency percentiles, read
    from the ``-e`` CSV it writes to ``csv_path``."""
    wait = start_ab(
        url,
        body,
        requests,
        concurrency,
        token=token,
        output=["-e", str(csv_path)],
        content_type=content_type,
        label=label,
        progress=progress,
    )
    stdout = wait()
    return parse_ab(stdout), parse_percentiles(csv_path.read_text())


def parse_ab(stdout: str) -> dict[str, float]:
    """The summary numbers of `ab` output."""

    def number(label: str, default: float | None = None) -> float:
        m = re.search(rf"^{re.escape(label)}:\s+([\d.]+)", stdout, flags=re.M)
        if m is None:
            if default is None:
                raise ValueError(f"ab output has no {label!r} line")
            return default
        return float(m.group(1))

    # ab counts a response whose length differs from the first one's as "failed"; JSON
    # predictions vary in length, so those are kept apart from real failures.
    m = re.search(r"\(Connect: \d+, Receive: \d+, Length: (\d+), Exceptions: \d+\)", stdout)
    length = float(m.group(1)) if m else 0.0
    return {
        "complete_requests": number("Complete requests"),
        "failed_requests": number("Failed requests") - length,
        "length_mismatches": length,
        "non_2xx_responses": number("Non-2xx responses", 0.0),
        "requests_per_s": number("Requests per second"),
        "time_taken_s": number("Time taken for tests"),
    }


def parse_percentiles(csv_text: str) -> dict[str, float]:
    """p50/p90/p99/max latency in ms from `ab -e` CSV (percentage served, time in ms)."""
    rows = list(csv.reader(csv_text.strip().splitlines()))[1:]
    table = {int(float(pct)): float(ms) for pct, ms in rows}
    return {"p50_ms": table[50], "p90_ms": table[90], "p99_ms": table[99], "max_ms": table[100]}


def parse_gnuplot(tsv_text: str) -> list[float]:
    """Each request's total time in ms from `ab -g` output (tab-separated, a header line,
    columns starttime, seconds, ctime, dtime, ttime, wait)."""
    lines = tsv_text.strip().splitlines()
    if not lines:
        return []
    column = lines[0].split("\t").index("ttime")
    return [float(line.split("\t")[column]) for line in lines[1:] if line.strip()]


def merge_ab(
    runs: list[dict[str, float]], ttimes_ms: list[float]
) -> tuple[dict[str, float], dict[str, float]]:
    """The summary and percentiles of several `ab` processes run at once (a mix of bodies):
    counts add up, throughput is every request over the longest run, percentiles are of
    every request's time."""
    counts = ("complete_requests", "failed_requests", "length_mismatches", "non_2xx_responses")
    summary = {key: sum(run[key] for run in runs) for key in counts}
    summary["time_taken_s"] = max(run["time_taken_s"] for run in runs)
    summary["requests_per_s"] = summary["complete_requests"] / summary["time_taken_s"]
    return summary, latencies(ttimes_ms)
