"""Generative tests of isolation: random batches, bad requests, sizes, padding and threads.

The invariant at the pipeline's boundary: every request is answered exactly once, a good
request gets what it gets alone, and a bad request gets its own error, whatever the batch
around it, the micro-batch size, the allowed sizes, where padding happens and how many
threads each stage has.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.unit.fakes import Bad, FakeHandler, expected
from ts_microbatch import InvalidInputError, MicroBatching, MicroBatchingConfig
from ts_microbatch.config import STAGES

pytestmark = pytest.mark.generative


class Rejecting(FakeHandler):
    """Rejects its bad items with the error a decoder raises for bad input."""

    def _step(self, stage: str, items: list[int]) -> None:
        try:
            super()._step(stage, items)
        except Bad as exc:
            raise InvalidInputError(str(exc)) from exc


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 24))
    bad = draw(st.dictionaries(st.integers(0, n - 1), st.sampled_from(STAGES), max_size=n))
    size = draw(st.integers(1, 12))
    allowed = draw(
        st.none()
        | st.sets(st.integers(1, 16), min_size=1, max_size=4).map(
            lambda s: sorted(s | {max(s | {size})})
        )
    )
    settings: dict[str, Any] = {
        "micro_batch_size": size,
        "parallelism": {stage: draw(st.integers(1, 3)) for stage in STAGES},
    }
    if allowed is not None:
        settings["allowed_micro_batch_sizes"] = allowed
        settings["pad"] = draw(st.sampled_from(["requests", "tensors"]))
        settings["warmup"] = {}
    return {"n": n, "bad": bad, "settings": settings}


def run(handler: FakeHandler, settings: dict[str, Any], items: list[int]) -> list[Any]:
    config = MicroBatchingConfig.from_mapping(settings)
    with MicroBatching(handler, config=config) as mb:
        futures = mb.submit(items)
        return [f.exception(timeout=60) or f.result() for f in futures]


@given(scenarios())
@example({"n": 7, "bad": {5: "inference"}, "settings": {"micro_batch_size": 7}})
def test_every_request_gets_its_own_answer_or_its_own_error(scenario: dict[str, Any]) -> None:
    items = list(range(100, 100 + scenario["n"]))
    handler = Rejecting()
    for index, stage in scenario["bad"].items():
        handler.fail_on[stage].add(items[index])
    results = run(handler, scenario["settings"], items)
    assert len(results) == len(items)
    for index, (item, result) in enumerate(zip(items, results)):
        if index in scenario["bad"]:
            assert isinstance(result, InvalidInputError), (index, result)
            assert str(item) in str(result)  # its own error, naming its own item
        else:
            assert result == expected([item])[0], (index, result)
    # No request's item was sent to postprocess's answers twice: one answer each.
    answered = [r["item"] for r in results if isinstance(r, dict)]
    assert len(answered) == len(set(answered))


@given(
    st.integers(1, 24),
    st.integers(0, 23),
    st.sampled_from(STAGES),
    st.integers(1, 12),
)
def test_one_generic_failure_is_isolated_whatever_the_batch(
    n: int, bad_index: int, stage: str, size: int
) -> None:
    # A plain exception (not declared bad input) from one request is still pinned on it.
    items = list(range(n))
    bad = items[bad_index % n]
    handler = FakeHandler()
    handler.fail_on[stage].add(bad)
    results = run(handler, {"micro_batch_size": size}, items)
    for item, result in zip(items, results):
        if item == bad:
            assert isinstance(result, Bad)
        else:
            assert result == expected([item])[0]
