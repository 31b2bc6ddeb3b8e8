"""Latency against offered load: open-loop sweeps over request rates, and what they mean.

``sweep`` offers rising rates (ts_microbatch.tools.openloop) and keeps a point per rate.
A point lasts long enough for its P99 (``requests_for``), and one during which other
processes used more than ``BUSY_CORES`` (``OtherCpu``) is run once more: on a shared
machine someone else's slow phase lands on whichever point runs then.

The stop rule (``behind``): a point is past capacity when its queue grew through the run
(the last quarter's median latency ``QUEUE_GROWTH_MS`` over the first's), when fewer than
``FELL_BEHIND`` of the requests drawn were answered, or when P99 passed
``GAVE_UP_P99_MS``. The sweep keeps one point past it, then stops (``one_past_behind``):
past saturation every point says the same and each costs a queue's worth of waiting. A
caller may give its own stop rule (the latency tuner's ladder stops on misses of its
objective, ts_microbatch.tools.slo_confirm). ``sustained`` reads a latency objective off a
curve; the report is ts_microbatch.tools.curve_report.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ._cli import OptionError
from .corpus import Corpus
from .cpu import process_cpu
from .drive import floor, send_corpus, summarize
from .intervals import MIN_ANSWERS
from .ledger import SETTLE_SLICE_S, machine_times
from .openloop import BUSY_CORES, OpenLoopResult, run_open_loop

QUEUE_GROWTH_MS = 100.0
FELL_BEHIND = 0.9
GAVE_UP_P99_MS = 10_000.0
OPEN_LOOP_TIMEOUT_S = 60.0

# A sweep's stop rule: its points so far -> why it ends after the last one ("": go on).
StopRule = Callable[[list[dict[str, Any]]], str]


def machine_busy_s() -> float:
    """CPU seconds the cores this process may run on have been busy since boot, the
    hypervisor's steal counted as busy (ts_microbatch.tools.ledger.machine_times)."""
    times = machine_times()
    return times.busy_s + times.steal_s


def own_tree_s() -> float:
    """CPU seconds used by this process, its descendants and the processes of their
    sessions (a TorchServe's frontend outlives its launcher in a session of its own)."""
    import psutil

    me = psutil.Process()
    pids = {me.pid, *(child.pid for child in me.children(recursive=True))}
    sessions = set()
    for pid in pids:
        with contextlib.suppress(OSError):  # exited in between
            sessions.add(os.getsid(pid))
    sessions.discard(os.getsid(0))  # our own session may hold the shell that started us
    for pid in psutil.pids() if sessions else ():
        with contextlib.suppress(OSError):
            if os.getsid(pid) in sessions:
                pids.add(pid)
    return sum(process_cpu(pid) for pid in pids)  # 0 for one that exited in between


