"""Sends a corpus to a TorchServe on loopback: parallel clients, bodies in the corpus's order.

The package's one closed-loop load (the benchmark, tune --confirm; a single body is a
corpus of one). Each of ``concurrency`` client threads keeps a connection open and takes
the next body of the corpus's fixed sequence (ts_microbatch.tools.corpus), so every run
sends the same bodies in the same order; unlike `ab` (which benchmarks/ab.py drives),
nothing needs installing. The client's own CPU is reported: on a small machine it
competes with the server.
"""

from __future__ import annotations

import http.client
import itertools
import math
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from .corpus import Corpus
from .intervals import percentile, percentile_interval
from .openloop import collector_paused

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class DriveError(ValueError):
    """The load asked for cannot be sent: not loopback, or no requests or clients."""


def send_corpus(
    url: str,
    corpus: Corpus,
    requests: int,
    concurrency: int,
    *,
    token: str | None = None,
    timeout_s: float = 180.0,
    label: str = "corpus",
    progress: Callable[[str], None] | None = None,
    record: list[tuple[int, float]] | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """POSTs ``requests`` bodies of ``corpus`` (its ``sequence``) to ``url`` from
    ``concurrency`` clients at once; returns a summary with ab's keys (plus ``statuses``
    and ``client_cpu_ms_per_request``) and P50/P90/P99/max over every request. Each
    request's (status, ms), 0 for no answer, is appended to ``record`` when given.

    Raises:
        DriveError: ``url`` is not on 127.0.0.1, or ``requests``/``concurrency`` below 1.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in LOOPBACK_HOSTS:
        raise DriveError(f"url: got {url!r}, expected a server on 127.0.0.1 (loopback only)")
    if requests < 1 or concurrency < 1:
        raise DriveError(f"got {requests} requests and {concurrency} clients, expected >= 1 each")
    clients = min(concurrency, requests)
    sequence = corpus.sequence(requests)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    target = parts.path or "/"
    results: list[tuple[int, float]] = [(0, math.nan)] * requests
    counter = itertools.count()  # next() on it is atomic in CPython: each index goes once
    done = itertools.count(1)
    step = max(1, requests // 10)
    start = threading.Barrier(clients + 1)

    def client() -> None:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
        start.wait()
        try:
            while (i := next(counter)) < requests:
                body = corpus.bodies[sequence[i]]
                sent = time.perf_counter()
                try:
                    conn.request(
                        "POST",
                        target,
                        body=body.data,
                        headers={**headers, "Content-Type": body.content_type},
                    )
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except Exception:  # any failure is this request's alone: no answer
                    status = 0
                    conn.close()  # the next request opens a new connection
                results[i] = (status, 1000 * (time.perf_counter() - sent))
                finished = next(done)
                if progress is not None and (finished % step == 0 or finished == requests):
                    progress(f"  {label}: Completed {finished} requests of {requests}")
        finally:
            conn.close()

    threads = [
        threading.Thread(target=client, name=f"ts-microbatch-client-{k}", daemon=True)
        for k in range(clients)
    ]
    with collector_paused():  # a full collection would stop every client's clock
        for thread in threads:
            thread.start()
        cpu_before = time.process_time()
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
        cpu_s = time.process_time() - cpu_before
    if record is not None:
        record.extend(results)
    return summarize(results, elapsed, cpu_s)


def floor(url: str, corpus: Corpus, requests: int, *, token: str | None = None) -> dict[str, Any]:
    """One request's latency on an idle server: ``requests`` bodies sent one at a time
    (each after the last answer), P50 and P99 (with its bootstrap interval) over all of
    them, a request with no answer counted as lost (``inf``), and ``errors`` (no answer or
    not 2xx). The frontend's window is in it: a request alone waits the whole
    ``maxBatchDelay`` for a batch that never fills, one under load may not."""
    record: list[tuple[int, float]] = []
    send_corpus(url, corpus, requests, 1, token=token, record=record)
    times = [ms if status else math.inf for status, ms in record]
    errors = sum(1 for status, _ in record if not 200 <= status < 300)
    p99 = percentile_interval(times, 99)
    return {
        "requests": requests,
        "answers": requests - errors,
        "errors": errors,
        "p50_ms": round(percentile(times, 50), 2),
        "p99_ms": round(p99.value, 2),
        "p99_low_ms": round(p99.low, 2),
        "p99_high_ms": round(p99.high, 2),
    }


def summarize(
    results: list[tuple[int, float]], elapsed_s: float, cpu_s: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """(status, ms) per request, 0 for no answer: ab's summary keys and the percentiles."""
    statuses = Counter(status for status, _ in results)
    failed = statuses.get(0, 0)
    non_2xx = sum(n for status, n in statuses.items() if status and not 200 <= status < 300)
    times = [ms for _, ms in results]
    summary: dict[str, Any] = {
        "complete_requests": float(len(results)),
        "failed_requests": float(failed),
        "length_mismatches": 0.0,  # ab's notion; every response is read whole here
        "non_2xx_responses": float(non_2xx),
        "requests_per_s": len(results) / elapsed_s if elapsed_s > 0 else math.nan,
        "time_taken_s": elapsed_s,
        "client_cpu_ms_per_request": 1000 * cpu_s / len(results) if results else math.nan,
        "statuses": {str(status or "no answer"): n for status, n in sorted(statuses.items())},
    }
    return summary, latencies(times)


def latencies(times_ms: Sequence[float]) -> dict[str, float]:
    """P50, P90, P99 and the longest of requests' times, as the benchmarks report them."""
    return {
        "p50_ms": percentile(times_ms, 50),
        "p90_ms": percentile(times_ms, 90),
        "p99_ms": percentile(times_ms, 99),
        "max_ms": max(times_ms) if times_ms else math.nan,
    }
