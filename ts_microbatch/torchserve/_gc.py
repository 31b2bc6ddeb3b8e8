"""The loaded model out of the cyclic garbage collector's way: ``gc.freeze()`` once a worker
has loaded and warmed its model (``micro_batching.freeze_gc``, on by default).

A worker holds every object torch, TorchServe and the model made: measured in a plain
interpreter here, 186k objects tracked after importing torch, TorchServe's ``base_handler``
and this package (365k with transformers), and a full collection walked them all in 83-97
ms (189-198 ms) with the GIL held, every stage thread stopped. They live as long as the
worker and never become garbage; moved to the permanent generation, a full collection walks
only what requests allocate since. Reference counting still frees everything; what a
frozen object held in a reference cycle that later becomes garbage stays until the worker
exits (the model's own structures, made once).
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_loaded() -> int:
    """Collects what loading left as garbage, then freezes what remains; returns the
    objects frozen (logged with the time the collection took)."""
    started = time.perf_counter()
    gc.collect()
    collect_ms = 1000 * (time.perf_counter() - started)
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info(
        "freeze_gc: %d objects moved out of the garbage collector's way (a full collection "
        "over them took %.0f ms with every thread stopped)",
        frozen,
        collect_ms,
    )
    return frozen
