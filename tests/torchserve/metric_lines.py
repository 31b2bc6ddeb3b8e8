"""The metric lines a worker wrote, as TorchServe's frontend reads them: its log records
split into lines (the pipeline's lines of a burst share one record), each with the thread
that wrote it."""

from __future__ import annotations

import logging
from collections.abc import Iterable


def written(records: Iterable[logging.LogRecord], prefix: str = "[METRICS]") -> list[str]:
    """Every line starting with ``prefix``, in order."""
    return [line for line, _ in written_by(records, prefix)]


def written_by(
    records: Iterable[logging.LogRecord], prefix: str = "[METRICS]"
) -> list[tuple[str, str]]:
    """(line, name of the thread that wrote it) for every line starting with ``prefix``."""
    return [
        (line, record.threadName or "")
        for record in records
        for line in record.getMessage().splitlines()
        if line.startswith(prefix)
    ]
