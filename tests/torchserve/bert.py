"""The BERT example's pieces for the tests: its build and text modules, a small model size,
its model-config.yaml as this core can read it, and how close two answers must be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.helpers import ROOT, load_module

EXAMPLE = Path(ROOT, "examples/bert_classifier")
build = load_module("examples/bert_classifier/build_mar.py", "ts_microbatch_bert_build_mar")
texts = load_module("examples/bert_classifier/texts.py", "ts_microbatch_bert_texts")
# The example's model is 4 x 256; the tests' is built in a second and runs in milliseconds.
SMALL_BERT = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}
# Padding inside a micro-batch must not change a score by more than this.
TOLERANCE = 1e-4


def example_config(**overrides: Any) -> dict[str, Any]:
    """The example's model-config.yaml, ``overrides`` applied to its micro_batching section."""
    config = yaml.safe_load((EXAMPLE / "model-config.yaml").read_text(encoding="utf-8"))
    return {**config, "micro_batching": {**config["micro_batching"], **overrides}}


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= TOLERANCE for g, w in zip(got, want))
