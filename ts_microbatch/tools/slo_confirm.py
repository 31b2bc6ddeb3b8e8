"""The latency tuner's third step (``ts_microbatch.tools.tune``): the model's best
configurations on a real TorchServe (``measure.measure``), and the frontend's CPU read
from one.

Every configuration confirmed, the user's current one among them, gets the same geometric
ladder of rates (``LADDER``), from an eighth of the best prediction to 1.4x it, lowest
first, so a prediction 8x too optimistic still finds the rate held; a ladder stops after
``MISSES_TO_STOP`` rates in a row missed the objective. Each rate is offered for at least
``slo_verdict.MIN_ANSWERS`` requests, so its P99 can decide (``slo_verdict``). Slots go to
configurations that differ in more than maxBatchDelay (``confirm_slots``). The frontend's
and the worker's CPU per request, what a server answers closed loop and a request's P99
sent alone (``calibrate``) feed the model's CPU cap, its capacity and its floor, and
``fit`` says where they disagree with the model by more than ``FITS``.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .corpus import Corpus
from .curves import CurveSender, OtherCpu, sustained, without_latencies
from .drive import floor, send_corpus
from .mar import override_mar
from .measure import RegistrationError, Send, measure
from .results import ResultsLog
from .slo_plan import Candidate
from .slo_verdict import MIN_ANSWERS, point

# Rates offered, as shares of the model's prediction: geometric, sqrt(2) apart.
LADDER = (0.125, 0.177, 0.25, 0.354, 0.5, 0.707, 1.0, 1.414)
SECONDS_PER_RATE = 4.0
# A rate is offered for at least as many requests as a verdict needs, but never for more
# than ``MAX_SECONDS_PER_RATE`` (at a rate that low, a point decides nothing: said).
MIN_REQUESTS_PER_RATE = MIN_ANSWERS
MAX_SECONDS_PER_RATE = 60.0
# A request not answered in this long has missed any objective the tuner is asked for;
# waiting longer only makes a rate past capacity cost more.
REQUEST_TIMEOUT_S = 10.0
# Two rates in a row over the objective end a ladder: one can be a shared machine's noise.
MISSES_TO_STOP = 2


def ladder(predicted_per_s: float) -> list[float]:
    """The ``LADDER`` shares of ``predicted_per_s``, from 1 req/s up."""
    rates = sorted({round(predicted_per_s * share, 1) for share in LADDER})
    return [rate for rate in rates if rate >= 1.0] or [1.0]


def rate_requests(rate_per_s: float) -> int:
    """Requests offered at ``rate_per_s`` (the bounds above)."""
    wanted = max(rate_per_s * SECONDS_PER_RATE, MIN_REQUESTS_PER_RATE)
    return max(1, int(min(wanted, rate_per_s * MAX_SECONDS_PER_RATE)))


def confirm_slots(candidates: list[Candidate], count: int) -> list[Candidate]:
    """The first ``count`` candidates the model holds anything with, best first, skipping
    each that differs from one already chosen in maxBatchDelay alone."""
    chosen: list[Candidate] = []
    for c in candidates:
        if len(chosen) < count and c.tail and not any(c.same_but_window(o) for o in chosen):
            chosen.append(c)
    return chosen


def ladder_sender(
    corpus: Corpus,
    rates: list[float],
    slo_p99_ms: float,
    concurrency: int,
    log: Callable[[str], None] = print,
    meter: Callable[[], OtherCpu] | None = OtherCpu,
) -> CurveSender:
    """A ``measure.Send``: the warm-up from parallel clients, then the ladder's rates offered
    open loop (``curves.CurveSender``), lowest first, until ``MISSES_TO_STOP`` in a row
    missed the objective; the curve rides in the summary under ``"curve"``. A rate during
    which other processes kept the machine busy is run once more, and if busy again is
    marked so: it decides nothing (``slo_verdict``)."""

    def stop(rows: list[dict[str, Any]]) -> str:
        last = rows[-MISSES_TO_STOP:]  # none of them held (``curves.sustained``): each missed
        if len(last) == MISSES_TO_STOP and not sustained(last, slo_p99_ms):
            return f"{MISSES_TO_STOP} rates in a row missed {slo_p99_ms:g} ms, the last"
        return ""

    return CurveSender(
        corpus, rates, SECONDS_PER_RATE, concurrency, log, seed=1, stop=stop,
        requests_per_rate=rate_requests, timeout_s=REQUEST_TIMEOUT_S, meter=meter,
    )  # fmt: skip


class Servers(NamedTuple):
    """Where the tuner's servers run: ``mar`` repackaged per configuration in ``out``
    (``--confirm-out``), ``corpus`` sent, each from ``base_config`` (``--ts-config``) when
    given, every run appended to ``record``."""

    mar: Path
    corpus: Corpus
    out: Path
    record: ResultsLog
    base_config: Path | None = None

    def serve(
        self, candidate: Candidate, name: str, send: Send, requests: int, label: str
    ) -> dict[str, Any] | None:
        """One run of ``candidate``, repackaged, on a fresh TorchServe; None when refused."""
        out, first = self.out, self.corpus.bodies[self.corpus.order[0]]
        override_mar(
            self.mar, out / "store" / f"{name}.mar", candidate.settings, candidate.frontend()
        )
        point = {
            "batch_size": candidate.batch_size,
            "max_batch_delay": candidate.window_ms,
            "concurrency": 2 * candidate.batch_size,
            "requests": requests,
            "workers": None,  # the .mar's
        }
        config = {"warmup_requests": 100, "response_timeout": 120}
        try:
            return measure(
                out / "servers" / name,
                out / "store",
                name,
                config,
                point,
                label,
                out / "metrics" / f"{name}.prom",
                send,
                (first.data, first.content_type),
                archive=f"{name}.mar",
                base_config=self.base_config,
            )
        except RegistrationError as err:
            print(f"{label}: not registered: {str(err).splitlines()[0]}", flush=True)
            return None

    def clean(self) -> None:
        """The repackaged .mars and the servers' folders (their logs) gone from ``out``."""
        for scratch in ("store", "servers"):
            shutil.rmtree(self.out / scratch, ignore_errors=True)


