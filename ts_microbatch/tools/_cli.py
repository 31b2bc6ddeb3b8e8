"""What a tool's usage line calls it, and what the --help of one that starts a TorchServe says."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

# setup.py's tools extra, by import name (tests/tools/test_commands.py holds them equal).
TOOLS_EXTRA = ("psutil", "prometheus_client")


def prog(module: str) -> str:
    """How a user runs ``module``'s tool the way this process was run: its console command
    ``ts-microbatch-<tool>`` from any console command, else ``python -m <module>``. A hint
    naming another tool names that tool's command, never the running one's."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    tool = module.rsplit(".", 1)[-1]
    return f"ts-microbatch-{tool}" if name.startswith("ts-microbatch-") else f"python -m {module}"


def require_tools(module: str) -> None:
    """Exits at once, naming the extra, when a module of the tools extra is missing, so a
    measured run never ends in an ImportError (prometheus_client is read at its end)."""
    missing = [name for name in TOOLS_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(
            f"{prog(module)} needs {' and '.join(missing)}, of the tools extra: "
            "pip install 'ts_microbatch[tools]'"
        )


@contextlib.contextmanager
def start_tool(module: str) -> Iterator[None]:
    """Around a tool that starts TorchServes: ``require_tools`` first, then a ``kill``
    (SIGTERM) ends it as Ctrl-C does, through its ``finally`` blocks, so the servers it
    started are stopped, not left serving (Python's default dies at once); further SIGTERMs
    are ignored while it cleans up, and the previous handler is back when it returns."""
    require_tools(module)

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class OptionError(argparse.ArgumentTypeError, ValueError):
    """A command-line value refused: argparse prints its message (a ValueError's it would
    replace with "invalid <function> value"), and callers outside argparse catch a
    ValueError."""


def counts(text: str) -> int:
    """An integer >= 0 (``--confirm``, ``--floor-requests``)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise OptionError(f"expected an integer >= 0, got {text!r}")
    return value


def positive(text: str) -> int:
    """An integer >= 1 (``--workers``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(f"expected an integer >= 1, got {text!r}")
    return value


SAFE_BESIDE = (  # ts_microbatch.tools.ports says why
    "Safe beside a running TorchServe: each server it starts takes free HTTP and gRPC ports, "
    "a block of worker ports no other server uses and a temp directory of its own for the "
    "worker sockets, where TorchServe's defaults would take over a running server's "
    "/tmp/.ts.sock.9000. With --ts-config, your config.properties keeps its settings but "
    "those."
)
