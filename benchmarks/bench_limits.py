"""The stage limits behind benchmark-ab.py's "ideal" column, measured in-process: how fast
the handler's preprocess and the scenario's inference go alone on this machine."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bench_lib
import corpus

from ts_microbatch.core.config import MicroBatchingConfig

ROOT = Path(__file__).resolve().parents[1]


def preprocess_rate(
    decoder: str, threads: int, micro_batch_size: int, body: bytes, seconds: float = 3.0
) -> float:
    """Images/s the handler's preprocess reaches on this machine with `threads` threads."""
    import torch

    sys.path.insert(0, str(ROOT / "handlers"))
    from micro_batching_handler import MicroBatchingHandler

    handler = MicroBatchingHandler()
    handler.decoder = decoder
    handler.device = torch.device("cpu")
    rows = [{"body": body}] * micro_batch_size
    handler.preprocess(rows)
    done = [0] * threads
    deadline = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < deadline:
            handler.preprocess(rows)
            done[i] += micro_batch_size

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(loop, range(threads)))
    return sum(done) / (time.perf_counter() - start)


def inference_rate(
    scenario: str, config: dict[str, Any], micro_batch_size: int, threads: int, seconds: float = 3.0
) -> float:
    if scenario == "accelerator":
        cost = config["accelerator"]
        # Sleeps overlap across threads: a device with `threads` streams, by construction.
        return (
            threads
            * micro_batch_size
            * 1000.0
            / (cost["fixed_ms"] + cost["per_item_ms"] * micro_batch_size)
        )
    import torch
    from torchvision.models import resnet18

    model = resnet18(weights=None).eval()
    x = torch.randn(micro_batch_size, 3, 224, 224)
    with torch.inference_mode():
        model(x)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            model(x)
            n += micro_batch_size
    return n / (time.perf_counter() - start)


def stage_limits(
    scenario: str,
    point: dict[str, Any],
    config: dict[str, Any],
    paths: dict[str, Path],
    cache: dict[str, Any],
    log: Callable[[str], None] = print,
) -> dict[str, float] | None:
    """In-process stage rates for the point's body, micro-batch size and threads (None for
    a user's .mar, whose stages are unknown here). For "auto" the largest size it may pick.
    For the mix, each body's preprocess rate is measured and combined by its share."""
    if scenario == "mar":
        return None
    effective = MicroBatchingConfig.from_mapping(point["micro_batching"])
    size = point["micro_batch_size"]
    if size == "auto":
        size = min(point["batch_size"], effective.max_micro_batch_size)
    threads = effective.parallelism
    key = f"{scenario}-{point['body']}-mbs{size}-threads{point['parallelism']}"
    if key not in cache:
        log(f"measuring stage limits for {key} in-process")
        shares = corpus.MIX if point["body"] == "mix" else {point["body"]: 1.0}

        def rate(decoder: str) -> float:
            # Seconds per image add up by share: the mix's rate is the weighted harmonic mean.
            seconds = sum(
                share / preprocess_rate(decoder, threads.preprocess, size, paths[name].read_bytes())
                for name, share in shares.items()
            )
            return sum(shares.values()) / seconds

        cache[key] = {
            "preprocess_ours": rate(config["decoder"]),
            "preprocess_pil": rate("pil"),
            "inference": inference_rate(scenario, config, size, threads.inference),
        }
        log("  " + ", ".join(f"{k} {v:.0f}/s" for k, v in cache[key].items()))
    limits: dict[str, float] = cache[key]
    return limits


def ideal_for(scenario: str, handler: str, limits: dict[str, float], overhead: float) -> float:
    rates = {
        "server": overhead,
        "inference": limits["inference"],
        # ours-same, upstream and plain decode as ImageClassifier does
        "preprocess": limits["preprocess_ours" if handler == "ours" else "preprocess_pil"],
    }
    # On this machine's cores the server's own work (frontend, ab, IPC: the noop run) and
    # preprocessing compete, and so does inference when it runs on the CPU: their
    # per-request times add. The simulated device's sleep does not.
    shared = ("server", "preprocess") + (("inference",) if scenario == "real" else ())
    return bench_lib.ideal_throughput(rates, shared_cpu=shared)
