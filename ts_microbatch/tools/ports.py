"""Ports and socket paths for a TorchServe started beside others on one machine.

TorchServe's frontend hands each backend worker a Unix socket named after a port,
``<java.io.tmpdir>/.ts.sock.<port>``, counting up from ``initial_worker_port`` (9000 by
default) for every worker it starts, and Java's temp directory is ``/tmp`` unless the
``TEMP`` environment variable says otherwise (ts/model_server.py turns it into
``-Djava.io.tmpdir``). The worker removes an existing file of that name before it binds
(ts/model_service_worker.py), and the frontend deletes it when the worker exits
(Connector.clean). So a second TorchServe left at the defaults takes over the first one's
worker socket: its worker answers the first frontend's next connection, and its exit
deletes the live worker's path.

A tool therefore gives its server a temp directory of its own (``socket_dir``) and a block
of worker ports in which nothing is in use: no ``.ts.sock.<port>`` file in ``/tmp``, the
system temp directory or the server's own, no listening Unix socket of that name anywhere
(``/proc/net/unix`` still lists one whose file was deleted), and no bound TCP port (the
worker's TCP mode). Blocks are scanned upward from TorchServe's default, one block per
server, so a running server's own scale-ups (9001, 9002, ...) stay inside its block.
"""

from __future__ import annotations

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


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def tcp_port_bound(port: int) -> bool:
    """Whether ``port`` cannot be bound on loopback now (in use, or lingering)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def _listening_unix_paths(proc_net_unix: str = "/proc/net/unix") -> list[str]:
    """Paths of the machine's Unix sockets (empty where /proc is not there)."""
    try:
        lines = Path(proc_net_unix).read_text(errors="replace").splitlines()[1:]
    except OSError:
        return []
    # Num RefCount Protocol Flags Type St Inode Path
    return [fields[7] for fields in (line.split(None, 7) for line in lines) if len(fields) == 8]


def worker_socket_ports(dirs: Iterable[Path], proc_net_unix: str = "/proc/net/unix") -> set[int]:
    """Ports named by ``.ts.sock.<port>`` files in ``dirs`` and by Unix sockets anywhere."""
    used: set[int] = set()
    for directory in dirs:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        used.update(int(n[len(SOCKET_PREFIX) :]) for n in names if _SOCKET_NAME.match(n))
    for path in _listening_unix_paths(proc_net_unix):
        found = _SOCKET_NAME.search(path)
        if found:
            used.add(int(found.group(1)))
    return used


def default_socket_dirs() -> list[Path]:
    """Where another TorchServe's worker sockets are: Java's default temp directory and
    the one TEMP or TMPDIR name here."""
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
    """The server's own temp directory (Java's, so its worker sockets): ``workdir/tmp``,
    or, when that path is too long for a Unix socket, a short one under /tmp named after
    ``workdir`` (the same for every call, so that a later ``stop`` finds it)."""
    own = Path(workdir) / "tmp"
    if len(str(own)) <= _MAX_SOCKET_DIR:
        return own
    digest = hashlib.sha1(str(workdir).encode()).hexdigest()[:12]
    return Path("/tmp") / f"ts-microbatch-{digest}"


def without_java_tmpdir(props: dict[str, str]) -> dict[str, str]:
    """config.properties entries with any ``-Djava.io.tmpdir`` left out of ``vmargs``: it
    comes after TEMP's on Java's command line and would win over the server's own."""
    given = props.get("vmargs", "").split()
    kept = [arg for arg in given if not arg.startswith(_JAVA_TMPDIR)]
    if kept == given:
        return props
    logger.info("vmargs: %s dropped: each server has a temp directory of its own", _JAVA_TMPDIR)
    rest = {k: v for k, v in props.items() if k != "vmargs"}
    return {**rest, "vmargs": " ".join(kept)} if kept else rest
