"""Reads the micro-batching metrics back from a TorchServe Prometheus scrape.

``summarize(after, before)`` turns two scrapes of ``/metrics`` (the metrics address) into
what happened between them for one model: mean time per micro-batch in each stage, mean
wait before each stage, mean micro-batch size, micro-batches per frontend batch and errors
by status code, next to TorchServe's own request count and queue time. Histograms and
counters only grow, so the difference of two scrapes is the traffic between them; a worker
restart resets them, and then the ``after`` scrape alone is summarized.

From a shell, against a running TorchServe's metrics address::

    python -m ts_microbatch.tools.scrape http://127.0.0.1:8082/metrics --model resnet-18_mb \
        --interval 10

prints one summary line for every 10 s of traffic (``--count N`` stops after N lines).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import urllib.request
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..core.config import STAGES
from ..torchserve.metrics import (
    BATCHES,
    MICRO_BATCH_SIZE,
    MICRO_BATCHES_CUT,
    MICRO_BATCHES_PER_BATCH,
    PADDED_ITEMS,
    PADDED_TOKENS,
    QUEUE_TIME,
    RECOMPILES,
    REQUEST_ERRORS,
    STAGE_TIME,
    TOKENS,
)
from ._cli import prog


class Sample(NamedTuple):
    """One line of a Prometheus text scrape."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text-format scrape, read by prometheus_client's parser
    (which accepts the trailing comma TorchServe writes inside label braces)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        Sample(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _delta(after: list[Sample], before: list[Sample], name: str, **labels: str) -> float:
    now, then = total(after, name, **labels), total(before, name, **labels)
    return now - then if now >= then else now  # a reset: the worker restarted


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def summarize(after: str, before: str = "", model_name: str | None = None) -> dict[str, Any]:
    """What ``model_name`` (every model if None) did between two scrapes.

    Returns a dict with ``requests`` (TorchServe's ``ts_inference_requests_total``),
    ``frontend_queue_ms`` and ``frontend_latency_ms`` (means per request, as TorchServe
    measures them), ``batches`` (frontend batches: the ``MicroBatchBatches`` counter when the
    metrics config declares it, else the histogram's count), ``micro_batches`` (the
    ``MicroBatchSize`` counter: one per micro-batch, over every size range),
    ``micro_batch_sizes`` (of those, how many by size range: "1", "2", "3-4", ...),
    ``mean_batch_size`` and ``mean_micro_batch_size`` (requests per batch and per
    micro-batch cut, from the counters; else from the histograms), ``micro_batches_per_batch``,
    ``stage_ms`` and ``stage_wait_ms`` (per stage, mean per micro-batch; by interval, the mean
    of the intervals' means), ``errors``
    (requests answered with an error, by status code), ``padded_per_micro_batch`` and
    ``padded_share`` (items added to reach an allowed size, per padded-stage micro-batch and
    as a share of the items that stage ran; NaN without allowed sizes) and ``recompiles``
    (a compiled model's compiles on the request path), ``tokens``, ``padded_tokens`` and
    ``useful_token_share`` (with length settings: the items' tokens, what they were padded
    to, and the first over the second). Values with nothing to average are NaN.
    Micro-batches re-run to isolate a failing request count again in the sizes.
    """
    a, b = parse_prometheus(after), parse_prometheus(before)
    model = {"ModelName": model_name} if model_name else {}
    frontend = {"model_name": model_name} if model_name else {}

    def delta(name: str, **labels: str) -> float:
        return _delta(a, b, name, **labels)

    def mean_ms(histogram: str, stage: str) -> float:
        seconds = delta(f"{histogram}_sum", Stage=stage, **model)
        return 1000 * _ratio(seconds, delta(f"{histogram}_count", Stage=stage, **model))

    requests = delta("ts_inference_requests_total", **frontend)
    batches = delta(f"{MICRO_BATCHES_PER_BATCH}_count", **model)
    # A counter by size range (a Prometheus client may append _total to a counter's name).
    size_names = (MICRO_BATCH_SIZE, f"{MICRO_BATCH_SIZE}_total")
    ranges = sorted({(s.labels.get("Sizes", ""), s.name) for s in a if s.name in size_names})
    sizes: dict[str, int] = {}
    for label, name in ranges:
        sizes[label] = sizes.get(label, 0) + int(delta(name, Sizes=label, **model))
    micro_batches = float(sum(sizes.values()))
    cuts = delta(f"{MICRO_BATCHES_PER_BATCH}_sum", **model)
    sized, mean_size = requests, _ratio(requests, micro_batches)
    # The exact counters (metric lines by interval make each histogram observation an
    # interval's mean); without them (a metrics config that does not declare them) the
    # MicroBatchesPerBatch histogram and the MicroBatchSize counter.
    counted = delta(BATCHES, **model) + delta(f"{BATCHES}_total", **model)
    if counted:
        batches = counted
        cuts = delta(MICRO_BATCHES_CUT, **model) + delta(f"{MICRO_BATCHES_CUT}_total", **model)
        sized, mean_size = requests, _ratio(requests, cuts)
    # A Prometheus client may append _total to a counter's name.
    error_samples = [s for s in a if s.name in (REQUEST_ERRORS, f"{REQUEST_ERRORS}_total")]
    errors = {
        code: int(delta(name, StatusCode=code, **model))
        for code, name in sorted({(s.labels.get("StatusCode", ""), s.name) for s in error_samples})
    }
    padded, padded_runs = (
        delta(f"{PADDED_ITEMS}_sum", **model),
        delta(f"{PADDED_ITEMS}_count", **model),
    )
    recompiles = delta(RECOMPILES, **model) + delta(f"{RECOMPILES}_total", **model)
    tokens = delta(TOKENS, **model) + delta(f"{TOKENS}_total", **model)
    padded_tokens = delta(PADDED_TOKENS, **model) + delta(f"{PADDED_TOKENS}_total", **model)
    return {
        "requests": requests,
        "frontend_queue_ms": _ratio(delta("ts_queue_latency_microseconds", **frontend), requests)
        / 1000,
        "frontend_latency_ms": _ratio(
            delta("ts_inference_latency_microseconds", **frontend), requests
        )
        / 1000,
        "batches": batches,
        "micro_batches": micro_batches,
        "micro_batch_sizes": {k: n for k, n in sizes.items() if n},
        "mean_batch_size": _ratio(sized, batches),
        "mean_micro_batch_size": mean_size,
        "micro_batches_per_batch": _ratio(cuts, batches),
        "stage_ms": {stage: mean_ms(STAGE_TIME, stage) for stage in STAGES},
        "stage_wait_ms": {stage: mean_ms(QUEUE_TIME, stage) for stage in STAGES},
        "errors": {code: n for code, n in errors.items() if n},
        "padded_per_micro_batch": _ratio(padded, padded_runs),
        "padded_share": _ratio(padded, padded + sized) if padded_runs else math.nan,
        "recompiles": int(recompiles),
        "tokens": int(tokens),
        "padded_tokens": int(padded_tokens),
        "useful_token_share": _ratio(tokens, padded_tokens),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """One line for a log: per-stage times, sizes and errors."""
    if not summary["micro_batches"]:
        return "no micro-batches"
    ran, waited = summary["stage_ms"], summary["stage_wait_ms"]
    stages = ", ".join(
        f"{stage} {ran[stage]:.1f} ms (waited {waited[stage]:.1f})" for stage in STAGES
    )
    errors = ", ".join(f"{n}x{code}" for code, n in summary["errors"].items()) or "none"
    line = (
        f"per micro-batch: {stages}; micro-batch size {summary['mean_micro_batch_size']:.1f}, "
        f"{summary['micro_batches_per_batch']:.1f} per batch of {summary['mean_batch_size']:.1f}; "
        f"errors {errors}"
    )
    padded = summary.get("padded_per_micro_batch", math.nan)
    if not math.isnan(padded):
        line += f"; padded {padded:.2f} items per micro-batch ({summary['padded_share']:.0%})"
    if summary.get("padded_tokens"):
        line += (
            f"; tokens {summary['useful_token_share']:.0%} useful "
            f"({summary['tokens']} of {summary['padded_tokens']} padded)"
        )
    if summary.get("recompiles"):
        line += f"; {summary['recompiles']} recompiles on the request path"
    return line


def fetch(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text: str = resp.read().decode()
        return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("ts_microbatch.tools.scrape"),
        description="Per-stage times, micro-batch sizes and errors from TorchServe's /metrics.",
    )
    parser.add_argument("url", help="the metrics address's /metrics URL")
    parser.add_argument("--model", default=None, help="one model's metrics (default: all)")
    parser.add_argument(
        "--interval", type=float, default=0.0, help="seconds between lines (0: once, in total)"
    )
    parser.add_argument("--count", type=int, default=0, help="stop after N lines (0: never)")
    args = parser.parse_args(argv)
    try:
        before = "" if args.interval <= 0 else fetch(args.url)
        printed = 0
        while True:
            time.sleep(max(args.interval, 0.0))
            after = fetch(args.url)
            summary = summarize(after, before, args.model)
            stamp = time.strftime("%H:%M:%S")
            print(f"[{stamp}] {summary['requests']:.0f} requests; {format_summary(summary)}")
            sys.stdout.flush()
            printed += 1
            if args.interval <= 0 or printed == args.count:
                return 0
            before = after
    except OSError as err:
        print(f"error: cannot read {args.url}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
