"""Stopping a TorchServe's whole process group (frontend and workers), and only one this
package started.

A pid file outlives its process: after a reboot or a kill -9 of the tool, its pid may be
anyone's. So the file records the process (``ProcessRecord``: start time and command line),
and a stop from it signals a group only while its leader is still that process
(``mismatch``); anything else is a stale file, removed, and nothing is signalled. Linux does
not reuse a pid while any process of its group lives, so a group watched since its verified
leader got SIGTERM is still the same group when the SIGKILL fallback comes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

PID_FILE_KIND = "ts_microbatch torchserve"  # written in every pid file of ours
# psutil's create_time moves when the wall clock is stepped: a second of slack (the
# command line must match as well).
CREATE_TIME_SLACK_S = 1.0


class PidFileError(RuntimeError):
    """A pid file names no process known to be ours: nothing was signalled."""


class StalePidFileError(PidFileError):
    """The pid file's process is gone (or its pid is another's): the file was removed."""


@dataclass(frozen=True)
class ProcessRecord:
    """A process as it started: enough to tell it from a later one given the same pid."""

    pid: int
    create_time: float
    cmdline: tuple[str, ...]


def write_pid_file(path: Path, pid: int) -> ProcessRecord | None:
    """Records the process ``pid`` in ``path`` (replaced whole); None, and no file, when it
    has already exited. Just after Popen returns, the child may still be in exec, its command
    line empty: it is read again until it has one (for a second at most)."""
    deadline = time.monotonic() + 1.0
    try:
        while True:
            proc = psutil.Process(pid)
            with proc.oneshot():
                record = ProcessRecord(pid, proc.create_time(), tuple(proc.cmdline()))
            if record.cmdline or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    except psutil.Error:
        return None
    fields = {"kind": PID_FILE_KIND, "pid": pid, "create_time": record.create_time}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({**fields, "cmdline": list(record.cmdline)}) + "\n")
    partial.replace(path)
    return record


def read_pid_file(path: Path) -> ProcessRecord:
    """The record in ``path``.

    Raises:
        PidFileError: the file is not one of ours, or an older one with the pid alone.
    """
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if text.isdigit():  # written before the record was: the pid alone
        raise PidFileError(
            f"{path} names pid {text} but not which process that was (an older ts_microbatch "
            "wrote it, without the start time and command line), and by now the pid may be "
            f"another program's: nothing was signalled. If `ps -o pid,pgid,lstart,args -g {text}` "
            f"shows that TorchServe (.../torchserve --start ...), stop it with `kill -TERM -- "
            f"-{text}`, then delete {path}"
        )
    try:
        data = json.loads(text)
        if data["kind"] != PID_FILE_KIND:
            raise ValueError(data["kind"])
        cmdline = tuple(str(a) for a in data["cmdline"])
        return ProcessRecord(int(data["pid"]), float(data["create_time"]), cmdline)
    except (ValueError, KeyError, TypeError) as exc:
        raise PidFileError(
            f"{path} is not a pid file ts_microbatch wrote: nothing was signalled, "
            "and the file was left as it is"
        ) from exc


def remove_pid_file(path: Path, pid: int) -> None:
    """Deletes ``path`` only while it is ours and names ``pid`` (another start may have
    replaced it)."""
    with contextlib.suppress(OSError, PidFileError):
        if read_pid_file(path).pid == pid:
            path.unlink()


def mismatch(record: ProcessRecord) -> str | None:
    """Why the process now holding ``record.pid`` is not the recorded one leading its own
    group, or None when it is. A zombie with the recorded start time still counts: its
    group may hold its workers."""
    try:
        proc = psutil.Process(record.pid)
        with proc.oneshot():
            created, zombie = proc.create_time(), proc.status() == psutil.STATUS_ZOMBIE
            cmdline = record.cmdline if zombie else tuple(proc.cmdline())
        group = os.getpgid(record.pid)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return f"no process {record.pid} is running"
    except psutil.Error as exc:
        return f"process {record.pid} cannot be inspected ({exc})"
    if abs(created - record.create_time) > CREATE_TIME_SLACK_S:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
        return f"process {record.pid} started at {started}, after the recorded one: another one"
    if cmdline != record.cmdline:
        return f"process {record.pid} runs {' '.join(cmdline)[:200]!r}, not the recorded TorchServe"
    if group != record.pid:
        return f"process {record.pid} no longer leads its own process group"
    return None


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes of group ``pgid`` (zombies, which no one may reap in a container
    without an init, do not count)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _terminate(
    pgid: int, timeout_s: float, poll: Callable[[], object], ours: Callable[[], bool]
) -> None:
    """SIGTERM group ``pgid``, then SIGKILL what is left after ``timeout_s`` if ``ours()``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        poll()
        if not group_members(pgid):
            return
        time.sleep(0.1)
    if not ours():
        logger.warning("process group %d is no longer the TorchServe's; not killing it", pgid)
        return
    logger.warning(
        "TorchServe process group %d ignored SIGTERM for %.0f s; killing it", pgid, timeout_s
    )
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def stop_process_group(pid: int, timeout_s: float, leader: subprocess.Popen[bytes]) -> None:
    """Stops the group of ``leader`` (pid ``pid``), our own child started in a new session:
    unreaped, it holds its pid; once reaped, only a group still alive holds the id."""
    if leader.poll() is None or group_members(pid):
        _terminate(pid, timeout_s, leader.poll, lambda: True)


def stop_from_pid_file(path: Path, timeout_s: float = 30.0) -> None:
    """Stops the group the pid file ``path`` records, once its leader is verified to be the
    recorded process, then removes the file.

    Raises:
        StalePidFileError: the recorded process is gone or its pid is another's: nothing
            was signalled, the file was removed.
        PidFileError: the file does not say which process it was: nothing was signalled.
    """
    record = read_pid_file(path)
    why = mismatch(record)
    if why is not None:
        remove_pid_file(path, record.pid)
        left = ", ".join(str(p.pid) for p in group_members(record.pid) if p.pid != record.pid)
        also = left and (
            f" Processes {left} are in a process group {record.pid}: its orphaned "
            "workers or another program's; if `ps -o pid,lstart,args -g "
            f"{record.pid}` shows TorchServe's, stop them with `kill -TERM -- -{record.pid}`."
        )
        raise StalePidFileError(
            f"the pid file {path} is stale: {why}. Nothing was signalled and the file was "
            f"removed.{also}"
        )

    def ours() -> bool:  # the verified leader, or its group left without it
        return mismatch(record) is None or not psutil.pid_exists(record.pid)

    _terminate(record.pid, timeout_s, lambda: None, ours)
    remove_pid_file(path, record.pid)
