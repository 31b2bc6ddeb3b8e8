"""Where the machine's cores went during one run: the CPU ledger.

A run is read before and after its load (``read_ledger``); ``ledger`` turns the two into
cores (CPU seconds over the run's wall seconds), in parts that sum to the cores this
process may run on:

* ``frontend``: the server's Java process (HTTP, batching, the bodies' bytes, its GC);
* ``frontend JIT``: its JIT compiler threads (a fresh JVM compiles its hot paths for a
  minute or more under load: ``settle_frontend``);
* ``frontend children``: the frontend's children that exited during the run (TorchServe
  runs ``metric_collector.py`` every ``metric_time_interval``; a worker that ended);
* ``worker <group>``: each worker thread group (ts_microbatch.tools.cpu.thread_group:
  ``tsmb-<stage>`` for the stage threads, ``other`` for TorchServe's own thread and the
  rest); ``worker exited threads``: threads that ended during the run;
* ``generator``: the load: this process and the children it reaped (``ab``);
* ``others``: every other busy second on these cores (other processes, kernel threads,
  interrupts not charged to a process): what the parts above leave of the machine's busy
  time, so a large ``others`` says the ledger did not account for the run;
* ``steal``: time the hypervisor gave another guest (a virtual machine's lost cores);
* ``idle``: no runnable thread.

``accounted`` is the share of the machine the named parts explain (1 - others / cores): a
production client runs elsewhere, so the bound it would leave the server is the cores minus
the generator's. The processes' tick counts and /proc/stat's disagree by a tick or so, so
the parts are scaled to sum to the cores (``scale``); ``residual_cores`` keeps the
machine's busy time less the named parts unclamped (below 0: the processes counted more).
A worker that started or ended during the run (``workers_changed``) is not all in it: an
ended one's whole life lands in ``frontend children``.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cpu import CpuReading, children_cpu, read_pids, thread_cpu

# The JVM's JIT compiler threads, as /proc names them (cut to 15 characters).
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
# The fraud scorer at 1,000 req/s open loop on a fresh server, its compilers' cores over
# 10 s windows: 0.50, 0.11, 0.04, 0.04, 0.002, 0.05, 0.02, 0.010, 0.008, bursts until 70 s
# (benchmarks/dev/results/jit_settle/); after 26 s of warm-up with one quiet 2 s slice they
# still used 0.16-0.36 cores through the sweep measured next. So a frontend is taken as
# settled when its compilers used under SETTLED_JIT_CORES over the last SETTLE_WINDOW_S of
# warm-up, read in slices of at least SETTLE_SLICE_S.
SETTLED_JIT_CORES = 0.02
SETTLE_WINDOW_S = 10.0
SETTLE_SLICE_S = 2.0
SETTLE_S = 90.0  # the benchmark's default bound (--settle-s)


@dataclass(frozen=True)
class MachineTimes:
    """CPU seconds since boot, summed over the cores this process may run on."""

    busy_s: float  # user, nice, system, irq, softirq
    idle_s: float  # idle and iowait
    steal_s: float


def machine_times(stat: str = "/proc/stat", allowed: set[int] | None = None) -> MachineTimes:
    """The cores in ``allowed`` (default: this process's affinity), from ``stat``'s
    ``cpuN`` lines, each by its number: a CPU taken offline has no line, so a line's
    position is not its CPU (psutil's per-CPU list is by position). Where ``stat`` cannot
    be read, psutil's list, taken as numbered in order."""
    if allowed is None and hasattr(os, "sched_getaffinity"):
        allowed = os.sched_getaffinity(0)
    try:
        per_cpu = _stat_times(stat)
    except OSError:
        import psutil

        per_cpu = {i: t._asdict() for i, t in enumerate(psutil.cpu_times(percpu=True))}
    busy = idle = steal = 0.0
    for cpu, times in per_cpu.items():
        if allowed is not None and cpu not in allowed:
            continue
        # user includes guest time on Linux: a guest's seconds are counted once
        guests = times.get("guest", 0.0) + times.get("guest_nice", 0.0)
        waiting = times.get("idle", 0.0) + times.get("iowait", 0.0)
        idle += waiting
        steal += times.get("steal", 0.0)
        busy += sum(times.values()) - guests - waiting
    busy -= steal
    return MachineTimes(busy, idle, steal)


# /proc/stat's columns of a cpuN line, in order (proc(5))
_STAT_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)


def _stat_times(stat: str) -> dict[int, dict[str, float]]:
    """Each CPU's times in seconds from a /proc/stat, by CPU number."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    per_cpu: dict[int, dict[str, float]] = {}
    with open(stat) as lines:
        for line in lines:
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                seconds = (int(v) * tick_s for v in values)
                per_cpu[int(name[3:])] = dict(zip(_STAT_FIELDS, seconds))
    return per_cpu


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def generator_s() -> float:
    """CPU seconds of this process and of the children it has reaped (``ab``)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@dataclass(frozen=True)
class LedgerReading:
    at_s: float  # time.monotonic()
    machine: MachineTimes
    server: CpuReading
    frontend_children_s: float
    generator_s: float
    worker_pids: tuple[int, ...] = ()
    frontend_jit_s: float = 0.0


def read_ledger(frontend: int | None, workers: list[int]) -> LedgerReading:
    """The machine, a server's frontend and workers (ts_microbatch.tools.cpu.server_pids)
    and this process's load, read now."""
    return LedgerReading(
        time.monotonic(),
        machine_times(),
        read_pids(frontend, workers),
        children_cpu(frontend),
        generator_s(),
        tuple(sorted(workers)),
        jit_s(frontend),
    )


def jit_s(frontend: int | None) -> float:
    """CPU seconds the frontend's JIT compiler threads have used (0.0: none or no frontend)."""
    if frontend is None:
        return 0.0
    used = thread_cpu(frontend)
    return sum(seconds for name, (seconds, _) in used.items() if name.startswith(JIT_THREADS))


def settle_frontend(
    warm: Callable[[], object], frontend: int | None, max_s: float
) -> dict[str, Any] | None:
    """Warm-up slices (``warm`` repeated for at least ``SETTLE_SLICE_S`` each) until the
    frontend's JIT compilers used under ``SETTLED_JIT_CORES`` over the last
    ``SETTLE_WINDOW_S``, or ``max_s`` passed: a run measured while a fresh JVM compiles
    counts the compilers' CPU, and the stalls of a machine they share, as the server's.
    Returns the seconds spent, the slices, the compilers' cores over the last window and
    whether it settled; None when not asked (``max_s`` 0) or without a frontend to read."""
    if max_s <= 0 or frontend is None:
        return None
    start = time.monotonic()
    readings = [(start, jit_s(frontend))]  # (when, compiler seconds so far), a slice apart
    while True:
        slice_start = time.monotonic()
        while time.monotonic() - slice_start < SETTLE_SLICE_S:
            warm()
        now = time.monotonic()
        readings.append((now, jit_s(frontend)))
        # the window: the latest reading at least SETTLE_WINDOW_S back, else the first
        then, used = next(
            (r for r in reversed(readings) if now - r[0] >= SETTLE_WINDOW_S), readings[0]
        )
        jit_cores = (readings[-1][1] - used) / (now - then)
        settled = now - then >= SETTLE_WINDOW_S and jit_cores < SETTLED_JIT_CORES
        if settled or now - start >= max_s:
            break
    slices = len(readings) - 1
    return {"seconds": now - start, "slices": slices, "jit_cores": jit_cores, "settled": settled}


def ledger(
    before: LedgerReading, after: LedgerReading, ncores: int | None = None
) -> dict[str, Any]:
    """Cores each part used between two readings (the module's parts, ``cores``,
    ``accounted``, ``seconds``); the parts sum to ``cores``."""
    wall = after.at_s - before.at_s
    ncores = ncores or cores()
    if wall <= 0:
        return {}

    def per_s(seconds: float) -> float:
        return max(0.0, seconds) / wall

    jit = after.frontend_jit_s - before.frontend_jit_s
    parts: dict[str, float] = {
        "frontend": per_s(after.server.frontend_s - before.server.frontend_s - jit),
        "frontend JIT": per_s(jit),
        "frontend children": per_s(after.frontend_children_s - before.frontend_children_s),
    }
    threads_s = 0.0
    for group, (seconds, _) in sorted(after.server.threads.items()):
        used = seconds - before.server.threads.get(group, (0.0, 0))[0]
        threads_s += used
        parts[f"worker {group}"] = per_s(used)
    # A thread that ended during the run leaves its group's sum but not its process's.
    exited = (after.server.workers_s - before.server.workers_s) - threads_s
    if exited / wall > 0.005:
        parts["worker exited threads"] = per_s(exited)
    parts["generator"] = per_s(after.generator_s - before.generator_s)
    busy = per_s(after.machine.busy_s - before.machine.busy_s)
    steal = per_s(after.machine.steal_s - before.machine.steal_s)
    idle = per_s(after.machine.idle_s - before.machine.idle_s)
    named = sum(parts.values())
    residual = busy - named  # below 0: the processes counted more ticks than the machine
    parts["others"] = max(0.0, residual)
    parts["steal"] = steal
    # The tick counts of /proc/stat and of the processes disagree by a tick or so; the
    # parts are scaled to the cores they were measured on, so they sum to them.
    total = named + parts["others"] + steal + idle
    parts["idle"] = idle
    scale = ncores / total if total > 0 else 1.0
    parts = {k: v * scale for k, v in parts.items()}
    return {
        "parts": parts,
        "cores": ncores,
        "seconds": wall,
        "accounted": 1.0 - parts["others"] / ncores,
        "residual_cores": residual,
        "scale": scale,
        # a worker that started or ended during the run: its CPU is not all in the parts
        "workers_changed": before.worker_pids != after.worker_pids,
    }


def format_ledger(entry: dict[str, Any]) -> str:
    """One line: each part's cores, then idle and what was accounted for."""
    if not entry:
        return "no ledger"
    parts = entry["parts"]
    shown = ", ".join(f"{name} {value:.2f}" for name, value in parts.items() if value >= 0.005)
    changed = "; a worker started or ended during it" if entry.get("workers_changed") else ""
    return f"{shown} of {entry['cores']} cores ({entry['accounted']:.0%} accounted for{changed})"


def format_settled(settled: dict[str, Any] | None) -> str:
    """``settle_frontend``'s result as a clause of a run's line ("" when it did not run)."""
    if not settled:
        return ""
    if settled["settled"]:
        return f"; the frontend's JIT settled after {settled['seconds']:.0f} s of warm-up"
    return (
        f"; the frontend's JIT still compiling ({settled['jit_cores']:.2f} cores) after "
        f"{settled['seconds']:.0f} s of warm-up: its CPU is in this run"
    )


MAIN_PARTS = ("frontend", "worker", "generator", "others", "steal", "idle")


def summary(entry: dict[str, Any]) -> dict[str, float]:
    """The ledger folded into MAIN_PARTS (worker groups summed, the frontend's exited
    children with the frontend), in cores."""
    parts = entry.get("parts", {})
    folded = dict.fromkeys(MAIN_PARTS, 0.0)
    for name, value in parts.items():
        if name.startswith("worker "):
            folded["worker"] += value
        elif name.startswith("frontend"):
            folded["frontend"] += value
        else:
            folded[name] += value
    return folded
