"""What a tool's usage line calls it, and what the --help of one that starts a TorchServe says."""

from __future__ import annotations

import sys
from pathlib import Path


def prog(module: str) -> str:
    """``ts-microbatch-<what>`` when run as that console command, else ``python -m <module>``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("ts-microbatch-") else f"python -m {module}"


SAFE_BESIDE = (  # ts_microbatch.tools.ports says why
    "Safe beside a running TorchServe: each server it starts takes free HTTP and gRPC ports, "
    "a block of worker ports no other server uses and a temp directory of its own for the "
    "worker sockets, where TorchServe's defaults would take over a running server's "
    "/tmp/.ts.sock.9000. With --ts-config, your config.properties keeps its settings but "
    "those."
)
