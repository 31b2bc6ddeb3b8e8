"""One measured run: a fresh TorchServe, one model, warm-up, the load, what the server spent.

The one runner under ``ts-microbatch-benchmark`` (and benchmarks/) and the latency tuner's
``tune --confirm``. ``measure`` registers a model on a new TorchServe on
loopback, warms it up, sends the measured load through a ``Send`` (``corpus_sender``
or an open-loop sweep such as ``curves.CurveSender``) and returns one row:
throughput and latency, the CPU each request cost the frontend and the worker
(ts_microbatch.tools.cpu), where the machine's cores went (ts_microbatch.tools.ledger),
sample answers, and the pipeline's own numbers from the
difference of two ``/metrics`` scrapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from .corpus import Corpus
from .cpu import cpu_per_request, read_cpu, server_pids
from .drive import send_corpus
from .ledger import ledger, read_ledger, settle_frontend
from .runs import summarize
from .scrape import summarize as summarize_scrape
from .server import DEFAULT_PROPERTIES, TorchServe, TorchServeError

# (url, token, requests, work directory, label) -> (drive's summary, latency percentiles)
Send = Callable[[str, Optional[str], int, Path, str], tuple[dict[str, Any], dict[str, float]]]


class RegistrationError(TorchServeError):
    """TorchServe refused to register a model (its config, its handler); the model log says why."""


def server_for(
    store: Path,
    workdir: Path,
    metrics_mode: str | None,
    base_config: Path | None = None,
    env: dict[str, str] | None = None,
) -> TorchServe:
    """A TorchServe on free loopback ports from ``base_config`` (a config.properties, its
    settings kept but ``metrics_mode`` when one is given), else DEFAULT_PROPERTIES."""
    properties = {} if base_config else dict(DEFAULT_PROPERTIES)
    if metrics_mode is not None:
        properties["metrics_mode"] = metrics_mode
    return TorchServe(
        model_store=store,
        workdir=workdir,
        properties=properties,
        base_config=base_config,
        env=dict(env or {}),
    )


def measure(
    server_dir: Path,
    store: Path,
    model: str,
    config: dict[str, Any],
    point: dict[str, Any],
    label: str,
    scrape_path: Path,
    send: Send,
    sample: tuple[bytes, str] | None,
    archive: str | None = None,
    base_config: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One server (``server_for``), one model (the store's ``archive``, a .mar, when given;
    else its directory ``model``), warm-up then the measured run through ``send``.
    ``config``: ``warmup_requests``, ``response_timeout``, ``settle_s`` (at most that long
    warming until the frontend's JIT settles, ``ledger.settle_frontend``, before the last
    warm-up: the label's ``settling`` sends); ``point``: ``batch_size``,
    ``max_batch_delay``, ``workers`` (None: the .mar's), ``concurrency``, ``requests``;
    ``sample`` (body, content type): answers saved beside the scrape (``scrape_path``). The
    server reports in prometheus mode whatever ``base_config`` says: the pipeline's numbers
    are scraped.

    Raises:
        RegistrationError: TorchServe refused the model.
    """
    with server_for(store, server_dir, "prometheus", base_config, env) as server:
        resp = server.register(
            archive or model,
            model_name=model if archive else None,
            batch_size=point["batch_size"],
            max_batch_delay_ms=point["max_batch_delay"],
            initial_workers=point["workers"] or 1,
            response_timeout_s=config["response_timeout"],
        )
        if resp.status != 200:
            raise RegistrationError(
                f"registering {model} failed: {resp.status} {resp.body!r}\n{server.log()[-3000:]}"
            )
        described = served_workers(server, model, point["workers"])
        # What the server batches with (TorchServe 0.12 takes the registration's window
        # over the .mar's model-config.yaml): recorded, so a run shows it.
        frontend = {k: described.get(k) for k in ("batchSize", "maxBatchDelay")}
        url = f"{server.inference_url}/predictions/{model}"
        token = server.token("inference")
        server_dir.mkdir(parents=True, exist_ok=True)
        settled = None
        if config["warmup_requests"]:
            # every client sends at least one warm-up request
            warmup = max(config["warmup_requests"], point["concurrency"])
            settled = settle_frontend(
                lambda: send(url, token, warmup, server_dir, f"{label} settling"),
                server_pids(server)[0],
                config.get("settle_s", 0.0),
            )
            send(url, token, warmup, server_dir, f"{label} warm-up")
        before = settled_scrape(server)
        pids = server_pids(server)
        cpu_before = read_ledger(*pids)
        summary, latency = send(url, token, point["requests"], server_dir, label)
        cpu_after = read_ledger(*server_pids(server))  # a worker restarted shows
        cpu_ms = cpu_per_request(cpu_before.server, cpu_after.server, summary["complete_requests"])
        samples: list[dict[str, Any]] = []
        if sample is not None:
            samples = sample_responses(server, model, *sample)
            samples_path = scrape_path.parent.parent / "samples" / f"{scrape_path.stem}.json"
            samples_path.parent.mkdir(parents=True, exist_ok=True)
            samples_path.write_text(json.dumps(samples, indent=2) + "\n")
        after = settled_scrape(server)
        scrape_path.parent.mkdir(parents=True, exist_ok=True)
        scrape_path.write_text(after)
        pipeline = summarize_scrape(after, before, model)
    queue_times = [pipeline["frontend_queue_ms"]] if pipeline else []
    result = {
        **summary,
        **latency,
        **cpu_ms,
        "ledger": ledger(cpu_before, cpu_after),
        "settled": settled,
        "served_frontend": frontend,
        "served_workers": len(described["workers"]),
        "errors": int(summary["failed_requests"] + summary["non_2xx_responses"]),
        "server_queue_ms": summarize(queue_times),
        "mean_batch_size": float("nan"),  # the pipeline's, when it has one
        "sample_lengths": sorted({s["length"] for s in samples}),
    }
    if pipeline is not None:
        result.update(flatten_pipeline(pipeline))
    return result


