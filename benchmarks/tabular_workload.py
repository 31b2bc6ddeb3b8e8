"""The latency study's ``tabular`` workload (benchmarks/latency_load.py ``--workload
tabular``, ``make bench-latency WORKLOAD=tabular``): the fraud scorer example
(examples/tabular_scorer, an MLP over 128 JSON features) built from the checkout, and the
same .mar with its handler swapped for each baseline:

* ``head-example``: the example as it ships (micro_batching.json: micro-batch 8, threads
  1/1/1);
* ``plain``: benchmarks/handlers/plain_tabular_handler.py, the same stages under
  TorchServe's ``BaseHandler.handle`` (no micro-batching);
* ``upstream``: benchmarks/handlers/upstream_tabular_handler.py, the same stages under
  TorchServe 0.12.0's ``MicroBatching`` at the example's micro-batch size and threads.

The bodies are the example's corpus, 512 ``{"features": [...]}`` bodies from fixed seeds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ts_microbatch.tools.corpus import Corpus, read_corpus
from ts_microbatch.tools.mar import PLAIN_OVERRIDE, override_mar

ROOT = Path(__file__).resolve().parents[1]
HANDLERS = ROOT / "benchmarks" / "handlers"
# model -> (override of the micro_batching settings, handler swapped in). Upstream's handler
# reads micro_batch_size and parallelism from the example's micro_batching.json; ours stays
# off beside it.
SWAPS: dict[str, tuple[dict[str, Any], Path]] = {
    "plain": (PLAIN_OVERRIDE, HANDLERS / "plain_tabular_handler.py"),
    "upstream": ({"enabled": False}, HANDLERS / "upstream_tabular_handler.py"),
}


def _build_module() -> Any:
    path = ROOT / "examples" / "tabular_scorer" / "build_mar.py"
    spec = importlib.util.spec_from_file_location("tabular_scorer_build_mar", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tabular_models(models: set[str], work: Path) -> tuple[dict[str, Path], Corpus]:
    """Each of ``models`` (``head-example``, ``plain``, ``upstream``) as a .mar under
    ``work``, and the example's corpus."""
    build = _build_module()
    example_work = work / "tabular"
    mar = build.build_mar(work / "built", work_dir=example_work)
    sources: dict[str, Path] = {}
    for model in models:
        if model in SWAPS:
            override, handler = SWAPS[model]
            sources[model] = work / "built" / f"{model}-tabular.mar"
            override_mar(mar, sources[model], override, None, handler)
        else:
            sources[model] = mar
    return sources, read_corpus(example_work / build.prepare.CORPUS_FILE)
