"""Latency against offered load: open-loop sweeps over request rates, and what they mean.

For one served model, ``sweep`` offers rising request rates (``ts_microbatch.tools.
openloop``: Poisson arrivals sent on schedule) and records, per rate, what was achieved, the
latency percentiles from each request's scheduled time (P99 with its bootstrap interval and
the answers that carry it), errors, timeouts and late sends. Each point lasts long enough
for its P99 (``requests_for``: at least ``min_answers`` requests, 1,500 by the tools'
default, whatever the seconds configured) and the CPU other processes used meanwhile is
measured (ts_microbatch.tools.busy): a point past ``BUSY_CORES`` is run once more.

The stop rule (``behind``): a point is past the model's capacity when its queue grew
through the run (the last quarter's median latency more than ``QUEUE_GROWTH_MS`` over the
first quarter's), when fewer than ``FELL_BEHIND`` of the requests drawn were answered, or
when P99 passed ``GAVE_UP_P99_MS``. The sweep keeps one point past it, then stops: past
saturation every point says the same thing, and each costs a queue's worth of waiting.
``sustained`` reads a latency objective off a curve (the highest rate held with its P99
within it, nothing lost); the tables, comparisons and the plot are in
ts_microbatch.tools.curve_report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .busy import BUSY_CORES, OtherCpu
from .corpus import Corpus
from .drive import send_corpus, summarize
from .intervals import MIN_ANSWERS
from .openloop import OpenLoopResult, run_open_loop

# The stop rule (the module's docstring): any one of these three is past capacity.
QUEUE_GROWTH_MS = 100.0
FELL_BEHIND = 0.9
GAVE_UP_P99_MS = 10_000.0


def behind(row: dict[str, Any]) -> bool:
    """Whether a point is past the model's capacity (module constants)."""
    return bool(
        row.get("queue_growth_ms", 0.0) > QUEUE_GROWTH_MS
        or row["achieved_per_s"] < FELL_BEHIND * row.get("realized_per_s", row["offered_per_s"])
        or row["p99_ms"] > GAVE_UP_P99_MS
    )


def parse_rates(text: str) -> list[float]:
    """``"20,40,80"`` or a range ``"20:200:20"`` (start:stop:step, stop included): rates in
    requests per second, rising.

    Raises:
        ValueError: not numbers > 0, or not rising.
    """
    try:
        if ":" in text:
            start, stop, step = (float(part) for part in text.split(":"))
            if step <= 0:
                raise ValueError
            count = int(math.floor((stop - start) / step + 1e-9)) + 1
            rates = [round(start + i * step, 6) for i in range(count)]
        else:
            rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        rates = []
    if not rates or any(not rate > 0 or not math.isfinite(rate) for rate in rates):
        raise ValueError(f"--rates: got {text!r}, expected rates > 0 as 20,40,80 or 20:200:20")
    if sorted(set(rates)) != rates:
        raise ValueError(f"--rates: got {text!r}, expected rising rates")
    return rates


def requests_for(rate: float, seconds: float, min_answers: int = MIN_ANSWERS) -> int:
    """Requests a point at ``rate`` offers: ``seconds`` of them, and at least
    ``min_answers`` (a P99 needs 1,500 to carry 15 answers above it: at 4 req/s that is
    375 s, not 5 s)."""
    return max(1, min_answers, math.ceil(rate * seconds))


def sweep(
    url: str,
    bodies: Sequence[bytes],
    rates: Iterable[float],
    *,
    requests_per_rate: int | Callable[[float], int],
    headers: dict[str, str] | None = None,
    seed: int = 0,
    timeout_s: float = 60.0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    nice: int | None = None,
    meter: Callable[[], OtherCpu] | None = OtherCpu,
    busy_cores: float = BUSY_CORES,
) -> list[OpenLoopResult]:
    """One result per rate offered, rising, until one past the point where the model fell
    behind (``behind``). ``requests_per_rate``: a count, or one per rate (``requests_for``).
    ``nice``: the generator's niceness (openloop.run_open_loop; None leaves it alone).
    ``meter`` measures the CPU others used during each point; a point where they used more
    than ``busy_cores`` is run once more (its first reading kept as ``busy_retried_cores``)
    and, busy again, kept flagged (``busy`` in its summary)."""
    results: list[OpenLoopResult] = []
    past = False
    for index, rate in enumerate(rates):
        count = requests_per_rate(rate) if callable(requests_per_rate) else requests_per_rate
        tries = 0
        first_cores: float | None = None
        while True:
            other = meter() if meter is not None else None
            if other is not None:
                other.start()
            result = run_open_loop(
                url, bodies, rate, max(1, count), seed=seed + index + 1000 * tries,
                headers=headers, timeout_s=timeout_s, nice=nice,
            )  # fmt: skip
            if other is not None:
                result.other_cpu_cores = other.stop()
            result.busy_retried_cores = first_cores
            tries += 1
            if tries > 1 or not result.other_cpu_cores > busy_cores:
                break
            first_cores = result.other_cpu_cores
        results.append(result)
        row = result.summary()
        if progress is not None:
            progress(row)
        if past:
            break
        past = behind(row)
    return results