def served_workers(server: TorchServe, model: str, workers: int | None) -> dict[str, Any]:
    """``model`` described once it has ``workers`` workers (None: as many as its .mar's
    minWorkers started), scaled to them if need be: a .mar's count wins over the
    registration's initial_workers.

    Raises:
        RegistrationError: TorchServe would not scale it so.
    """
    described = server.describe(model)
    if workers is None or len(described["workers"]) == workers:
        return described
    scaled = server.scale(model, workers)
    described = server.describe(model)
    if len(described["workers"]) != workers:
        raise RegistrationError(
            f"{model} has {len(described['workers'])} workers, not the {workers} asked for: "
            f"{scaled.status} {scaled.body!r}"
        )
    return described


def flatten_pipeline(pipeline: dict[str, Any]) -> dict[str, Any]:
    """ts_microbatch.tools.scrape.summarize's result as result-row columns (and kept whole);
    the token counts are None when nothing counted them."""
    row: dict[str, Any] = {"pipeline": pipeline}
    for key in ("mean_batch_size", "mean_micro_batch_size", "micro_batches_per_batch"):
        row[key] = pipeline[key]
    for key in ("tokens", "padded_tokens", "useful_token_share"):
        row[key] = pipeline.get(key)
    for stage, ms in pipeline["stage_ms"].items():
        row[f"{stage}_ms"] = ms
        row[f"{stage}_wait_ms"] = pipeline["stage_wait_ms"][stage]
    return row


def corpus_sender(
    corpus: Corpus, concurrency: int, progress: Callable[[str], None] | None = None
) -> Send:
    """A ``Send``: ``corpus`` in its order from ``concurrency`` parallel clients (drive.py)."""

    def send(url: str, token: str | None, requests: int, work: Path, label: str) -> Any:
        shown = None if label.endswith("settling") else progress  # slices unannounced
        return send_corpus(
            url, corpus, requests, concurrency, token=token, label=label, progress=shown
        )

    return send


def sample_responses(
    server: TorchServe, model: str, body: bytes, content_type: str
) -> list[dict[str, Any]]:
    """Sample answers kept with each run: 2 sent alone (micro-batches of 1) and 8 at once.
    oneDNN chooses kernels by batch size, so JSON answers can differ by a byte or two
    between the two; the samples show it."""

    def one(_: int) -> dict[str, Any]:
        resp = server.predict(model, body, content_type=content_type)
        return {"status": resp.status, "length": len(resp.body), "body": resp.body.decode()}

    alone = [one(i) for i in range(2)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(one, range(8)))
    return alone + together


def settled_scrape(server: TorchServe, timeout_s: float = 10.0, apart_s: float = 1.5) -> str:
    """A scrape of /metrics once the backend's metric lines have reached the frontend: two
    scrapes ``apart_s`` apart that agree on every sample but the host gauges. The worker
    sends an interval's lines when it ends (``metrics_interval_s``, 1 s by default), so
    scrapes closer together agree while the last interval's lines are still unsent: a
    short run read so had no pipeline metrics at all."""
    previous = None
    deadline = time.monotonic() + timeout_s
    while True:
        text = server.scrape_metrics()
        counted = [line for line in text.splitlines() if 'Level="Host"' not in line]
        if counted == previous or time.monotonic() > deadline:
            return text
        previous = counted
        time.sleep(apart_s)  # the frontend has no "metrics flushed" event to wait on


def cpu_seconds(server: TorchServe) -> dict[str, float]:
    reading = read_cpu(server)
    return {"frontend": reading.frontend_s, "workers": reading.workers_s}
