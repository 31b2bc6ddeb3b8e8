"""The CPU a TorchServe spends, by process and by thread: what each request cost.

A run is read before and after its load (``read_cpu``); the difference over the requests
answered (``cpu_per_request``) is the frontend's (Java: HTTP, batching, the bodies' bytes)
and the worker's CPU per request, and each worker thread group's by OS thread name (stage
threads are ``tsmb-<stage>-<i>``; their OpenMP workers inherit the name). Also
benchmarks/compare.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_seconds(stat: str, children: bool = False) -> float:
    """User + system CPU seconds from a /proc stat line (fields 14 and 15, after the name);
    with ``children``, those of its reaped children (fields 16 and 17)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / _TICKS


def thread_cpu(pid: int) -> dict[str, tuple[float, int]]:
    """For each thread name of process ``pid``: CPU seconds (user + system) and the times
    its threads went to sleep (voluntary context switches: each is a wake-up later), summed
    over the threads of that name. Empty where /proc cannot be read."""
    used: dict[str, tuple[float, int]] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return used
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # the thread ended in between
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        seconds = _stat_seconds(stat)
        sleeps = next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_")),
            0,
        )
        before = used.get(name, (0.0, 0))
        used[name] = (before[0] + seconds, before[1] + sleeps)
    return used


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used; 0.0 once it is gone."""
    try:
        return _stat_seconds(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        pass
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def children_cpu(pid: int | None) -> float:
    """CPU seconds of ``pid``'s children that exited and were reaped; 0.0 once it is gone."""
    if pid is None:
        return 0.0
    try:
        return _stat_seconds(Path(f"/proc/{pid}/stat").read_text(), children=True)
    except OSError:
        return 0.0


def thread_group(name: str) -> str:
    """A worker thread's group in a report: its stage for ``tsmb-<stage>-<i>``."""
    if name.startswith("tsmb-"):
        return name.rsplit("-", 1)[0]
    return "other"


def server_pids(server: Any) -> tuple[int | None, list[int]]:
    """The server's frontend (the Java process: the torchserve launcher's child, or the
    launcher itself) and its Python worker processes, from its process tree."""
    import psutil

    if server.process is None:
        return None, []
    root = psutil.Process(server.process.pid)
    frontend, workers = None, []
    for proc in [root, *root.children(recursive=True)]:
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue  # a worker that exited, not reaped yet
        if "model_service_worker" in cmdline:
            workers.append(int(proc.pid))
        elif "java" in cmdline and frontend is None:
            frontend = int(proc.pid)
    return frontend, workers


def frontend_pid(server: Any) -> int:
    frontend, _ = server_pids(server)
    return frontend if frontend is not None else int(server.process.pid)


@dataclass
class CpuReading:
    """CPU seconds used so far by a server's frontend and workers, and by each group of
    the workers' threads (seconds, wake-ups)."""

    frontend_s: float = 0.0
    workers_s: float = 0.0
    threads: dict[str, tuple[float, int]] = field(default_factory=dict)


def read_cpu(server: Any) -> CpuReading:
    """What ``server`` (a running ts_microbatch.tools.server.TorchServe) has used so far."""
    return read_pids(*server_pids(server))


def read_pids(frontend: int | None, workers: list[int]) -> CpuReading:
    """What a frontend and its worker processes have used so far."""
    reading = CpuReading(frontend_s=process_cpu(frontend) if frontend is not None else 0.0)
    for pid in workers:
        reading.workers_s += process_cpu(pid)
        for name, (seconds, sleeps) in thread_cpu(pid).items():
            group = thread_group(name)
            before = reading.threads.get(group, (0.0, 0))
            reading.threads[group] = (before[0] + seconds, before[1] + sleeps)
    return reading


def cpu_per_request(before: CpuReading, after: CpuReading, requests: float) -> dict[str, Any]:
    """Milliseconds of CPU per request between two readings: the frontend's, the
    workers', and each thread group's (with its wake-ups per request)."""
    n = max(1.0, requests)
    threads, wakeups = {}, {}
    for group, (seconds, sleeps) in sorted(after.threads.items()):
        seconds_before, sleeps_before = before.threads.get(group, (0.0, 0))
        threads[group] = 1000 * (seconds - seconds_before) / n
        wakeups[group] = (sleeps - sleeps_before) / n
    return {
        "frontend_cpu_ms_per_request": 1000 * (after.frontend_s - before.frontend_s) / n,
        "workers_cpu_ms_per_request": 1000 * (after.workers_s - before.workers_s) / n,
        "worker_threads_ms_per_request": threads,
        "worker_threads_wakeups_per_request": wakeups,
    }
