"""What a tool's usage line calls it: its console command, or ``python -m`` and its module."""

from __future__ import annotations

import sys
from pathlib import Path

COMMAND_PREFIX = "ts-microbatch-"


def prog(module: str) -> str:
    """``ts-microbatch-<what>`` when run as that console command (setup.py's entry points),
    else ``python -m <module>``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith(COMMAND_PREFIX) else f"python -m {module}"


# The --help of every tool that starts a TorchServe (ts_microbatch.tools.ports says why).
SAFE_BESIDE = (
    "Safe beside a running TorchServe: each server it starts takes free HTTP and gRPC ports, "
    "a block of worker ports no other server uses and a temp directory of its own for the "
    "worker sockets, where TorchServe's defaults would take over a running server's "
    "/tmp/.ts.sock.9000. With --ts-config, your config.properties keeps its settings but "
    "those."
)
