"""The CPU other processes took while a run was measured: a busy machine flags its run.

On a shared machine a slow phase of someone else's work lands on whichever variant runs
then. ``OtherCpu`` reads, before and after a run, the busy time of the cores this process
may run on (``/proc/stat`` through psutil, per core, restricted to the affinity mask) and
the CPU of this process, its descendants and their sessions (the load generator and the
TorchServe it started: launcher, frontend, workers); the difference over the run's wall time is what
everything else used, in cores. A run past ``BUSY_CORES`` is flagged, and the sweep
(ts_microbatch.tools.curves) runs it once more.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

# A tenth of a core used by others through a run flags it (a P99 moves with less: one
# stall of 10 ms a second lands on 1% of the requests).
BUSY_CORES = 0.10


def machine_busy_s() -> float:
    """CPU seconds the cores this process may run on have been busy (not idle nor waiting
    for I/O) since boot."""
    import psutil

    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = 0.0
    for index, times in enumerate(psutil.cpu_times(percpu=True)):
        if cores is None or index in cores:
            idle = times.idle + getattr(times, "iowait", 0.0)
            busy += (
                sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
            )
    return busy


def own_tree_s() -> float:
    """CPU seconds (user + system) used by this process, its live descendants, and the
    processes of their sessions (a TorchServe started in a session of its own: its
    frontend lives on if the launcher exits first, no longer a descendant)."""
    import psutil

    me = psutil.Process()
    procs = {p.pid: p for p in [me, *me.children(recursive=True)]}
    sessions = set()
    for pid in procs:
        try:
            sessions.add(os.getsid(pid))
        except OSError:
            continue  # exited in between
    sessions.discard(os.getsid(0))  # our own session may hold the shell that started us
    if sessions:
        for proc in psutil.process_iter():
            try:
                if proc.pid not in procs and os.getsid(proc.pid) in sessions:
                    procs[proc.pid] = proc
            except OSError:
                continue
    total = 0.0
    for proc in procs.values():
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # exited in between
        total += times.user + times.system
    return total


class OtherCpu:
    """Measures one run: ``start()``, then ``stop()`` returns the cores others used."""

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


def busy(other_cores: float, threshold: float = BUSY_CORES) -> bool:
    """Whether others used more than ``threshold`` cores (NaN: not measured, not busy)."""
    return other_cores > threshold
