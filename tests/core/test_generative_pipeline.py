"""Generative tests of isolation: random batches, bad requests, sizes, padding and threads.

The invariant at the pipeline's boundary: every request is answered exactly once, a good
request gets what it gets alone, and a bad request gets its own error, whatever the batch
around it, the micro-batch size, the allowed sizes, where padding happens and how many
threads each stage has.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.core.fakes import Bad, FakeHandler, expected
from ts_microbatch import InvalidInputError, MicroBatching, MicroBatchingConfig, Pipeline
from ts_microbatch.core.config import STAGES
from ts_microbatch.core.errors import SiblingFailedError

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


@st.composite
def generic_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Requests of one item (plain) or several (KServe instances), some items failing
    with a generic error in some stage, cut into micro-batches of items."""
    per_request = draw(
        st.lists(st.integers(1, 1), min_size=1, max_size=16)
        | st.lists(st.integers(1, 4), min_size=1, max_size=10)
    )
    owners = [request for request, n in enumerate(per_request) for _ in range(n)]
    n = len(owners)
    bad = draw(
        st.dictionaries(st.integers(0, n - 1), st.sampled_from(STAGES), min_size=0, max_size=8)
    )
    size = draw(st.integers(1, 8))
    padding: dict[str, Any] = {}
    if draw(st.booleans()):
        allowed = draw(st.sets(st.integers(1, 10), min_size=1, max_size=3))
        padding["allowed_sizes"] = sorted(allowed | {max(allowed | {size})})
        padding["padded_stages"] = draw(st.sampled_from([list(STAGES), ["inference"]]))
    threads = {stage: draw(st.integers(1, 3)) for stage in STAGES}
    return {"owners": owners, "bad": bad, "size": size, "padding": padding, "threads": threads}


def named_items(error: BaseException) -> set[int]:
    """The items a fake stage's error names: ``"<stage> rejects [a, b]"``."""
    return {int(x) for x in re.findall(r"\d+", str(error).split("rejects", 1)[1])}


NO_PADDING: dict[str, Any] = {}
ONE_THREAD = {stage: 1 for stage in STAGES}


@given(generic_scenarios())
# Every micro-batch fails its first run, with three failing requests; two failing requests
# in one micro-batch, one of them a KServe request whose failing instances are in two
# micro-batches (both judged "systemic" by 9a922de's rule, which counted evidence).
@example(
    {
        "owners": [0, 1, 2, 3, 4, 5],
        "bad": {0: "inference", 2: "inference", 5: "inference"},
        "size": 2,
        "padding": NO_PADDING,
        "threads": ONE_THREAD,
    }
)
@example(
    {
        "owners": [0, 0, 0, 1, 2, 2],
        "bad": {1: "preprocess", 2: "preprocess", 3: "preprocess"},
        "size": 2,
        "padding": {"allowed_sizes": [4], "padded_stages": list(STAGES)},
        "threads": ONE_THREAD,
    }
)
def test_generic_failures_fail_only_their_own_requests(scenario: dict[str, Any]) -> None:
    # Generic (5xx-class) errors, up to eight bad items: a request fails if and only if it
    # has a bad item, with its own item's error (its items not run get SiblingFailedError,
    # caused by it), as its own failure. Requests of several items (KServe) too.
    owners: list[int] = scenario["owners"]
    items = [100 + i for i in range(len(owners))]
    bad_items = {items[i] for i in scenario["bad"]}
    handler = FakeHandler()
    for index, stage in scenario["bad"].items():
        handler.fail_on[stage].add(items[index])
    stages = {name: getattr(handler, name) for name in STAGES}
    with Pipeline(
        stages,
        micro_batch_size=scenario["size"],
        parallelism=scenario["threads"],
        **scenario["padding"],
    ) as pipeline:
        batch = pipeline.submit_batch(items, owners=owners)
        assert batch.wait(60)
    results = [f.exception() or f.result() for f in batch.futures]
    own_items = {r: {items[i] for i, o in enumerate(owners) if o == r} for r in owners}
    for index, (item, result) in enumerate(zip(items, results)):
        own = own_items[owners[index]]
        if not own & bad_items:
            assert result == expected([item])[0], (index, result)
            continue
        if isinstance(result, SiblingFailedError):
            result = result.__cause__
        elif item in bad_items:
            failure = batch.failure(index)
            assert failure is not None and failure.isolated, (index, failure)
        if result is not None and not isinstance(result, dict):
            assert isinstance(result, Bad), (index, result)
            assert named_items(result) <= own & bad_items, (index, result)
        assert item not in bad_items or isinstance(result, Bad), (index, result)
