"""The CPU ledger (ts_microbatch.tools.ledger): its parts sum to the machine's cores, each
process lands in its own part, and what no part explains shows as ``others``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ts_microbatch.tools import ledger as ledger_module
from ts_microbatch.tools.cpu import CpuReading
from ts_microbatch.tools.ledger import (
    MAIN_PARTS,
    LedgerReading,
    MachineTimes,
    format_ledger,
    format_settled,
    ledger,
    machine_times,
    read_ledger,
    summary,
)

SPIN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def reading(at: float, busy: float, idle: float, frontend: float, infer: float) -> LedgerReading:
    server = CpuReading(frontend_s=frontend, workers_s=infer, threads={"tsmb-infer": (infer, 0)})
    return LedgerReading(at, MachineTimes(busy, idle, 0.0), server, 0.0, 0.0)


def test_the_parts_sum_to_the_cores_and_the_rest_is_others() -> None:
    before = reading(0.0, busy=100.0, idle=50.0, frontend=10.0, infer=20.0)
    # 10 s on 2 cores: 14 busy (4 frontend, 8 inference, 2 nobody named), 6 idle
    after = reading(10.0, busy=114.0, idle=56.0, frontend=14.0, infer=28.0)
    entry = ledger(before, after, ncores=2)
    parts = entry["parts"]
    assert parts["frontend"] == pytest.approx(0.4)
    assert parts["worker tsmb-infer"] == pytest.approx(0.8)
    assert parts["others"] == pytest.approx(0.2)
    assert parts["idle"] == pytest.approx(0.6)
    assert sum(parts.values()) == pytest.approx(2.0)
    assert entry["accounted"] == pytest.approx(0.9)
    assert summary(entry) == pytest.approx(
        {"frontend": 0.4, "worker": 0.8, "generator": 0.0, "others": 0.2, "steal": 0.0, "idle": 0.6}
    )
    assert list(summary(entry)) == list(MAIN_PARTS)
    assert "accounted" in format_ledger(entry)


def test_processes_counting_more_ticks_than_the_machine_are_scaled_to_its_cores() -> None:
    before = reading(0.0, busy=0.0, idle=0.0, frontend=0.0, infer=0.0)
    after = reading(1.0, busy=1.9, idle=0.0, frontend=1.0, infer=1.0)  # a tick apart
    entry = ledger(before, after, ncores=2)
    assert entry["parts"]["others"] == 0.0
    assert sum(entry["parts"].values()) == pytest.approx(2.0)


def test_a_spinning_frontend_and_its_exited_child_land_in_their_parts() -> None:
    # A stand-in frontend: spins 0.6 s of CPU itself, after a child that spins 0.3 s and
    # is reaped (as TorchServe's metrics collector is each minute).
    child = SPIN.format(seconds=0.3)
    script = (
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}], check=True)\n"
        + SPIN.format(seconds=0.6)
        + "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        before = read_ledger(proc.pid, [])
        deadline = time.monotonic() + 30
        # done once it has used its 0.6 s: the stat is read until then, never a sleep's guess
        while read_ledger(proc.pid, []).server.frontend_s - before.server.frontend_s < 0.55:
            assert time.monotonic() < deadline, "the stand-in frontend never spun"
            time.sleep(0.05)
        after = read_ledger(proc.pid, [])
    finally:
        proc.communicate(b"", timeout=30)
    entry = ledger(before, after)
    wall = entry["seconds"]
    # CPU seconds back from cores: what each process used, whatever the wall time was
    assert entry["parts"]["frontend"] * wall == pytest.approx(0.6, abs=0.15)
    assert entry["parts"]["frontend children"] * wall == pytest.approx(0.3, abs=0.15)
    assert sum(entry["parts"].values()) == pytest.approx(entry["cores"])
    assert 0.0 <= entry["accounted"] <= 1.0


def test_threads_that_ended_and_workers_that_changed_are_said() -> None:
    before = reading(0.0, busy=100.0, idle=50.0, frontend=10.0, infer=20.0)
    after = reading(10.0, busy=114.0, idle=56.0, frontend=12.0, infer=24.0)
    # the process used 10 s where its live threads show 4: a thread that ended took 6
    after = LedgerReading(
        after.at_s,
        after.machine,
        CpuReading(frontend_s=12.0, workers_s=30.0, threads={"tsmb-infer": (24.0, 0)}),
        0.0,
        0.0,
        (42,),
    )
    entry = ledger(before, after, ncores=2)
    assert entry["parts"]["worker exited threads"] == pytest.approx(0.6)
    # 1.4 cores busy: frontend 0.2, inference 0.4, the ended thread 0.6, nobody named 0.2
    assert entry["parts"]["others"] == pytest.approx(0.2)
    assert entry["residual_cores"] == pytest.approx(0.2)
    assert entry["workers_changed"]  # () before, (42,) after
    assert "a worker started or ended" in format_ledger(entry)


# A stand-in JVM: a thread named as HotSpot's C2 compiler (/proc cuts it to 15 characters)
# spins ``{seconds}`` s of its own CPU and stays, while the process waits for stdin.
COMPILER = """import ctypes, sys, threading, time
def compile_():
    ctypes.CDLL(None).prctl(15, b"C2 CompilerThread0", 0, 0, 0)  # PR_SET_NAME
    end = time.thread_time() + {seconds}
    while time.thread_time() < end: pass
    print("compiled", flush=True)
    threading.Event().wait()  # alive, as a JVM's compilers stay: /proc keeps its count