class Calibration(NamedTuple):
    """What a short closed-loop run of one configuration measured: the frontend's and the
    worker's CPU milliseconds a request, the requests answered a second, and the floor: the
    P99 of ``FLOOR_REQUESTS`` sent one at a time to the otherwise idle server."""

    frontend_cpu_ms: float
    worker_cpu_ms: float
    answered_per_s: float
    floor_p99_ms: float


# Requests sent one at a time after the calibration's warm-up: a request's latency alone.
FLOOR_REQUESTS = 200
# The calibration run and the model disagreeing by more than this is said above the plan.
FITS = 1.5


class CalibrationSender:
    """A ``measure.Send`` for ``calibrate``: the warm-up from ``concurrency`` clients, then
    the floor (``FLOOR_REQUESTS`` one at a time, before the CPU is read); the measured run
    from ``concurrency`` clients, the floor's P99 in its summary (``floor_p99_ms``)."""

    def __init__(self, corpus: Corpus, concurrency: int) -> None:
        self.corpus, self.concurrency = corpus, concurrency
        self.floor_p99_ms = math.nan

    def __call__(
        self, url: str, token: str | None, requests: int, work: Path, label: str
    ) -> tuple[dict[str, Any], dict[str, float]]:
        summary, latency = send_corpus(url, self.corpus, requests, self.concurrency, token=token)
        if label.endswith("warm-up"):
            self.floor_p99_ms = floor(url, self.corpus, FLOOR_REQUESTS, token=token)["p99_ms"]
            return summary, latency
        return {**summary, "floor_p99_ms": self.floor_p99_ms}, latency


def calibrate(candidate: Candidate, servers: Servers) -> Calibration | None:
    """A short closed-loop run of ``candidate`` (about 5 s of its predicted rate, 100 to
    1,000 requests, ``2 x batchSize`` clients: its batches full); None when the server
    refused the model."""
    requests = int(min(1000, max(100, 5 * candidate.held_per_s)))
    label = f"[frontend CPU] {candidate.describe()}, {requests} requests"
    print(f"\n{label}", flush=True)
    send = CalibrationSender(servers.corpus, 2 * candidate.batch_size)
    try:
        result = servers.serve(candidate, "cpu", send, requests, label)
    finally:
        servers.clean()
    if result is None:
        return None
    measured = Calibration(
        float(result["frontend_cpu_ms_per_request"]),
        float(result.get("workers_cpu_ms_per_request") or 0.0),
        float(result.get("requests_per_s") or 0.0),
        float(result.get("floor_p99_ms", math.nan)),
    )
    servers.record.append(
        {
            "kind": "frontend-cpu",
            **candidate.model_config(),
            "requests": result.get("complete_requests"),
            "frontend_cpu_ms_per_request": measured.frontend_cpu_ms,
            "workers_cpu_ms_per_request": result.get("workers_cpu_ms_per_request"),
            "answered_per_s": measured.answered_per_s,
            "floor_p99_ms": measured.floor_p99_ms,
        }
    )
    print(
        f"{label}: {measured.answered_per_s:.1f} req/s answered; the frontend spent "
        f"{measured.frontend_cpu_ms:.2f} ms of CPU a request, the worker "
        f"{measured.worker_cpu_ms:.2f}; one at a time, P99 {measured.floor_p99_ms:.1f} ms",
        flush=True,
    )
    return measured


