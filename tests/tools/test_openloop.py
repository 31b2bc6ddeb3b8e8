"""The open-loop generator: its schedule, sends on time under a virtual clock, late sends
counted, and its HTTP client against a loopback server (no timing asserted)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import statistics
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

from ts_microbatch.tools import openloop
from ts_microbatch.tools.openloop import (
    GENERATOR_NICE,
    HttpPool,
    drive,
    poisson_schedule,
    run_open_loop,
)


class VirtualClock:
    """Time that moves only when told: ``sleep`` lets what is due now run, then moves to
    its end unless that has passed already; ``advance`` adds (a server's time)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        end = self.now + seconds
        for _ in range(3):  # the sends started so far run their steps at the current time
            await asyncio.sleep(0)
        self.now = max(self.now, end)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_the_schedule_is_poisson_at_the_offered_rate() -> None:
    offsets = poisson_schedule(250.0, 20_000, seed=3)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(gap >= 0 for gap in gaps)
    assert statistics.mean(gaps) == pytest.approx(1 / 250, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(1 / 250, rel=0.05)  # exponential: sd = mean
    assert poisson_schedule(250.0, 50, seed=3) == offsets[:50]  # seeded


@pytest.mark.parametrize(("rate", "count"), [(0, 5), (-1.0, 5), (float("nan"), 5), (10, 0)])
def test_a_bad_rate_or_count_is_refused(rate: float, count: int) -> None:
    with pytest.raises(ValueError, match="rate_per_s|count"):
        poisson_schedule(rate, count)


def test_each_request_is_sent_at_its_scheduled_time_whatever_the_answers() -> None:
    clock = VirtualClock()
    schedule = poisson_schedule(180.0, 400, seed=1)
    seen: list[float] = []

    async def send(body: bytes) -> int:
        seen.append(clock())
        await asyncio.sleep(0)
        return 200

    sends = asyncio.run(drive(schedule, [b"x"], send, clock=clock, sleep=clock.sleep))
    assert [s.sent_s for s in sends] == pytest.approx(schedule, abs=1e-9)
    assert [t - 100.0 for t in seen] == pytest.approx(schedule, abs=1e-9)
    assert all(s.late_s <= 1e-9 and s.status == 200 for s in sends)


def test_sends_that_cannot_go_on_time_are_counted_late_and_charged_to_latency() -> None:
    # One request in flight at most and a server that takes 1 s each: every send after the
    # first waits for a free slot, and its latency counts from its scheduled time.
    clock = VirtualClock()
    schedule = [0.0, 0.1, 0.2, 0.3]

    async def send(body: bytes) -> int:
        clock.advance(1.0)
        await asyncio.sleep(0)
        return 200

    sends = asyncio.run(
        drive(schedule, [b"x"], send, clock=clock, sleep=clock.sleep, max_in_flight=1)
    )
    assert [round(s.late_s, 6) for s in sends] == [0.0, 0.9, 1.8, 2.7]
    assert [round(s.latency_s or 0, 6) for s in sends] == [1.0, 1.9, 2.8, 3.7]


class LoopbackServer:
    """An HTTP/1.1 server on 127.0.0.1: answers 200 (Content-Length), 503 for a body of
    b"busy", a chunked 200 for b"chunked", and counts its connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.port = 0
        self.cycles_per_request = 0  # reference cycles each request leaves (garbage to collect)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while await reader.readline():
            length = 0
            while (header := await reader.readline()) not in (b"\r\n", b""):
                if header.lower().startswith(b"content-length:"):
                    length = int(header.split(b":")[1])
            body = await reader.readexactly(length)
            self.requests += 1
            for _ in range(self.cycles_per_request):
                cycle: list[object] = []
                cycle.append(cycle)
            if body == b"chunked":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                )
            else:
                status = b"503 Busy" if body == b"busy" else b"200 OK"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as running:
        yield running


def test_the_client_reads_lengths_and_chunks_and_keeps_connections(server: LoopbackServer) -> None:
    async def main() -> list[int]:
        pool = HttpPool(f"http://127.0.0.1:{server.port}/predictions/m")
        try:
            return [await pool.post(body) for body in (b"a", b"chunked", b"busy", b"b")]
        finally:
            pool.close()

    assert asyncio.run(main()) == [200, 200, 503, 200]
    assert server.connections == 1 and server.requests == 4  # one kept-alive connection


def test_an_open_loop_run_answers_every_request_and_reports_it(server: LoopbackServer) -> None:
    url = f"http://127.0.0.1:{server.port}/predictions/m"
    result = run_open_loop(url, [b"a", b"busy", b"b", b"c"], rate_per_s=400.0, count=200)
    summary = result.summary()
    assert server.requests == 200 and summary["requests"] == 200
    assert result.errors == {503: 50} and summary["errors"] == 50
    assert summary["timeouts"] == 0
    assert summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"] < float("inf")
    assert result.cpu_s > 0


def test_a_refused_connection_is_no_answer_not_a_crash() -> None:
    with LoopbackServer() as stopped:
        port = stopped.port
    result = run_open_loop(f"http://127.0.0.1:{port}/", [b"a"], rate_per_s=100.0, count=5)
    assert result.errors == {0: 5}
    assert result.percentile_ms(50) == float("inf")


def test_the_generator_reniced_itself_by_default_its_priority_is_left_alone_unless_asked(
    server: LoopbackServer,
) -> None:
    # As root the generator used to take niceness -10 for every run, ahead of any TorchServe
    # on the machine, production or not. Now only a run that asks for it does.
    before = os.getpriority(os.PRIO_PROCESS, 0)
    result = run_open_loop(f"http://127.0.0.1:{server.port}/", [b"a"], rate_per_s=200.0, count=20)
    assert server.requests == 20  # the scenario: the run happened
    assert result.nice == before and result.summary()["generator_nice"] == before
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_a_run_that_asks_for_a_niceness_runs_at_it_and_restores_its_priority(
    server: LoopbackServer,
) -> None:
    before = os.getpriority(os.PRIO_PROCESS, 0)
    url = f"http://127.0.0.1:{server.port}/"
    result = run_open_loop(url, [b"a"], rate_per_s=200.0, count=20, nice=GENERATOR_NICE)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    allowed = os.geteuid() == 0  # root may raise it (CAP_SYS_NICE); others run as they are
    assert result.nice == (min(GENERATOR_NICE, before) if allowed else before)
    assert result.summary()["generator_nice"] == result.nice


def test_a_point_reports_its_p99_with_an_interval_and_the_answers_that_carry_it(
    server: LoopbackServer,
) -> None:
    url = f"http://127.0.0.1:{server.port}/"
    summary = run_open_loop(url, [b"a"], rate_per_s=400.0, count=200).summary()
    assert summary["answers"] == 200
    assert summary["p99_low_ms"] <= summary["p99_ms"] <= summary["p99_high_ms"]


def test_a_growing_queue_shows_in_the_last_quarter_and_achieved_counts_the_offered_span() -> None:
    from ts_microbatch.tools.openloop import OpenLoopResult, Sent

    def run(latencies: list[float]) -> OpenLoopResult:
        sends = [Sent(i / 10, i / 10, i / 10 + ms / 1000, 200) for i, ms in enumerate(latencies)]
        return OpenLoopResult(10.0, sends, elapsed_s=99.0, cpu_s=0.0)

    steady = run([50.0] * 40)
    assert steady.queue_growth_ms == pytest.approx(0.0)
    assert steady.achieved_per_s == pytest.approx(10.0)  # the span offered, not the tail's
    assert steady.realized_per_s == pytest.approx(10.0)
    growing = run([50.0 + 100 * i for i in range(40)])
    assert growing.queue_growth_ms == pytest.approx(3000.0)  # medians 3,550 and 550 ms


def test_the_generators_own_collector_is_paused_through_a_run_and_restored_after(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full collection in a generator that imported torch stopped every send and every
    # answer's clock for 100 ms or more, charged to the server (benchmarks/dev/hiccups.py).
    server.cycles_per_request = 200  # in this process: garbage a collector would chase
    url = f"http://127.0.0.1:{server.port}/"
    collections: list[float] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(time.monotonic())

    def run() -> tuple[float, float]:
        collections.clear()
        result = run_open_loop(url, [b"a"], rate_per_s=1000.0, count=300)
        assert result.errors == {} and result.started_at < time.monotonic()
        return result.started_at, result.started_at + result.elapsed_s  # to the last answer

    gc.callbacks.append(seen)
    try:
        with monkeypatch.context() as undone:  # the scenario: without the pause, it collects
            undone.setattr(openloop, "collector_paused", contextlib.nullcontext)
            started, ended = run()
            assert [t for t in collections if started <= t <= ended]
        started, ended = run()
        assert not [t for t in collections if started <= t <= ended]
        assert gc.isenabled()
        gc.disable()  # a caller that had it off keeps it off
        try:
            run()
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(seen)


def test_two_runs_in_two_threads_keep_the_collector_off_until_the_last_ends() -> None:
    # Thread a pauses, b pauses, a ends first: the collector must stay off for b's run.
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen_by_b: list[bool] = []

    def a() -> None:
        with openloop.collector_paused():
            a_in.set()
            assert b_in.wait(5)
        a_out.set()

    def b() -> None:
        assert a_in.wait(5)
        with openloop.collector_paused():
            b_in.set()
            assert a_out.wait(5)
            seen_by_b.append(gc.isenabled())

    assert gc.isenabled()
    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert a_out.is_set() and seen_by_b == [False]  # the scenario ran, and b's stayed off
    assert gc.isenabled()  # and the last to end turned it back on


class _Interrupt(BaseException):
    """What a send may raise past the generator's Exception guard."""


def test_a_send_that_raises_past_its_guard_fails_the_run_not_counted_as_no_answer() -> None:
    # gather() raised it; waiting on the requests still out must too (it was swallowed).
    clock = VirtualClock()

    async def send(body: bytes) -> int:
        await asyncio.sleep(0)
        if body == b"stop":
            raise _Interrupt("stopped")
        return 200

    with pytest.raises(_Interrupt, match="stopped"):
        asyncio.run(drive([0.0, 0.1, 0.2], [b"x", b"stop"], send, clock=clock, sleep=clock.sleep))


def test_a_run_lets_go_of_each_request_once_answered_and_its_end_waits_on_those_still_out() -> None:
    # The end of a run waits on the requests still out, not on every task of the run: a
    # gather walked 120,000 of them at the end (300-370 ms) while the last answers waited
    # (benchmarks/dev/results/hiccups/). An answered request's task is let go at once.
    clock = VirtualClock()
    tasks: list[weakref.ref[asyncio.Task[object]]] = []
    alive_at_last_send: list[int] = []
    count = 200

    async def send(body: bytes) -> int:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(weakref.ref(task))
        if len(tasks) == count:
            alive_at_last_send.append(sum(ref() is not None for ref in tasks[:-10]))
        await asyncio.sleep(0)
        return 200

    schedule = [i * 0.01 for i in range(count)]
    sends = asyncio.run(drive(schedule, [b"x"], send, clock=clock, sleep=clock.sleep))
    assert all(s.status == 200 for s in sends)
    assert len(tasks) == count and alive_at_last_send == [0]


def test_a_send_cancelled_fails_the_run_as_the_gather_did() -> None:
    clock = VirtualClock()

    async def send(body: bytes) -> int:
        await asyncio.sleep(0)
        if body == b"cancel":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)  # the cancellation lands here
        return 200

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(drive([0.0, 0.1], [b"x", b"cancel"], send, clock=clock, sleep=clock.sleep))
