"""benchmarks/image_sizes.py's rounds (make bench-detect, make bench-segment): every round
serves each variant once, in a seeded shuffled order; runs are numbered by round and their
metrics and samples kept under that number; a variant TorchServe refuses leaves the later
rounds. No server: benchmark.run_rounds is replaced by a fake that records its calls."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import load_module
from ts_microbatch.tools.runs import round_order

image_sizes = load_module("benchmarks/image_sizes.py", "ts_microbatch_image_sizes_bench")
VARIANTS = ["plain", "plain1", "ours", "nogroup", "refused", "mb1"]
VARIANT_ARGS = [
    'nogroup={"shape_groups": null}',
    'refused={"shape_groups": 0}',
    'mb1={"micro_batch_size": 1}',
]


def arguments(tmp: Path, seed: int) -> argparse.Namespace:
    """What image_sizes.main parses, the example's .mar and corpus given."""
    parser = argparse.ArgumentParser()
    image_sizes.benchmark.add_arguments(parser)
    namespace = parser.parse_args(
        ["--mar", str(tmp / "x.mar"), "--corpus", str(tmp), "--rounds", "3"]
        + [f"--variant={v}" for v in VARIANT_ARGS]
    )
    namespace.seed = seed
    return namespace


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The order each run_rounds call served, shuffled from its seed as the real one does;
    "refused" is refused at its first run."""
    calls: list[list[str]] = []

    def run_rounds(
        rounds: int, variants: list[tuple[str, Any]], *rest: Any, seed: int = 0
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        here: Path = rest[-1]
        assert rounds == 1
        calls.append(round_order([name for name, _ in variants], 0, seed))
        rows = []
        for name in calls[-1]:
            if name == "refused":
                continue
            for kind, suffix in (("metrics", ".prom"), ("samples", ".json")):
                (here / kind).mkdir(exist_ok=True)
                (here / kind / f"{name}-r1{suffix}").write_text(f"{name} {here.name}")
            rows.append({"handler": name, "repeat": 1})
        return rows, ({"refused": "not registered"} if "refused" in calls[-1] else {})

    class Corpus:
        label = "corpus"

    monkeypatch.setattr(image_sizes.benchmark, "run_rounds", run_rounds)
    monkeypatch.setattr(image_sizes, "read_corpus", lambda path: Corpus())
    monkeypatch.setattr(image_sizes, "override_mar", lambda *a, **k: {})
    monkeypatch.setattr(
        image_sizes.benchmark, "frontend_of", lambda *a: {"batchSize": 8, "maxBatchDelay": 50}
    )
    return calls


def test_every_round_serves_each_variant_once_in_a_seeded_shuffled_order(
    tmp_path: Path, served: list[list[str]]
) -> None:
    rows, refused, orders, _ = image_sizes.shuffled_rounds(arguments(tmp_path, 0), tmp_path)
    assert orders == served and len(orders) == 3  # what was recorded is what ran
    assert sorted(orders[0]) == sorted(VARIANTS)
    assert all(sorted(order) == sorted(set(VARIANTS) - {"refused"}) for order in orders[1:])
    assert len({tuple(o) for o in orders}) > 1  # shuffled, not one fixed order
    assert refused == {"refused": "not registered"}
    assert [row["repeat"] for row in rows] == [1] * 5 + [2] * 5 + [3] * 5
    kept = tmp_path / "metrics" / "mb1-r3.prom"
    assert kept.read_text() == "mb1 round-3"
    assert (tmp_path / "samples" / "ours-r2.json").read_text() == "ours round-2"

    again = tmp_path / "again"
    again.mkdir()
    _, _, same, _ = image_sizes.shuffled_rounds(arguments(tmp_path, 0), again)
    assert same == orders  # the seed decides the orders
