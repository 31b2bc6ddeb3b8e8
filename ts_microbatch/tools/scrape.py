"""Reads the micro-batching metrics back from a TorchServe Prometheus scrape.

``summarize(after, before)`` turns two scrapes of ``/metrics`` into what one model did
between them. Histograms and counters only grow, so their difference is the traffic in
between; a worker restart resets them, and then ``after`` alone counts. From a shell::

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
from ..torchserve import metric_names as names
from ._cli import prog, require_tools


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


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def summarize(after: str, before: str = "", model_name: str | None = None) -> dict[str, Any]:
    """What ``model_name`` (every model if None) did between two scrapes: TorchServe's
    ``requests`` and its means per request (``frontend_queue_ms``, ``frontend_latency_ms``);
    ``batches``, ``micro_batches`` (by size range in ``micro_batch_sizes``), their mean sizes
    and ratio; per stage, the mean time and wait per micro-batch (``stage_ms``,
    ``stage_wait_ms``); ``errors`` by status code; padding, recompiles and tokens. Values with
    nothing to average are NaN. Batch counts come from the exact counters when the metrics
    config declares them (a histogram by interval observes each interval's mean), else from
    the histograms; a Prometheus client may append ``_total`` to a counter's name.
    """
    a, b = parse_prometheus(after), parse_prometheus(before)
    model = {"ModelName": model_name} if model_name else {}
    frontend = {"model_name": model_name} if model_name else {}

    def delta(name: str, **labels: str) -> float:
        now, then = total(a, name, **labels), total(b, name, **labels)
        return now - then if now >= then else now  # a reset: the worker restarted

    def counter(name: str) -> float:
        return delta(name, **model) + delta(f"{name}_total", **model)

    def by_label(name: str, label: str) -> dict[str, int]:  # the non-zero counts
        found = {(s.labels.get(label, ""), s.name) for s in a if s.name in (name, f"{name}_total")}
        counts: dict[str, int] = {}
        for value, named in sorted(found):
            counts[value] = counts.get(value, 0) + int(delta(named, **{label: value}, **model))
        return {value: n for value, n in counts.items() if n}

    def mean_ms(histogram: str, stage: str) -> float:
        seconds = delta(f"{histogram}_sum", Stage=stage, **model)
        return 1000 * _ratio(seconds, delta(f"{histogram}_count", Stage=stage, **model))

    def per_request_ms(name: str) -> float:
        return _ratio(delta(name, **frontend), requests) / 1000

    requests = delta("ts_inference_requests_total", **frontend)
    sizes = by_label(names.MICRO_BATCH_SIZE, "Sizes")
    micro_batches = float(sum(sizes.values()))
    batches, cuts = counter(names.BATCHES), counter(names.MICRO_BATCHES_CUT)
    mean_size = _ratio(requests, cuts)
    if not batches:
        batches = delta(f"{names.MICRO_BATCHES_PER_BATCH}_count", **model)
        cuts = delta(f"{names.MICRO_BATCHES_PER_BATCH}_sum", **model)
        mean_size = _ratio(requests, micro_batches)
    padded = delta(f"{names.PADDED_ITEMS}_sum", **model)
    padded_runs = delta(f"{names.PADDED_ITEMS}_count", **model)
    tokens, padded_tokens = counter(names.TOKENS), counter(names.PADDED_TOKENS)
    return {
        "requests": requests,
        "frontend_queue_ms": per_request_ms("ts_queue_latency_microseconds"),
        "frontend_latency_ms": per_request_ms("ts_inference_latency_microseconds"),
        "batches": batches,
        "micro_batches": micro_batches,
        "micro_batch_sizes": sizes,
        "mean_batch_size": _ratio(requests, batches),
        "mean_micro_batch_size": mean_size,
        "micro_batches_per_batch": _ratio(cuts, batches),
        "stage_ms": {stage: mean_ms(names.STAGE_TIME, stage) for stage in STAGES},
        "stage_wait_ms": {stage: mean_ms(names.QUEUE_TIME, stage) for stage in STAGES},
        "errors": by_label(names.REQUEST_ERRORS, "StatusCode"),
        "padded_per_micro_batch": _ratio(padded, padded_runs),
        "padded_share": _ratio(padded, padded + requests) if padded_runs else math.nan,
        "recompiles": int(counter(names.RECOMPILES)),
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
        return str(resp.read().decode())


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
    require_tools("ts_microbatch.tools.scrape")
    try:
        before = "" if args.interval <= 0 else fetch(args.url)
        printed = 0
        while True:
            time.sleep(max(args.interval, 0.0))
            after = fetch(args.url)
            summary = summarize(after, before, args.model)
            stamp = time.strftime("%H:%M:%S")
            line = f"{summary['requests']:.0f} requests; {format_summary(summary)}"
            print(f"[{stamp}] {line}", flush=True)
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
