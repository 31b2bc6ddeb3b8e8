"""A KServe request's status does not depend on which of its instances fails first.

The rule (``ts_microbatch.core.outcomes.Outcomes.skip_items_above``, docs/failures.md,
"Which status"): the lowest-index instance that fails names its request's status and
message; a failed instance's request is answered once every lower-index instance has passed
or failed, and the instances above it are not run. Forced here both ways with events, and
checked generatively against each failing instance run alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.torchserve.test_micro_batching import FakeContext
from ts_microbatch import MicroBatching
from ts_microbatch.core.config import MicroBatchingConfig
from ts_microbatch.core.errors import InvalidInputError
from ts_microbatch.core.micro_batch import _MicroBatch
from ts_microbatch.core.outcomes import Outcomes

WAIT_S = 10.0  # a bounded wait for an event another thread sets; never a timing asserted


def row_value(row: Any) -> Any:
    return row.get("data", row.get("body"))


class Stages:
    """What MicroBatching asks of a handler besides its stages (BaseHandler's hooks)."""

    context: Any = None

    def _is_describe(self) -> bool:
        return False

    def _is_explain(self) -> bool:
        return False


class EventHandler(Stages):
    """Stages over KServe instances (``{"data": value}``): "bad" fails preprocess (a decoder's
    ValueError: 400 once the first stage has served), "boom" fails inference (500); the
    hooks let a test hold a call until another thread got somewhere."""

    def __init__(self) -> None:
        self.context: Any = None
        self.before_bad_fails: Callable[[list[Any]], None] = lambda values: None
        self.before_boom_fails: Callable[[], None] = lambda: None

    def preprocess(self, rows: list[Any]) -> list[Any]:
        values = [row_value(row) for row in rows]
        if "bad" in values:
            self.before_bad_fails(values)
            raise ValueError("cannot read instance 'bad'")
        return values

    def inference(self, values: list[Any]) -> list[Any]:
        if "boom" in values:
            self.before_boom_fails()
            raise RuntimeError("inference fails on 'boom'")
        return values

    def postprocess(self, values: list[Any]) -> list[Any]:
        return [f"{value}!" for value in values]


class Carried:
    """Records each stage failure once the pipeline has carried it out (its outcome
    applied, its request answered if it is to be): (stage, the values of its micro-batch)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[int, tuple[Any, ...]]] = []
        self._changed = threading.Condition()
        original = Outcomes.stage_failed

        def stage_failed(
            outcomes: Outcomes, stage: int, mb: _MicroBatch, exc: BaseException, *took: Any
        ) -> None:
            original(outcomes, stage, mb, exc, *took)
            with self._changed:
                self.log.append((stage, tuple(row_value(row) for row in mb.items)))
                self._changed.notify_all()

        monkeypatch.setattr(Outcomes, "stage_failed", stage_failed)

    def wait(self, stage: int, value: Any, *, alone: bool = False) -> bool:
        """Waits until a micro-batch holding ``value`` (only it, when ``alone``) failed in
        ``stage``; False if none did within ``WAIT_S``."""
        with self._changed:
            found = lambda: self.first(stage, value, alone=alone) is not None  # noqa: E731
            return self._changed.wait_for(found, WAIT_S)

    def first(self, stage: int, value: Any, *, alone: bool = False) -> int | None:
        """Where the first such failure is in the log; None if there is none."""
        for index, (failed_in, values) in enumerate(self.log):
            if failed_in == stage and (values == (value,) if alone else value in values):
                return index
        return None


SERVED = [{"body": {"instances": ["good"]}}]  # the first stage serves: "bad" is then 400
# A plain request ahead, so that at micro-batch 2 the two instances are in different
# micro-batches ([ahead, bad], [boom]) and race; at 1, each is alone.
ROWS = [{"body": "ahead"}, {"body": {"instances": ["bad", "boom"]}}]


@pytest.fixture
def kserve_batching() -> Iterator[Callable[[int], tuple[EventHandler, MicroBatching]]]:
    started: list[MicroBatching] = []

    def start(size: int) -> tuple[EventHandler, MicroBatching]:
        handler = EventHandler()
        config = MicroBatchingConfig.from_mapping(
            {"micro_batch_size": size, "parallelism": {"preprocess": 2}, "kserve": True}
        )
        mb = MicroBatching(handler, config=config)
        started.append(mb)
        assert mb(SERVED, FakeContext(1)) == [{"predictions": ["good!"]}]
        return handler, mb

    yield start
    for mb in started:
        mb.shutdown()


def answer_of(mb: MicroBatching) -> tuple[Any, dict[int, tuple[int, str]]]:
    context = FakeContext(len(ROWS))
    out = mb(ROWS, context)
    assert out[0] == "ahead!"  # the request ahead is served whatever its neighbour does
    return out[1], context.statuses


@pytest.mark.parametrize("size", [1, 2])
def test_defect_kserve_status_named_by_whichever_instance_failed_first(
    size: int, kserve_batching: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Instance 0 fails preprocess slowly (400), instance 1 fails inference (500): the request
    # got 500 when instance 1's failure was carried out first (it answered the request and
    # instance 0 was never finished), 400 the other way round. Both orders, forced.
    answers = {}

    # Instance 1 fails inference, and its failure is carried out, before instance 0 fails.
    carried = Carried(monkeypatch)
    handler, mb = kserve_batching(size)
    handler.before_bad_fails = lambda values: carried.wait(1, "boom")
    answers["inference first"] = answer_of(mb)
    assert carried.wait(0, "bad")  # instance 0 failed too (alone or with the one ahead)
    assert carried.first(1, "boom") == 0, carried.log

    # Instance 0 fails preprocess alone, and that is carried out, while instance 1 is in its
    # inference call; instance 1 fails after.
    carried = Carried(monkeypatch)
    handler, mb = kserve_batching(size)
    boom_inside = threading.Event()

    def hold_boom() -> None:
        boom_inside.set()
        carried.wait(0, "bad", alone=True)

    handler.before_bad_fails = lambda values: values != ["bad"] or boom_inside.wait(WAIT_S)
    handler.before_boom_fails = hold_boom
    answers["preprocess first"] = answer_of(mb)
    assert boom_inside.is_set()  # instance 1 was in inference when instance 0 failed alone
    assert carried.wait(1, "boom")
    bad_alone, boom = carried.first(0, "bad", alone=True), carried.first(1, "boom")
    assert bad_alone is not None and boom is not None and bad_alone < boom, carried.log

    for order, (body, statuses) in answers.items():
        assert statuses == {1: (400, "Bad Request")}, order
        assert body == {"error": "instance 0: cannot read instance 'bad'"}, order


# -- generatively: a request's status is its lowest-index failing instance's alone -----------

KINDS = ("good", "decode", "reject", "infer", "post")


class KindHandler(Stages):
    """Instances are ``[kind, n]``; each kind fails where it says, with its own message:
    "decode" a decoder's ValueError in preprocess (400), "reject" an InvalidInputError with
    413, "infer" a RuntimeError in inference (500), "post" a KeyError in postprocess (500).
    ``delays`` holds how long each (stage, n) call waits, so threads finish in any order."""

    def __init__(self) -> None:
        self.context: Any = None
        self.delays: dict[tuple[str, int], float] = {}

    def _pause(self, stage: str, instances: list[Any]) -> None:
        delay = max(self.delays.get((stage, n), 0.0) for _, n in instances)
        if delay:
            time.sleep(delay)  # reorders threads; nothing asserts on time

    def preprocess(self, rows: list[Any]) -> list[Any]:
        instances = [row_value(row) for row in rows]
        self._pause("preprocess", instances)
        for kind, n in instances:
            if kind == "decode":
                raise ValueError(f"cannot decode instance {n}")
            if kind == "reject":
                raise InvalidInputError(f"instance {n} is too large", 413)
        return instances

    def inference(self, instances: list[Any]) -> list[Any]:
        self._pause("inference", instances)
        for kind, n in instances:
            if kind == "infer":
                raise RuntimeError(f"inference fails on {n}")
        return instances

    def postprocess(self, instances: list[Any]) -> list[Any]:
        self._pause("postprocess", instances)
        for kind, n in instances:
            if kind == "post":
                raise KeyError(f"no label for {n}")
        return [n * 10 for _, n in instances]


@pytest.fixture(scope="module")
def kinds_batching() -> Iterator[tuple[KindHandler, MicroBatching]]:
    handler = KindHandler()
    config = MicroBatchingConfig.from_mapping(
        {"parallelism": {"preprocess": 3, "inference": 2, "postprocess": 2}, "kserve": True}
    )
    with MicroBatching(handler, config=config) as mb:
        # Every stage serves first: a decoder error in preprocess is then 400 alone as in
        # any batch, and a request of good instances in each batch keeps any stage from
        # being judged broken (docs/failures.md), which the rule here does not cover.
        assert mb([{"body": {"instances": [["good", -1]]}}], FakeContext(1)) == [
            {"predictions": [-10]}
        ]
        yield handler, mb


def send(mb: MicroBatching, rows: list[Any]) -> list[tuple[int, Any]]:
    context = FakeContext(len(rows))
    out = mb(rows, context)
    return [(context.statuses.get(i, (200, ""))[0], body) for i, body in enumerate(out)]


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 8))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    delays = draw(
        st.dictionaries(
            st.tuples(
                st.sampled_from(("preprocess", "inference", "postprocess")), st.integers(0, n)
            ),
            st.sampled_from((0.0, 0.001, 0.003)),
        )
    )
    return {"kinds": kinds, "size": draw(st.integers(1, 4)), "delays": delays}


@given(requests())
@example({"kinds": ["decode", "infer"], "size": 1, "delays": {("preprocess", 0): 0.003}})
@example({"kinds": ["good", "post", "decode", "reject"], "size": 2, "delays": {}})
def test_a_kserve_request_gets_its_lowest_failing_instances_status(
    kinds_batching: tuple[KindHandler, MicroBatching], scenario: dict[str, Any]
) -> None:
    handler, mb = kinds_batching
    mb.micro_batch_size = scenario["size"]
    handler.delays = scenario["delays"]
    kinds: list[str] = scenario["kinds"]
    instances = [[kind, n] for n, kind in enumerate(kinds)]
    good = {"body": {"instances": [["good", len(kinds)]]}}  # its own instance number
    (status, body), (good_status, good_body) = send(mb, [{"body": {"instances": instances}}, good])
    assert (good_status, good_body) == (200, {"predictions": [len(kinds) * 10]})
    failing = [n for n, kind in enumerate(kinds) if kind != "good"]
    if not failing:
        assert (status, body) == (200, {"predictions": [n * 10 for n in range(len(kinds))]})
        return
    lowest = failing[0]
    handler.delays = {}
    [(alone_status, alone_body)] = send(mb, [{"body": {"instances": [instances[lowest]]}}])
    assert alone_status >= 400 and alone_body["error"].startswith("instance 0: ")
    assert status == alone_status, (kinds, body, alone_body)
    assert body == {"error": f"instance {lowest}: " + alone_body["error"][len("instance 0: ") :]}