class OtherCpu:
    """The cores other processes used during one run: ``start()``, then ``stop()``."""

    def __init__(
        self,
        machine: Callable[[], float] = machine_busy_s,
        ours: Callable[[], float] = own_tree_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._machine, self._ours, self._clock = machine, ours, clock
        self._started: tuple[float, float, float] | None = None

    def start(self) -> None:
        self._started = (self._machine(), self._ours(), self._clock())

    def stop(self) -> float:
        """Cores others used since ``start()`` (NaN when not started or no time passed)."""
        if self._started is None:
            return math.nan
        machine, ours, started = self._started
        wall = self._clock() - started
        if wall <= 0:
            return math.nan
        return max(0.0, (self._machine() - machine) - (self._ours() - ours)) / wall


def behind(row: dict[str, Any]) -> bool:
    """Whether a point is past the model's capacity (the module's stop rule)."""
    return bool(
        row.get("queue_growth_ms", 0.0) > QUEUE_GROWTH_MS
        or row["achieved_per_s"] < FELL_BEHIND * row.get("realized_per_s", row["offered_per_s"])
        or row["p99_ms"] > GAVE_UP_P99_MS
    )


def one_past_behind(rows: list[dict[str, Any]]) -> str:
    """The module's stop rule: the point after the first one ``behind`` is the last."""
    return "one rate past capacity, the last" if len(rows) > 1 and behind(rows[-2]) else ""


def floor_count(args: Any) -> int:
    """The floor's requests a command line asked for: ``--floor-requests``, else
    ``--min-answers`` (the floor's P99 then rests on as many answers as a point's)."""
    return int(args.min_answers if args.floor_requests is None else args.floor_requests)


FLOOR_HELP = (
    "requests sent one at a time on the warmed server before the rates: the floor, one "
    "request's unloaded latency (default: --min-answers; 0: none)"
)


def parse_rates(text: str) -> list[float]:
    """``"20,40,80"`` or ``"20:200:20"`` (start:stop:step, stop included): rising rates.

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
        raise OptionError(f"got {text!r}, expected rates > 0 as 20,40,80 or 20:200:20")
    if sorted(set(rates)) != rates:
        raise OptionError(f"got {text!r}, expected rising rates")
    return rates


def requests_for(rate: float, seconds: float, min_answers: int = MIN_ANSWERS) -> int:
    """Requests a point offers: ``seconds`` of them, and at least ``min_answers``."""
    return max(1, min_answers, math.ceil(rate * seconds))


def sweep(
    url: str,
    bodies: Sequence[bytes],
    rates: Iterable[float],
    *,
    requests_per_rate: int | Callable[[float], int],
    headers: dict[str, str] | None = None,
    seed: int = 0,
    progress: Callable[[dict[str, Any], str], None] | None = None,
    nice: int | None = None,
    meter: Callable[[], OtherCpu] | None = OtherCpu,
    stop: StopRule = one_past_behind,
    timeout_s: float = OPEN_LOOP_TIMEOUT_S,
) -> list[OpenLoopResult]:
    """One result per rate, rising, until ``stop`` gives a reason (``progress`` gets each
    point and that reason, "" until the last). ``requests_per_rate``: a count, or one per
    rate. A point during which others used more than ``BUSY_CORES`` (``meter``) is run
    once more, its first reading kept as ``busy_retried_cores``."""
    run = partial(run_open_loop, url, bodies, headers=headers, timeout_s=timeout_s, nice=nice)
    results: list[OpenLoopResult] = []
    rows: list[dict[str, Any]] = []
    for index, rate in enumerate(rates):
        count = requests_per_rate(rate) if callable(requests_per_rate) else requests_per_rate
        first_cores: float | None = None
        for tries in range(2):
            other = meter() if meter is not None else None
            if other is not None:
                other.start()
            result = run(rate, max(1, count), seed=seed + index + 1000 * tries)
            if other is not None:
                result.other_cpu_cores = other.stop()
            result.busy_retried_cores = first_cores
            if not result.other_cpu_cores > BUSY_CORES:
                break
            first_cores = result.other_cpu_cores
        results.append(result)
        rows.append(result.summary())
        why = stop(rows)
        if progress is not None:
            progress(rows[-1], why)
        if why:
            break
    return results


@dataclass
class CurveSender:
    """A ``measure.Send`` for ``--rates`` and the latency tuner's ladder: the warm-up from
    parallel clients, the measured run a ``sweep`` on the same server (``requests_per_rate``,
    when given, instead of ``requests_for``), its points with their latencies in the
    summary's ``"curve"`` and the summary's figures over every request of the sweep. With
    ``floor_requests``, that many are sent one at a time after the warm-up, before the run
    is measured (``drive.floor``: one request's latency on an idle server, the window
    included), in the measured run's summary as ``"floor"``."""

    corpus: Corpus
    rates: Sequence[float]
    seconds_per_rate: float
    concurrency: int
    log: Callable[[str], None]
    seed: int = 0
    min_answers: int = 50
    nice: int | None = None
    stop: StopRule = one_past_behind
    requests_per_rate: Callable[[float], int] | None = None
    meter: Callable[[], OtherCpu] | None = OtherCpu
    timeout_s: float = OPEN_LOOP_TIMEOUT_S
    floor_requests: int = 0
    _floor: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def _bodies(self, token: str | None) -> tuple[list[bytes], dict[str, str]]:
        """The corpus's bodies in its order and the headers every request carries."""
        corpus = self.corpus
        bodies = [corpus.bodies[i].data for i in corpus.sequence(len(corpus.order))]
        headers = {"Content-Type": corpus.bodies[corpus.order[0]].content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return bodies, headers

    def _measure_floor(self, url: str, token: str | None, label: str) -> dict[str, Any] | None:
        if not self.floor_requests:
            return None
        alone = floor(url, self.corpus, self.floor_requests, token=token)
        self.log(
            f"  {label}: one at a time, P99 {alone['p99_ms']:.1f} ms "
            f"[{alone['p99_low_ms']:.1f}, {alone['p99_high_ms']:.1f}] of {alone['requests']} "
            f"(P50 {alone['p50_ms']:.1f}), {alone['errors']} errors"
        )
        return alone

    def __call__(
        self, url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        if label.endswith("settling"):
            # Open loop at the sweep's middle rate, as the sweep will send: the frontend's
            # JIT compiles the paths small batches take (closed-loop warm-ups left it
            # compiling 0.16-0.36 cores through the fraud scorer's sweeps).
            rate = sorted(self.rates)[len(self.rates) // 2]
            count = max(1, round(rate * SETTLE_SLICE_S))
            bodies, headers = self._bodies(token)
            run_open_loop(url, bodies, rate, count, headers=headers, timeout_s=self.timeout_s)
            return {}, {}
        if label.endswith("warm-up"):
            warmed = send_corpus(url, self.corpus, requests, self.concurrency, token=token)
            self._floor = self._measure_floor(url, token, label)
            return warmed
        # the floor was measured after the warm-up, before the run's CPU and metrics were
        # read; with no warm-up (warmup_requests 0) it is measured here, inside the run
        alone, self._floor = self._floor or self._measure_floor(url, token, label), None
        bodies, headers = self._bodies(token)
        start = time.monotonic()
        rows: list[dict[str, Any]] = []

        def progress(row: dict[str, Any], why: str) -> None:
            rows.append(row)
            others = row["other_cpu_cores"]
            self.log(
                f"  {label} [{time.monotonic() - start:.0f} s]: {row['offered_per_s']:g}/s "
                f"offered, {row['achieved_per_s']:.1f} answered, P99 {row['p99_ms']:.0f} ms "
                f"[{row['p99_low_ms']:.0f}, {row['p99_high_ms']:.0f}] of {row['requests']}, "
                f"{row['late_sends']} late sends"
                + ("" if math.isnan(others) else f", others used {others:.2f} cores")
                + (" (BUSY)" if row["busy"] else "")
                + (f" ({why})" if why else "")
            )

        results = sweep(
            url,
            bodies,
            list(self.rates),
            headers=headers,
            seed=self.seed,
            progress=progress,
            requests_per_rate=self.requests_per_rate
            or (lambda r: requests_for(r, self.seconds_per_rate, self.min_answers)),
            nice=self.nice,
            meter=self.meter,
            stop=self.stop,
            timeout_s=self.timeout_s,
        )
        every = [
            (s.status, math.inf if s.latency_s is None else 1000 * s.latency_s)
            for result in results
            for s in result.sends
        ]
        summary, latency = summarize(
            every, sum(r.elapsed_s for r in results), sum(r.cpu_s for r in results)
        )
        for row, result in zip(rows, results):  # ms to 0.01, None: no answer (JSON has no inf)
            row["latencies_ms"] = [
                None if math.isinf(ms) else round(ms, 2) for ms in result.latencies_ms()
            ]
        summary["curve"] = rows
        if alone is not None:
            summary["floor"] = alone
        return summary, latency


def without_latencies(curve: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A curve's points without their latencies (for summaries and records)."""
    return [{k: v for k, v in p.items() if k != "latencies_ms"} for p in curve]


def latencies_of(point: dict[str, Any]) -> list[float]:
    """A stored point's latencies back (no answer: ``inf``; none stored: empty)."""
    return [math.inf if ms is None else float(ms) for ms in point.get("latencies_ms") or ()]


def sustained(rows: Iterable[dict[str, Any]], slo_p99_ms: float) -> float:
    """The highest offered rate held within the objective: P99 at most ``slo_p99_ms``,
    nothing lost, not ``behind``; 0 if none was."""
    held = [
        row["offered_per_s"]
        for row in rows
        if row["p99_ms"] <= slo_p99_ms
        and row["errors"] == 0
        and row["timeouts"] == 0
        and not behind(row)
    ]
    return max(held, default=0.0)
