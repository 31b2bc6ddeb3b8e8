"""An open-loop load generator: requests sent on their schedule, answered or not.

A closed-loop client (``ab -c N``) waits for each answer before it sends again, so when the
server slows down the load drops with it. Here Poisson arrivals are drawn first (seeded)
and each request is sent at its time whether or not earlier ones were answered, as wrk2
and Triton's perf_analyzer do; latency counts from the **scheduled** time, so a send the
generator made late is charged to the result, and counted. One asyncio loop drives
HTTP/1.1 keep-alive connections on loopback. The generator's own CPU is reported, since on
a small machine it competes with the server for the same cores.

Python's cyclic collector is off while a run is measured (``collector_paused``): a full
collection in a process that imported torch stops every send and every answer's clock for
100 ms or more, which the run would charge to the server.

A run may raise the generator's priority (``nice``, e.g. ``GENERATOR_NICE``; root or
CAP_SYS_NICE only). It is off unless asked: beside a TorchServe that serves real traffic,
a generator at -10 takes the cores ahead of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .intervals import percentile, percentile_interval

# A send this much after its scheduled time counts as late (the loop's own timer wake-ups
# were up to 3-5 ms late at P99 against a server that does nothing).
LATE_AFTER_S = 0.005
GENERATOR_NICE = -10  # a study's, ahead of the server it measures; never the default
# A tenth of a core used by others through a run flags it busy (one stall of 10 ms a
# second lands on 1% of the requests).
BUSY_CORES = 0.10


def poisson_schedule(rate_per_s: float, count: int, seed: int = 0) -> list[float]:
    """``count`` arrival offsets (s, the first at 0) of a Poisson process at ``rate_per_s``."""
    if not rate_per_s > 0 or not math.isfinite(rate_per_s):
        raise ValueError(f"rate_per_s: got {rate_per_s!r}, expected a number > 0")
    if count < 1:
        raise ValueError(f"count: got {count!r}, expected an integer >= 1")
    rng = random.Random(seed)
    return [0.0, *itertools.accumulate(rng.expovariate(rate_per_s) for _ in range(count - 1))]


@dataclass
class Sent:
    """One request: when it was due and sent, when answered (None: not), and its status
    (0: no answer, the connection failed or the timeout passed)."""

    due_s: float
    sent_s: float = math.nan
    done_s: float | None = None
    status: int = 0

    @property
    def latency_s(self) -> float | None:
        """From its scheduled time to its answer."""
        return None if self.done_s is None else self.done_s - self.due_s

    @property
    def late_s(self) -> float:
        return self.sent_s - self.due_s


@dataclass
class OpenLoopResult:
    offered_per_s: float
    sends: list[Sent]
    elapsed_s: float  # from the first scheduled send to the last answer
    cpu_s: float  # the generator's own CPU over the run
    errors: dict[int, int] = field(default_factory=dict)  # status (0: none) -> count
    nice: int = 0  # the generator's niceness during the run
    # Cores other processes used during the run (curves.OtherCpu; NaN: not measured), and
    # what they used in a first try that was run again for it.
    other_cpu_cores: float = math.nan
    busy_retried_cores: float | None = None
    started_at: float = math.nan  # time.monotonic() of the schedule's zero (a study's clock)

    def latencies_ms(self) -> list[float]:
        """Every request's latency from its scheduled time, in the order sent (``inf``:
        never answered)."""
        return [
            math.inf if s.latency_s is None or s.status == 0 else 1000 * s.latency_s
            for s in self.sends
        ]

    @property
    def answered(self) -> list[Sent]:
        return [s for s in self.sends if s.status == 200]

    @property
    def _span_s(self) -> float:
        """The span the requests were offered in: the last scheduled send plus a mean gap."""
        return self.sends[-1].due_s + 1 / self.offered_per_s if self.sends else 0.0

    @property
    def realized_per_s(self) -> float:
        """The rate the schedule drew (150 at 30/s span 5 s give or take 0.4)."""
        return len(self.sends) / self._span_s if self._span_s > 0 else 0.0

    @property
    def achieved_per_s(self) -> float:
        """Answers 200 a second over the offered span: the rate drawn when every request is
        answered, however long the last answers took."""
        return len(self.answered) / self._span_s if self._span_s > 0 else 0.0

    @property
    def queue_growth_ms(self) -> float:
        """The last quarter's median latency over the first quarter's: about 0 while the
        server keeps up, growing with a queue that grows through the run."""
        quarter = max(1, len(self.sends) // 4)

        def median(sends: list[Sent]) -> float:
            values = sorted(math.inf if s.latency_s is None else s.latency_s for s in sends)
            return values[len(values) // 2]

        return 1000 * (median(self.sends[-quarter:]) - median(self.sends[:quarter]))

    def percentile_ms(self, q: float) -> float:
        """The ``q``-th percentile (nearest rank) of ``latencies_ms``."""
        return percentile(self.latencies_ms(), q)

    def summary(self) -> dict[str, Any]:
        """The point's figures; P99 with its bootstrap 95% interval and ``answers``, the
        samples that carry it."""
        p99 = percentile_interval(self.latencies_ms(), 99)
        late_ms = [1000 * max(0.0, s.late_s) for s in self.sends]  # 0 when on time
        return {
            "offered_per_s": round(self.offered_per_s, 2),
            "realized_per_s": round(self.realized_per_s, 2),
            "achieved_per_s": round(self.achieved_per_s, 2),
            "requests": len(self.sends),
            "p50_ms": round(self.percentile_ms(50), 2),
            "p90_ms": round(self.percentile_ms(90), 2),
            "p99_ms": round(p99.value, 2),
            "p99_low_ms": round(p99.low, 2),
            "p99_high_ms": round(p99.high, 2),
            "answers": len(self.answered),
            "errors": sum(n for status, n in self.errors.items() if status != 0),
            "timeouts": self.errors.get(0, 0),
            "late_sends": sum(1 for s in self.sends if s.late_s > LATE_AFTER_S),
            "late_p99_ms": round(percentile(late_ms, 99), 2),
            "queue_growth_ms": round(min(self.queue_growth_ms, 1e9), 2),
            "generator_cpu_ms_per_request": round(1000 * self.cpu_s / max(1, len(self.sends)), 3),
            "generator_nice": self.nice,
            "other_cpu_cores": round(self.other_cpu_cores, 3),
            "busy": self.other_cpu_cores > BUSY_CORES,  # NaN: not measured, not busy
            "busy_retried_cores": self.busy_retried_cores,
        }


async def drive(
    schedule: Sequence[float],
    bodies: Sequence[bytes],
    send: Callable[[bytes], Awaitable[int]],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    max_in_flight: int = 1024,
) -> list[Sent]:
    """Sends ``bodies`` (cycled) at ``schedule``'s offsets from now, at most
    ``max_in_flight`` at once; one ``Sent`` per offset once all are answered. ``clock`` and
    ``sleep`` are the loop's time (a test passes a virtual one)."""
    if not bodies:
        raise ValueError("bodies: got none")
    start = clock()
    slots = asyncio.Semaphore(max_in_flight)
    sends = [Sent(offset) for offset in schedule]  # times from the start, as the schedule
    # The requests still out, each leaving as it is answered: the end of a run waits on
    # those alone. A gather over every task made the loop walk the whole run's tasks at its
    # end (300-370 ms for 120,000) while the last answers waited to be read, charged to them
    # (benchmarks/dev/results/hiccups/).
    pending: set[asyncio.Future[None]] = set()
    # A send cancelled or raising another BaseException past its Exception guard: the run
    # raises it at its end, as the gather did, rather than counting it as no answer.
    # (KeyboardInterrupt and SystemExit leave the loop at once.)
    escaped: list[asyncio.Future[None]] = []

    def settled(task: asyncio.Future[None]) -> None:
        pending.discard(task)
        if task.cancelled() or task.exception() is not None:
            escaped.append(task)

    async def one(index: int, record: Sent) -> None:
        try:
            record.status = await send(bodies[index % len(bodies)])
        except Exception:  # a refused or dropped connection: no answer
            record.status = 0
        finally:
            record.done_s = clock() - start
            slots.release()

    for index, record in enumerate(sends):
        wait = start + record.due_s - clock()
        if wait > 0:
            await sleep(wait)
        await slots.acquire()
        record.sent_s = clock() - start
        task = asyncio.ensure_future(one(index, record))
        pending.add(task)
        task.add_done_callback(settled)
    if pending:
        await asyncio.wait(pending)
    if escaped:
        escaped[0].result()  # raises what the first escaped send raised
    return sends


