"""How many threads a stage thread's own torch operations may use (torch's intra-op threads).

A stage served by N threads gets its parallelism from those threads. If each of them also
runs torch operations on an OpenMP team as wide as the machine (torch's default), the cores
are oversubscribed, and the team's threads spin between the many small parallel regions of
per-item work (a decode, a resize, a normalize per image) on cores the other stage threads,
the frontend and other workers need. Measured on this project's 2-core machine
(``benchmarks/dev/results/intra_op/``), TorchServe's ImageClassifier preprocess of a 720px JPEG:
on one thread, one image a call, 10.5 ms of CPU with torch's default 2 intra-op threads
against 5.3 with 1, and no faster (5.4 against 5.3 ms). So by default the preprocess and
postprocess threads run their torch operations on one thread each, and inference keeps the
process's setting (one inference thread running a model on a CPU is what intra-op threads
are for).

One team less changes how the teams left behave. GNU OpenMP (libgomp, which torch's pip
wheels bundle) lets a team's idle threads spin for about 300,000 iterations (a few ms)
after each parallel region, waiting for the next, unless it counts more threads of its own
than the machine has cores; then it spins 100 times and sleeps. It does not count the stage
threads, the frontend or other workers. With every stage thread at torch's default, the
preprocess teams push its count over the cores, so the inference team sleeps between its
regions; with those teams gone, the inference team's idle thread spins after each region,
through the whole accelerator wait, on a core the preprocess threads need (a 4 ms wait after
a mean over a micro-batch: 4.3 ms of CPU per call instead of 0.2). An inference that runs no
torch operation on the CPU opens no region and shows none of it. So a thread given fewer
intra-op threads than torch's default first runs one region at the default width: that
team then sleeps for the thread's life, and libgomp counts as many of its threads as when
every stage thread ran torch's default, and keeps its idle threads from spinning. Not done
when ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set (the user chose how teams wait) or
when the OpenMP runtime is not libgomp.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._checks import STAGES, YAML_SECTION, _per_stage, _positive_int
from .errors import ConfigError

logger = logging.getLogger(__name__)


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
        values = (base or cls()).as_dict()
        expected = "a mapping of stage to threads (or null)"
        return cls(**_per_stage(mapping, prefix, values, _threads_or_none, expected))

    def as_dict(self) -> dict[str, int | None]:
        return {stage: getattr(self, stage) for stage in STAGES}


def stage_preparer(
    names: Sequence[str], threads: Mapping[str, int | None] | None
) -> Callable[[int], None] | None:
    """What each stage thread runs before its first micro-batch (``StageWorkers``'s
    ``prepare``): its stage's intra-op threads, checked here, so a bad value fails the
    pipeline's construction; None when no stage is named with a count.

    Raises:
        ConfigError: an unknown stage, or a count that is not an integer >= 1 or None.
    """
    wanted: list[int | None] = [None] * len(names)
    for name, count in (threads or {}).items():
        if name not in names:
            raise ConfigError(
                f"{YAML_SECTION}.intra_op_threads.{name}: unknown stage; stages are "
                f"{', '.join(names)}"
            )
        if count is not None:
            wanted[list(names).index(name)] = _positive_int(
                count, f"{YAML_SECTION}.intra_op_threads.{name}"
            )
    if not any(wanted):
        return None

    def prepare(stage: int) -> None:
        count = wanted[stage]
        if count is not None:
            limit_intra_op_threads(count)

    return prepare


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
    current = torch.get_num_threads()  # this call also runs torch's per-thread init
    if current == threads:
        return True
    if current > threads:
        _dock_team(torch, current)
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


# Items per thread of the docking region: twice torch's grain size (at::internal::GRAIN_SIZE),
# so that torch splits it over every thread of the team.
_DOCK_ITEMS_PER_THREAD = 2 * 32768
# Environment variables by which a user chose how OpenMP teams wait.
_WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _dock_team(torch: Any, width: int) -> None:
    """Runs one parallel region of ``width`` threads on the calling thread, so that its
    libgomp team exists and sleeps for the thread's life (the module's docstring says why).
    Only with libgomp loaded and no wait setting in the environment; a failure is logged
    with the rest (the thread keeps serving)."""
    if any(name in os.environ for name in _WAIT_SETTINGS):
        return
    if not any(os.path.basename(p).startswith("libgomp") for p in _loaded_openmp_runtimes()):
        return
    torch.empty(width * _DOCK_ITEMS_PER_THREAD).fill_(0.0)


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