def fit(
    calibrated: Calibration, modelled: float, alone_ms: float, scale: float, first: Candidate
) -> list[str]:
    """What the calibration run says of the model, first above the plan when the two differ
    by more than ``FITS``: in what a server answers closed loop, or in a request's P99 alone."""
    said = []
    answered = calibrated.answered_per_s
    capacity = answered / modelled if modelled and answered else 1.0  # 0: not read
    if not 1 / FITS <= capacity <= FITS:
        side = "optimistic" if capacity < 1 else "pessimistic"
        said.append(
            f"WARNING: the model does not fit this model as measured in-process: serving "
            f"{first.describe()} closed loop, the server answered {calibrated.answered_per_s:.1f} "
            f"req/s where the in-process stage costs and the CPU give {modelled:.1f} "
            f"({1 / capacity:.2f}x {side}; the worker's CPU was {scale:.2f}x its in-process "
            f"CPU). Every configuration's capacity below is scaled by {capacity:.2f}."
        )
    floor = calibrated.floor_p99_ms
    if alone_ms > 0 and floor > FITS * alone_ms:
        said.append(
            f"WARNING: the model does not fit this model as measured in-process: one request "
            f"at a time, the server's P99 was {floor:.1f} ms where the model's is "
            f"{alone_ms:.1f} ({floor / alone_ms:.2f}x): {floor - alone_ms:.1f} ms a request "
            "goes outside the stages measured in-process (TorchServe's frontend, the "
            "worker's socket and decoding, the tail of the bodies' lengths). Every P99 below "
            "counts it: each configuration is held to the objective less that."
        )
    return said


def confirm(
    top: list[Candidate], servers: Servers, slo_p99_ms: float, rate: float | None = None
) -> None:
    """Each of ``top`` on a real TorchServe, the same ladder offered open loop to each (from
    the best prediction among them, ``rate`` on it when given); sets each one's ``curve``
    (None when the server refused it) and ``measured_per_s`` (0 when nothing held or
    refused)."""
    rates = ladder(max([c.held_per_s for c in top] + [1.0]))
    if rate is not None and rate not in rates:
        rates = sorted([*rates, rate])
    # At most each rate's schedule, its last requests waiting out the timeout.
    most_s = sum(rate_requests(rate) / rate + REQUEST_TIMEOUT_S for rate in rates)
    few = [rate for rate in rates if rate_requests(rate) < MIN_ANSWERS]
    print(
        f"\nEach configuration is offered {', '.join(f'{r:g}' for r in rates)} req/s, "
        f"{min(rate_requests(r) for r in rates)} requests or more a rate (at most about "
        f"{most_s:.0f} s and a server's start each)"
        + (
            f"; {', '.join(f'{r:g}' for r in few)} req/s get fewer than {MIN_ANSWERS} in "
            f"{MAX_SECONDS_PER_RATE:g} s and decide nothing"
            if few
            else ""
        ),
        flush=True,
    )
    names = iter(f"c{n}" for n in range(1, len(top) + 1))
    for index, candidate in enumerate(top, start=1):
        name = "current" if candidate.current else next(names)
        label = f"[confirm {index}/{len(top)}] {candidate.describe()}"
        modelled = f"predicted {candidate.held_per_s:.0f} req/s" if candidate.tail else ""
        print(f"\n{label}: {modelled or 'not modelled'}", flush=True)
        sender = ladder_sender(servers.corpus, rates, slo_p99_ms, 2 * candidate.batch_size)
        result = servers.serve(candidate, name, sender, 1, label)
        if result is None:  # refused: held nothing
            continue
        curve = candidate.curve = without_latencies(result["curve"])
        candidate.measured_per_s = sustained(curve, slo_p99_ms)
        candidate.frontend_cpu_ms = result.get("frontend_cpu_ms_per_request")
        servers.record.append(
            {
                "kind": "confirmed",
                **candidate.outcome(),
                "frontend_cpu_ms_per_request": candidate.frontend_cpu_ms,
                "curve": curve,
            }
        )
        held = [row for row in curve if row["offered_per_s"] == candidate.measured_per_s]
        print(
            f"{label}: holds {candidate.measured_per_s:g} req/s within P99 {slo_p99_ms:g} ms"
            + (f" ({point(held[0])})" if held else "")
            + (f", predicted {candidate.held_per_s:.0f}" if candidate.tail else ""),
            flush=True,
        )
    servers.clean()
