"""Where a long tool keeps what it measured: output folders made before the first run, and
one JSON line per run appended as it comes.

A tool makes its folders before it measures anything (a path it cannot use fails at once,
naming it) and appends each run to a ``.jsonl`` file as it is measured, so a crash at the
end loses only the summary. A tool that deletes and overwrites in its folder writes only
in one it made (``claimed_dir``: new, empty, or holding its marker), never in a user's.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any


class OutputError(OSError):
    """An output path a tool cannot create or write."""


def output_dir(path: Path, what: str = "output folder") -> Path:
    """``path`` created (with its parents) and writable, before any run.

    Raises:
        OutputError: it cannot be made or written, with the path and why.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot create it: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK):
        raise OutputError(f"{what} {path}: not writable")
    return path


MARKER = ".ts-microbatch-output"  # in a folder a tool made: which tool, so it may write again


def claimed_dir(path: Path, tool: str, what: str = "--out") -> Path:
    """``path`` as ``output_dir`` makes it, for ``tool`` to delete and overwrite in: new,
    empty, or made by ``tool`` before (its marker says so).

    Raises:
        OutputError: ``path`` is not empty and not ``tool``'s; nothing was touched.
    """
    path = Path(path)
    marker = path / MARKER
    made_by = None
    if marker.is_file():
        with contextlib.suppress(ValueError, AttributeError):
            made_by = json.loads(marker.read_text(encoding="utf-8")).get("made_by")
    if made_by != tool and path.is_dir() and any(path.iterdir()):
        whose = f"was made by {made_by}" if made_by else f"has no {MARKER} of a tool's"
        raise OutputError(
            f"{what} {path}: the folder is not empty and {whose}: {tool} overwrites and "
            "deletes what it writes in its folder, so it writes only into a new or empty "
            "folder or one it made itself; give another"
        )
    output_dir(path, what)
    if made_by != tool:
        marker.write_text(json.dumps({"made_by": tool}) + "\n", encoding="utf-8")
    return path


def output_file(path: Path, what: str = "output file") -> Path:
    """A file to be written later: its folder created now, ``path`` not a directory."""
    path = Path(path)
    output_dir(path.parent, f"the folder of the {what}")
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a directory")
    return path


class ResultsLog:
    """A ``.jsonl`` file of runs (its folder made now): each ``append`` writes one line,
    with the time, and flushes it to disk; lines already in it are kept."""

    def __init__(self, path: Path) -> None:
        self.path = output_file(path, "results file")

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}, default=str)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        """Every line so far, as written."""
        text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]