threading.Thread(target=compile_, daemon=True).start()
sys.stdin.read()
"""


def test_the_frontends_jit_compilers_are_a_part_of_their_own() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", COMPILER.format(seconds=0.4)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        before = read_ledger(proc.pid, [])
        assert proc.stdout is not None and proc.stdout.readline() == b"compiled\n"
        after = read_ledger(proc.pid, [])
    finally:
        proc.communicate(b"", timeout=30)
    assert after.frontend_jit_s - before.frontend_jit_s == pytest.approx(0.4, abs=0.1)
    entry = ledger(before, after)
    parts, wall = entry["parts"], entry["seconds"]
    jit_s = parts["frontend JIT"] * wall / entry["scale"]
    assert jit_s == pytest.approx(0.4, abs=0.1)
    # the rest of the process (its start, its main thread) stays in frontend: not counted twice
    rest_s = parts["frontend"] * wall / entry["scale"]
    total_s = after.server.frontend_s - before.server.frontend_s
    assert rest_s == pytest.approx(total_s - jit_s, abs=0.05)
    assert summary(entry)["frontend"] == pytest.approx(parts["frontend"] + parts["frontend JIT"])


def test_settling_warms_until_the_compilers_go_quiet_or_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_module, "SETTLE_SLICE_S", 0.3)
    monkeypatch.setattr(ledger_module, "SETTLE_WINDOW_S", 0.9)
    warmed: list[float] = []

    def warm() -> None:
        warmed.append(time.monotonic())
        time.sleep(0.02)

    # Compiling 0.5 s: the first slices see it, a later window of three is quiet.
    proc = subprocess.Popen(
        [sys.executable, "-c", COMPILER.format(seconds=0.5)], stdin=subprocess.PIPE
    )
    try:
        settled = ledger_module.settle_frontend(warm, proc.pid, max_s=60)
    finally:
        proc.communicate(b"", timeout=30)
    assert settled is not None and settled["settled"] and settled["slices"] >= 4
    assert settled["jit_cores"] < ledger_module.SETTLED_JIT_CORES and warmed
    # Compiling longer than the bound: it stops there and says it did not settle.
    proc = subprocess.Popen(
        [sys.executable, "-c", COMPILER.format(seconds=30)], stdin=subprocess.PIPE
    )
    try:
        bounded = ledger_module.settle_frontend(warm, proc.pid, max_s=0.5)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert bounded is not None and not bounded["settled"]
    assert bounded["jit_cores"] >= ledger_module.SETTLED_JIT_CORES
    assert "still compiling" in format_settled(bounded)
    assert "settled after" in format_settled(settled)
    # not asked, or no frontend to read: nothing is sent
    warmed.clear()
    assert ledger_module.settle_frontend(warm, proc.pid, max_s=0) is None
    assert ledger_module.settle_frontend(warm, None, max_s=10) is None and not warmed


def test_the_machine_is_read_by_cpu_number_so_an_offline_cpu_shifts_nothing(
    tmp_path: Path,
) -> None:
    # /proc/stat has no line for an offline CPU: with cpu1 offline, cpu2's line is the
    # second, and reading by position counted cpu2 as cpu1 (outside the affinity {0, 2}).
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(
        f"cpu  {9 * tick} 0 0 0 0 0 0 0 0 0\n"
        f"cpu0 {2 * tick} 0 {tick} {10 * tick} 0 0 0 0 0 0\n"
        f"cpu2 {3 * tick} 0 0 {20 * tick} {tick} 0 0 {tick} 0 0\n"
        "intr 12345 0 0\n"
    )
    times = machine_times(str(stat), allowed={0, 2})
    assert times.busy_s == pytest.approx(2 + 1 + 3)  # cpu0 user + system, cpu2 user
    assert times.idle_s == pytest.approx(10 + 20 + 1)  # idle and iowait
    assert times.steal_s == pytest.approx(1)
    assert machine_times(str(stat), allowed={2}).busy_s == pytest.approx(3)


def test_without_a_proc_stat_the_machine_is_read_from_psutil(tmp_path: Path) -> None:
    proc = machine_times()
    fallback = machine_times(str(tmp_path / "no-stat"))
    assert fallback.idle_s == pytest.approx(proc.idle_s, abs=5.0)
    assert fallback.busy_s == pytest.approx(proc.busy_s, abs=5.0)
    assert fallback.steal_s == pytest.approx(proc.steal_s, abs=5.0)