def open_loop_bodies(corpus: Corpus, token: str | None) -> tuple[list[bytes], dict[str, str]]:
    """A corpus's bodies in its order, and the headers an open-loop run sends them with (the
    first body's content type, the token when the server wants one)."""
    bodies = [corpus.bodies[i].data for i in corpus.sequence(len(corpus.order))]
    headers = {"Content-Type": corpus.bodies[corpus.order[0]].content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return bodies, headers


class CurveSender:
    """A ``measure.Send`` for the benchmark's ``--rates``: the warm-up from parallel
    clients as usual, the measured run a sweep over ``rates`` on the same server (the
    curve rides in the summary under ``"curve"``; the summary's own figures are over every
    request of the sweep, latency from each one's scheduled send). Each point offers
    ``requests_for(rate, seconds_per_rate, min_answers)`` requests; the sweep's ``nice``
    and busy-machine check are ``sweep``'s. Each curve point keeps its latencies
    (``latencies_ms``, None for no answer) for the ratios between variants."""

    def __init__(
        self,
        corpus: Corpus,
        rates: Sequence[float],
        seconds_per_rate: float,
        concurrency: int,
        log: Callable[[str], None],
        seed: int = 0,
        *,
        min_answers: int = 50,
        nice: int | None = None,
    ) -> None:
        self.corpus = corpus
        self.rates = list(rates)
        self.seconds_per_rate = seconds_per_rate
        self.concurrency = concurrency
        self.log = log
        self.seed = seed
        self.min_answers = min_answers
        self.nice = nice

    def __call__(
        self, url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        if label.endswith("warm-up"):
            return send_corpus(url, self.corpus, requests, self.concurrency, token=token)
        bodies, headers = open_loop_bodies(self.corpus, token)

        def progress(row: dict[str, Any]) -> None:
            self.log(
                f"  {label}: {row['offered_per_s']:g}/s offered, {row['achieved_per_s']:.1f} "
                f"answered, P99 {row['p99_ms']:.0f} ms [{row['p99_low_ms']:.0f}, "
                f"{row['p99_high_ms']:.0f}] of {row['requests']}, {row['late_sends']} late "
                f"sends, others used {row['other_cpu_cores']:.2f} cores"
                + (" (BUSY)" if row["busy"] else "")
            )

        results = sweep(
            url, bodies, self.rates, headers=headers, seed=self.seed, progress=progress,
            requests_per_rate=lambda rate: requests_for(
                rate, self.seconds_per_rate, self.min_answers
            ),
            nice=self.nice,
        )  # fmt: skip
        every = [
            (s.status, math.inf if s.latency_s is None else 1000 * s.latency_s)
            for result in results
            for s in result.sends
        ]
        summary, latency = summarize(
            every, sum(r.elapsed_s for r in results), sum(r.cpu_s for r in results)
        )
        summary["curve"] = [
            {**result.summary(), "latencies_ms": stored_latencies(result)} for result in results
        ]
        return summary, latency


def sustained(rows: Iterable[dict[str, Any]], slo_p99_ms: float) -> float:
    """The highest offered rate held within the objective: P99 at most ``slo_p99_ms``, no
    error nor timeout, and not past the model's capacity (``behind``); 0 if none was."""
    held = [
        row["offered_per_s"]
        for row in rows
        if row["p99_ms"] <= slo_p99_ms
        and row["errors"] == 0
        and row["timeouts"] == 0
        and not behind(row)
    ]
    return max(held, default=0.0)


def stored_latencies(result: OpenLoopResult) -> list[float | None]:
    """A point's latencies for a results file: ms to 0.01, None for no answer (JSON has no
    infinity)."""
    return [None if math.isinf(ms) else round(ms, 2) for ms in result.latencies_ms()]


def latencies_of(point: dict[str, Any]) -> list[float]:
    """A stored point's latencies back (no answer: ``inf``); empty for a point stored
    before they were kept."""
    return [math.inf if ms is None else float(ms) for ms in point.get("latencies_ms") or ()]
