"""Stopping a TorchServe's whole process group: the frontend and its backend workers."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time

import psutil

logger = logging.getLogger(__name__)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies, which no one may reap in a
    container without an init, do not count)."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def stop_process_group(
    pid: int, timeout_s: float = 30.0, leader: subprocess.Popen[bytes] | None = None
) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL what is left after ``timeout_s``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap our own child so that it does not linger as a zombie
        if not _group_alive(pid):
            return
        time.sleep(0.1)
    logger.warning(
        "TorchServe process group %d ignored SIGTERM for %.0f s; killing it", pid, timeout_s
    )
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
