"""torch-model-archiver, run so that two builds never share a staging folder.

torch-model-archiver 0.12 copies a model's files into ``<temp dir>/<model name>`` before it
packs them, deleting that folder first (``ModelExportUtils.copy_artifacts``). Two builds of
one model name at the same time (a benchmark repackaging variants while the user builds
their own .mar, two test runs) delete and fill each other's folder: one fails with a
missing handler, or packs the other's files. Each run here gets a temp dir of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


class ArchiverError(RuntimeError):
    """torch-model-archiver exited with an error; the message carries what it printed."""


def archiver_path() -> Path:
    """The torch-model-archiver beside this interpreter (a venv's, not another's on PATH)."""
    return Path(sys.executable).with_name("torch-model-archiver")


def run_archiver(args: Sequence[str]) -> None:
    """Runs torch-model-archiver with ``args`` in a staging folder of its own.

    Raises:
        ArchiverError: it exited with an error (its output in the message).
    """
    with tempfile.TemporaryDirectory(prefix="tsmb-archiver-") as staging:
        proc = subprocess.run(
            [str(archiver_path()), *args],
            env={**os.environ, "TMPDIR": staging},
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()
        raise ArchiverError(f"torch-model-archiver {' '.join(args[:4])}... failed:\n{output}")
