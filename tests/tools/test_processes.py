"""`serve stop` signals only the TorchServe process group it started (tools.processes).

Each test starts process groups of its own (``sleep`` in a new session) and kills them in
``finally``; nothing else is signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ts_microbatch.tools import serve
from ts_microbatch.tools.processes import (
    PID_FILE_KIND,
    PidFileError,
    StalePidFileError,
    group_members,
    read_pid_file,
    stop_from_pid_file,
    write_pid_file,
)

# A leader that has forked a child (its pid printed once it runs) and sleeps; with
# ``ignore_term`` it ignores SIGTERM, as a wedged server might.
GROUP = (
    "import signal, subprocess, sys, time\n"
    "if sys.argv[1] == 'ignore_term': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen(['sleep', '300'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def start_group(ignore_term: bool = False) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A process group of our own: its leader and the pids of the leader and its child."""
    mode = "ignore_term" if ignore_term else "default"
    proc = subprocess.Popen(
        [sys.executable, "-c", GROUP, mode], start_new_session=True, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    return proc, [proc.pid, child]


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL our own group if anything of it is left, and reap the leader."""
    if group_members(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.fixture
def unrelated_group() -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """Someone else's process group, as a stale pid may name."""
    proc, pids = start_group()
    try:
        yield proc, pids
    finally:
        kill_group(proc)


def group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    """Whether group ``pgid`` is empty within ``timeout_s``: a SIGKILL sent to a group lands
    on its members after killpg returns."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(pgid)


def running(pids: list[int]) -> bool:
    return all(
        psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids
    )


def running_serve_stop(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(serve, "WORKDIR", workdir)
    return serve.main(["stop"])


def test_serve_stop_killed_the_process_group_an_old_pid_file_named(
    tmp_path: Path,
    unrelated_group: tuple[subprocess.Popen[bytes], list[int]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A pid file as every ts_microbatch before the record wrote it, its TorchServe long
    # gone and its pid now the leader of someone else's group.
    proc, pids = unrelated_group
    assert running(pids) and os.getpgid(proc.pid) == proc.pid
    (tmp_path / "torchserve.pid").write_text(str(proc.pid))
    status = running_serve_stop(tmp_path, monkeypatch)
    assert running(pids)
    err = capsys.readouterr().err
    assert status == 1
    assert "nothing was signalled" in err and f"kill -TERM -- -{proc.pid}" in err
    assert (tmp_path / "torchserve.pid").exists()  # the user's clue to stop it by hand


def test_serve_stop_killed_the_process_group_a_stale_pid_file_named(
    tmp_path: Path,
    unrelated_group: tuple[subprocess.Popen[bytes], list[int]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Our own record of a TorchServe that ran at this pid before a reboot: another start
    # time, another command line.
    proc, pids = unrelated_group
    assert running(pids) and os.getpgid(proc.pid) == proc.pid
    record = {
        "kind": PID_FILE_KIND,
        "pid": proc.pid,
        "create_time": psutil.Process(proc.pid).create_time() - 3600,
        "cmdline": [sys.executable, "/venv/bin/torchserve", "--start", "--foreground"],
    }
    (tmp_path / "torchserve.pid").write_text(json.dumps(record))
    status = running_serve_stop(tmp_path, monkeypatch)
    assert running(pids)
    out = capsys.readouterr().out
    assert status == 0
    assert "is stale" in out and "Nothing was signalled" in out
    assert not (tmp_path / "torchserve.pid").exists()


def test_a_pid_file_whose_pid_runs_another_command_is_stale(
    tmp_path: Path, unrelated_group: tuple[subprocess.Popen[bytes], list[int]]
) -> None:
    # The start time alone could match within the slack: the command line must as well.
    proc, pids = unrelated_group
    pid_file = tmp_path / "torchserve.pid"
    assert write_pid_file(pid_file, proc.pid) is not None
    data = json.loads(pid_file.read_text())
    pid_file.write_text(json.dumps({**data, "cmdline": ["torchserve", "--start"]}))
    with pytest.raises(StalePidFileError, match="not the recorded TorchServe"):
        stop_from_pid_file(pid_file, timeout_s=10)
    assert running(pids)


def test_a_file_that_is_not_our_pid_file_is_left_alone(tmp_path: Path) -> None:
    pid_file = tmp_path / "torchserve.pid"
    pid_file.write_text('{"pid": 1}')
    with pytest.raises(PidFileError, match="not a pid file ts_microbatch wrote"):
        stop_from_pid_file(pid_file)
    assert pid_file.read_text() == '{"pid": 1}'


def test_stop_from_the_pid_file_stops_the_group_it_recorded(tmp_path: Path) -> None:
    proc, pids = start_group()
    try:
        assert running(pids)
        pid_file = tmp_path / "torchserve.pid"
        record = write_pid_file(pid_file, proc.pid)
        assert record is not None and read_pid_file(pid_file) == record
        stop_from_pid_file(pid_file, timeout_s=60)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert group_gone(proc.pid)  # the child too (at most an unreaped zombie)
        assert not pid_file.exists()
    finally:
        kill_group(proc)


def test_stop_from_the_pid_file_kills_a_verified_group_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    proc, pids = start_group(ignore_term=True)
    try:
        pid_file = tmp_path / "torchserve.pid"
        assert write_pid_file(pid_file, proc.pid) is not None
        stop_from_pid_file(pid_file, timeout_s=0.5)
        assert proc.wait(timeout=10) == -signal.SIGKILL  # SIGTERM was not enough
        assert group_gone(proc.pid)
    finally:
        kill_group(proc)


def test_serve_stop_took_a_live_servers_pid_file_written_mid_exec_for_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Popen returns once exec has begun, before the kernel has set the new command line:
    # about 1 read in 15 saw none, and `serve stop` then took the live server's file for stale.
    proc, _ = start_group()
    try:
        reads: Iterator[list[str]] = iter([[], []])
        real = psutil.Process.cmdline

        def cmdline(self: psutil.Process) -> list[str]:  # empty twice, as mid-exec
            return next(reads, real(self))

        monkeypatch.setattr(psutil.Process, "cmdline", cmdline)
        record = write_pid_file(tmp_path / "torchserve.pid", proc.pid)
        assert record is not None and record.cmdline == tuple(real(psutil.Process(proc.pid)))
        assert list(reads) == []  # both empty reads happened
        assert read_pid_file(tmp_path / "torchserve.pid") == record
    finally:
        kill_group(proc)
