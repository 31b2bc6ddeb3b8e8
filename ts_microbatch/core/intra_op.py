"""How many threads a stage thread's own torch operations may use (torch's intra-op threads).

A stage served by N threads gets its parallelism from those threads. If each of them also
runs torch operations on an OpenMP team as wide as the machine (torch's default), the cores
are oversubscribed, and the team's threads spin between the many small parallel regions of
per-item work (a decode, a resize, a normalize per image) on cores the other stage threads,
the frontend and other workers need. Measured on this project's 2-core machine
(``benchmarks/intra_op.py``, ``benchmarks/results/intra_op/``), TorchServe's ImageClassifier
preprocess of a 720px JPEG: on one thread, one image a call, 10.5 ms of CPU with torch's
default 2 intra-op threads against 5.3 with 1, and no faster (5.4 against 5.3 ms); on two
threads, four images a call, 8% less time and 6% less CPU with 1. So by default the
preprocess and postprocess threads run their torch operations on one thread each, and
inference keeps the process's setting (one inference thread running a model on a CPU is
what intra-op threads are for).

``torch.set_num_threads`` cannot set this for one thread: besides the calling thread's
OpenMP setting it sets the process default, which every thread that first uses torch later
takes (the inference thread, the handler's own). OpenMP's ``omp_set_num_threads`` is per
thread; it is called after torch's own per-thread initialization (``torch.get_num_threads``
runs it), which would otherwise overwrite it. Whether it took effect is read back from torch:
a torch without OpenMP, or another OpenMP runtime found first, leaves the setting alone, and
the first thread that finds so logs one warning.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._checks import YAML_SECTION, _check_keys, _positive_int
from .errors import ConfigError

logger = logging.getLogger(__name__)

STAGES = ("preprocess", "inference", "postprocess")


@dataclass(frozen=True)
class IntraOpThreads:
    """Torch intra-op threads for each stage's threads; None leaves the process's setting."""

    preprocess: int | None = 1
    inference: int | None = None
    postprocess: int | None = 1

    def __post_init__(self) -> None:
        for stage in STAGES:
            _threads_or_none(getattr(self, stage), f"{YAML_SECTION}.intra_op_threads.{stage}")

    @classmethod
    def from_mapping(
        cls,
        mapping: Any,
        prefix: str = f"{YAML_SECTION}.intra_op_threads",
        base: IntraOpThreads | None = None,
    ) -> IntraOpThreads:
        """Built from a mapping of stage name to threads (or null), over ``base``."""
        if not isinstance(mapping, Mapping):
            raise ConfigError(
                f"{prefix}: got {mapping!r}, expected a mapping of stage to threads (or null)"
            )
        _check_keys(mapping, STAGES, prefix)
        values = (base or cls()).as_dict()
        for stage, threads in mapping.items():
            values[stage] = _threads_or_none(threads, f"{prefix}.{stage}")
        return cls(**values)

    def as_dict(self) -> dict[str, int | None]:
        return {stage: getattr(self, stage) for stage in STAGES}


def _threads_or_none(value: Any, key: str) -> int | None:
    if value is None:
        return None
    try:
        return _positive_int(value, key)
    except ConfigError:
        raise ConfigError(f"{key}: got {value!r}, expected an integer >= 1 or null") from None


_lock = threading.Lock()  # guards the three fields below
_setter: Callable[[int], None] | None = None  # the one found to work
_searched = False
_warned = False


def limit_intra_op_threads(threads: int) -> bool:
    """Sets the calling thread's torch intra-op threads to ``threads``, and only its own.

    Returns whether torch now uses that many on this thread. True at once when torch is not
    imported: the pipeline calls this when a thread takes its first micro-batch, after the
    handler's initialize, so a handler that uses torch has imported it."""
    global _setter, _searched
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    if torch.get_num_threads() == threads:  # this call also runs torch's per-thread init
        return True
    with _lock:
        if _setter is None and not _searched:
            _searched = True
            _setter = _find_setter(torch, threads)
        setter = _setter
    if setter is not None:
        setter(threads)
        if torch.get_num_threads() == threads:
            return True
    _warn_once(threads)
    return False


def _find_setter(torch: Any, threads: int) -> Callable[[int], None] | None:
    """The ``omp_set_num_threads`` that changes what torch reads on this thread: the
    process's global symbol, else that of an OpenMP runtime already loaded (libgomp from a
    pip wheel, libiomp5 in conda); tried on the calling thread, which wants ``threads``
    anyway. Only runtimes already in the process are opened: loading a second one can abort
    it (libiomp5's "OMP: Error #15")."""
    for path in [None, *_loaded_openmp_runtimes()]:
        try:
            function = ctypes.CDLL(path).omp_set_num_threads
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_int]
        function.restype = None
        function(threads)
        if torch.get_num_threads() == threads:
            return function
    return None


def _loaded_openmp_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (Linux; elsewhere none)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line and "omp" in line}
    except OSError:
        return []
    names = ("libgomp", "libiomp5", "libomp")
    return sorted(p for p in paths if os.path.basename(p).startswith(names) and ".so" in p)


def _warn_once(threads: int) -> None:
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
    logger.warning(
        "%s.intra_op_threads: cannot give a stage thread %d intra-op thread(s) (torch without "
        "OpenMP, or its OpenMP runtime not found); stage threads keep torch's setting",
        YAML_SECTION,
        threads,
    )