class HttpPool:
    """HTTP/1.1 keep-alive connections to one host, opened on demand: POSTs a body, reads
    the status and the whole answer."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 60):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url: got {url!r}, expected http://host:port/path")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path or "/"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{extra}"
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, body: bytes) -> int:
        conn = (
            self._idle.pop() if self._idle else await asyncio.open_connection(self.host, self.port)
        )
        try:
            status, keep = await asyncio.wait_for(self._exchange(conn, body), self.timeout_s)
        except BaseException:
            conn[1].close()
            raise
        if keep:
            self._idle.append(conn)
        else:
            conn[1].close()
        return status

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], body: bytes
    ) -> tuple[int, bool]:
        reader, writer = conn
        writer.write(f"{self._head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await reader.readline()).split(b";")[0], 16):
                await reader.readexactly(size + 2)
            await reader.readline()
        else:
            await reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers.get("connection", "").lower() != "close"

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def run_open_loop(
    url: str,
    bodies: Sequence[bytes],
    rate_per_s: float,
    count: int,
    *,
    seed: int = 0,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    nice: int | None = None,
) -> OpenLoopResult:
    """``count`` requests to ``url`` at ``rate_per_s``, Poisson, open loop; blocks until
    every one is answered or timed out. ``nice``: the niceness to run at, when allowed
    (None: left alone)."""
    schedule = poisson_schedule(rate_per_s, count, seed)
    started_at = math.nan

    async def main() -> list[Sent]:
        nonlocal started_at
        pool = HttpPool(url, headers, timeout_s)
        try:
            started_at = time.monotonic()  # drive's own start, a few µs on
            return await drive(schedule, bodies, pool.post)
        finally:
            pool.close()

    with collector_paused(), _priority(nice) as ran_at:
        cpu = time.process_time()
        sends = asyncio.run(main())
    cpu_s = time.process_time() - cpu
    errors = dict(Counter(s.status for s in sends if s.status != 200))
    elapsed = max((s.done_s or 0.0) for s in sends)
    return OpenLoopResult(rate_per_s, sends, elapsed, cpu_s, errors, ran_at, started_at=started_at)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the block runs. A full collection walks
    every object the process holds with the GIL held: in a generator that imported torch
    (the tools build .mars), 124-469 ms, each a stall of every send and every answer's
    clock, the largest of a run's slow episodes (benchmarks/dev/results/hiccups/).
    Reference counting still frees what each request leaves; cyclic garbage waits for the
    block's end (about 1 KB a timed-out request). No collection first: about 95 ms after
    torch's import, it would halve the load of the benchmark's settling slices, each a
    short block of its own."""
    with _PAUSES_LOCK:
        if _PAUSES[0] == 0:
            _PAUSES[1] = gc.isenabled()
            gc.disable()
        _PAUSES[0] += 1
    try:
        yield
    finally:
        with _PAUSES_LOCK:  # the last block to end restores it, in whichever thread
            _PAUSES[0] -= 1
            if _PAUSES[0] == 0 and _PAUSES[1]:
                gc.enable()


# The blocks open in this process and whether the collector was on before the first: two
# runs in two threads overlap, and the first to end must not turn it back on under the other.
_PAUSES: list[Any] = [0, False]
_PAUSES_LOCK = threading.Lock()


@contextlib.contextmanager
def _priority(nice: int | None) -> Iterator[int]:
    """This process at niceness ``nice`` while the block runs (as it was, if None or not
    allowed); yields the niceness it ran at."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    ran_at = before if nice is None else min(nice, before)
    try:
        if ran_at != before:
            os.setpriority(os.PRIO_PROCESS, 0, ran_at)
    except OSError:  # not allowed to raise it: run as we are
        ran_at = before
    try:
        yield ran_at
    finally:
        if ran_at != before:
            os.setpriority(os.PRIO_PROCESS, 0, before)
