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
