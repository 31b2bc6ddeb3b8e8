"""Compiled models under the pipeline: one inference call at a time, outputs copied off the
model's memory, and recompiles after warm-up counted and reported.

The thread rules come from PyTorch: Dynamo and Inductor are not thread-safe
(pytorch/pytorch#118260, #143931), so two threads must never be inside a compiled model at
once, and CUDA-graph trees keep per-thread state (#123177), so the graphs must be recorded
on the thread that replays them: warm-up runs through the pipeline's own inference thread.
With ``mode="reduce-overhead"`` a CUDA graph writes every call's outputs to the same
memory, so outputs are cloned before a postprocess thread reads them while the next
micro-batch replays the graph.

torch is imported only when a compiled model is there: the core does not need it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..core.config import ON_RECOMPILE, YAML_SECTION
from ..core.errors import ConfigError
from ..core.metrics import PipelineObserver

logger = logging.getLogger(__name__)


def check_inference_threads(threads: int) -> None:
    """Refuses more than one inference thread for a compiled model, at load or at run time.

    Raises:
        ConfigError: naming ``micro_batching.parallelism.inference``.
    """
    if threads > 1:
        raise ConfigError(
            f"{YAML_SECTION}.parallelism.inference: got {threads}, expected 1 for a compiled "
            "model: Dynamo and Inductor are not thread-safe (pytorch/pytorch#118260) and CUDA "
            "graphs replay only on the thread that recorded them (#123177); the pipeline "
            "overlaps preprocess and postprocess with the one inference thread"
        )


def is_compiled(model: Any) -> bool:
    """True for a ``torch.compile``d module (what TorchServe's ``pt2:`` section makes)."""
    torch = sys.modules.get("torch")
    if torch is None or model is None:
        return False
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule)


def compile_count() -> int:
    """Graphs Dynamo has compiled in this process, plus the frames it gave up on at the
    recompile limit (each runs eagerly from then on, counted once).

    Not Dynamo's count of frames it looked at (``counters["frames"]["total"]``): that one
    also counts frames it skipped, and frames of other code can run on the inference thread
    inside a compiled call (a finalizer run by the garbage collector, say), so a test saw a
    "recompile" now and then where no graph was compiled.
    """
    from torch._dynamo.utils import counters

    limit_hits = sum(
        count
        for reason, count in counters["unimplemented"].items()
        if any(words in reason for words in _LIMIT_REASONS)
    )
    return int(counters["stats"]["unique_graphs"]) + limit_hits


# Dynamo's reason for giving a frame up at the limit: torch 2.14's words, and torch 2.4's
# ("cache_size_limit reached", "accumulated_cache_size_limit reached").
_LIMIT_REASONS = ("recompile limit", "cache_size_limit reached")


def recompile_limit_name() -> str:
    """The name of Dynamo's recompile limit in its config: ``recompile_limit`` in recent
    torch, ``cache_size_limit`` in torch 2.4 (the official TorchServe image's)."""
    import torch._dynamo.config as dynamo_config

    return "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"


def recompile_limit() -> int:
    """Graphs Dynamo keeps per frame before it runs the frame eagerly, silently."""
    import torch._dynamo.config as dynamo_config

    return int(getattr(dynamo_config, recompile_limit_name()))


def cover_recompile_limit(graphs: int) -> None:
    """Raises Dynamo's recompile limit on the calling thread to ``graphs`` when it is lower.

    The calling thread's, because Dynamo's config is per thread (torch 2.14 keeps a user's
    setting in a ContextVar): set in ``initialize`` it never reached the pipeline's inference
    thread, which compiles. Under the default of 8 the 9th shape of a 3 x 3 grid of allowed
    sizes x sequence lengths was given up on at warm-up and ran eagerly from then on.
    """
    limit = recompile_limit()
    if graphs <= limit:
        return
    import torch._dynamo.config as dynamo_config

    name = recompile_limit_name()
    setattr(dynamo_config, name, graphs)
    logger.info(
        "torch._dynamo.config.%s raised from %d to %d on %s: the shapes inference can see "
        "(allowed micro-batch sizes x allowed sequence lengths), one graph each",
        name,
        limit,
        graphs,
        threading.current_thread().name,
    )


def clone_tensors(value: Any) -> Any:
    """``value`` with every tensor in it (lists, tuples, dicts) cloned."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.clone(), value)


class CompiledInference:
    """Wraps the inference stage of a compiled model.

    Calls are serialized (a lock, so a thread that replaces a stuck one waits instead of
    entering the model beside it), outputs are cloned, and compiles during a call are
    counted. Compiles inside :meth:`warming_up` are expected; any other is on the request
    path (after warm-up, or without one) and is reported to the observer and logged
    (``on_recompile``: "warn" or "error").

    Args:
        fn: the inference stage.
        observer: receives ``on_recompile``.
        on_recompile: the log level of a recompile after warm-up.
    """

    def __init__(
        self, fn: Callable[[Any], Any], observer: PipelineObserver, on_recompile: str = "warn"
    ) -> None:
        self._fn = fn
        self._observer = observer
        self._level = logging.WARNING
        self.on_recompile = on_recompile  # checked
        self._lock = threading.Lock()
        self._warming = False
        self.compiles = 0  # compiles seen during calls, warm-up included
        self.recompiles = 0  # compiles seen on the request path
        self.compiled_on: set[str] = set()  # names of the threads that compiled
        # The graphs the model may need (every shape inference can see), raised to on the
        # thread that calls it; None: Dynamo's limit as it is.
        self.recompile_limit: int | None = None

    @property
    def on_recompile(self) -> str:
        """How a recompile after warm-up is logged: "warn" or "error"; may change at run time."""
        return "error" if self._level == logging.ERROR else "warn"

    @on_recompile.setter
    def on_recompile(self, value: str) -> None:
        if value not in ON_RECOMPILE:
            raise ConfigError(
                f"{YAML_SECTION}.on_recompile: got {value!r}, expected one of "
                + ", ".join(ON_RECOMPILE)
            )
        self._level = logging.ERROR if value == "error" else logging.WARNING

    @contextlib.contextmanager
    def warming_up(self) -> Iterator[None]:
        """Compiles while in this block are warm-up's, expected."""
        self._warming = True
        try:
            yield
        finally:
            self._warming = False

    def __call__(self, data: Any) -> Any:
        with self._lock:
            if self.recompile_limit is not None:
                cover_recompile_limit(self.recompile_limit)
            before = compile_count()
            output = clone_tensors(self._fn(data))
            compiled = compile_count() - before
        if compiled:
            self._compiled(compiled, data)
        return output

    def _compiled(self, count: int, data: Any) -> None:
        self.compiles += count
        self.compiled_on.add(threading.current_thread().name)
        if self._warming:
            return
        self.recompiles += count
        self._observer.on_recompile(count)
        logger.log(
            self._level,
            "the compiled model recompiled on the request path, for input of shape %s "
            "(%d so far; past torch._dynamo.config.recompile_limit=%d graphs it runs "
            "eagerly): set allowed_micro_batch_sizes and a warmup that covers them",
            _shape(data),
            self.recompiles,
            recompile_limit(),
        )


def _shape(data: Any) -> str:
    shape = getattr(data, "shape", None)
    if shape is not None:
        return str(tuple(shape))
    return f"{type(data).__name__} of {len(data)}" if hasattr(data, "__len__") else "?"
