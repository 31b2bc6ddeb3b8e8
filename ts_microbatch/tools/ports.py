"""Ports and socket paths for a TorchServe started beside others on one machine.

TorchServe's frontend hands each worker a Unix socket ``<java.io.tmpdir>/.ts.sock.<port>``,
counting up from ``initial_worker_port`` (9000), and Java's temp directory is /tmp unless
``TEMP`` says otherwise. A worker removes an existing file of that name before it binds, and
the frontend deletes it when the worker exits: a second TorchServe left at the defaults takes
over the first one's worker socket. So each server a tool starts gets a temp directory of its
own (``socket_dir_for``) and a block of worker ports nothing uses: no ``.ts.sock.<port>``
file in a temp directory, no Unix socket of that name (``/proc/net/unix`` lists one whose
file was deleted), no bound TCP port. One block per server keeps its scale-ups inside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
TORCHSERVE_WORKER_PORT = 9000  # TorchServe's default initial_worker_port
WORKER_PORT_BLOCK = 100  # worker ports a server may use: its workers, restarts, scale-ups
SOCKET_PREFIX = ".ts.sock."
# A Unix socket path holds at most 107 bytes (sun_path); ".ts.sock.65535" is 14 of them.
_MAX_SOCKET_DIR = 90
_JAVA_TMPDIR = "-Djava.io.tmpdir="
_SOCKET_NAME = re.compile(r"(?:^|/)\.ts\.sock\.(\d+)$")


class PortError(RuntimeError):
    """No block of worker ports is free."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on loopback that nothing listens on now. Every socket is
    held until all are chosen: a port just released may be the next one the kernel hands
    out, and a server given the same port twice (HTTP management and gRPC) registered a
    model, then stopped when gRPC could not bind."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind((LOOPBACK, 0))
        return [int(s.getsockname()[1]) for s in sockets]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    return free_ports(1)[0]


def tcp_port_bound(port: int) -> bool:
    """Whether ``port`` cannot be bound on loopback now (in use, or lingering)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def listening(port: int) -> bool:
    """Whether a server accepts connections on ``port`` on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        return s.connect_ex((LOOPBACK, port)) == 0


def worker_socket_ports(dirs: Iterable[Path], proc_net_unix: str = "/proc/net/unix") -> set[int]:
    """Ports named by ``.ts.sock.<port>`` files in ``dirs`` and by Unix sockets anywhere."""
    names: list[str] = []
    for directory in dirs:
        try:
            names += os.listdir(directory)
        except OSError:
            continue
    try:  # columns: Num RefCount Protocol Flags Type St Inode Path
        lines = Path(proc_net_unix).read_text(errors="replace").splitlines()[1:]
    except OSError:  # no /proc here
        lines = []
    names += [fields[7] for fields in (line.split(None, 7) for line in lines) if len(fields) == 8]
    return {int(found.group(1)) for found in map(_SOCKET_NAME.search, names) if found}


def default_socket_dirs() -> list[Path]:
    """Where another TorchServe's worker sockets are: /tmp and the temp directories named here."""
    dirs = [Path("/tmp"), Path(tempfile.gettempdir())]
    dirs += [Path(os.environ[v]) for v in ("TEMP", "TMPDIR") if os.environ.get(v)]
    return list(dict.fromkeys(dirs))


def free_worker_ports(
    extra_dirs: Iterable[Path] = (),
    block: int = WORKER_PORT_BLOCK,
    start: int = TORCHSERVE_WORKER_PORT,
    proc_net_unix: str = "/proc/net/unix",
) -> int:
    """The first port of the first block of ``block`` ports, from ``start`` upward in
    steps of ``block``, that no socket file, Unix socket or bound TCP port uses.

    Raises:
        PortError: every block up to 65535 has a port in use.
    """
    if block < 1:
        raise ValueError(f"block: got {block}, expected an integer >= 1")
    used = worker_socket_ports([*default_socket_dirs(), *extra_dirs], proc_net_unix)
    for first in range(start, 65536 - block, block):
        ports = range(first, first + block)
        if used.isdisjoint(ports) and not any(tcp_port_bound(p) for p in ports):
            return first
    raise PortError(f"no block of {block} free worker ports between {start} and 65535")


def socket_dir_for(workdir: Path) -> Path:
    """The server's own temp directory: ``workdir/tmp``, or, when that is too long for a
    Unix socket path, one under /tmp named after ``workdir`` (so a later stop finds it)."""
    own = Path(workdir) / "tmp"
    if len(str(own)) <= _MAX_SOCKET_DIR:
        return own
    return Path("/tmp") / f"ts-microbatch-{hashlib.sha1(str(workdir).encode()).hexdigest()[:12]}"


def without_java_tmpdir(props: dict[str, str]) -> dict[str, str]:
    """config.properties entries without any ``-Djava.io.tmpdir`` in ``vmargs``: it comes
    after TEMP's on Java's command line and would win over the server's own."""
    given = props.get("vmargs", "").split()
    kept = [arg for arg in given if not arg.startswith(_JAVA_TMPDIR)]
    if kept == given:
        return props
    logger.info("vmargs: %s dropped: each server has a temp directory of its own", _JAVA_TMPDIR)
    rest = {k: v for k, v in props.items() if k != "vmargs"}
    return {**rest, "vmargs": " ".join(kept)} if kept else rest
