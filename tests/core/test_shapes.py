"""Images of different sizes: micro-batches of one shape group, a budget in pixels.

Items here are (name, width, height) tuples and the rule's measure reads the sizes; the
stages record what each call saw, so each test proves the cut it asserts happened, then
checks every answer landed on its own item.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ts_microbatch import ConfigError, MicroBatchingConfig, Pipeline
from ts_microbatch.core.metrics import PipelineObserver
from ts_microbatch.core.micro_batch import MicroBatchInfo, current_micro_batch
from ts_microbatch.core.shapes import ShapeRule, cut_sizes, plan

Item = tuple[str, int, int]


def size_of(item: Any) -> Any:
    if not isinstance(item, tuple):
        raise ValueError("not an image")
    return item[1], item[2]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[list[Item], MicroBatchInfo | None]] = []
        self._lock = threading.Lock()

    def preprocess(self, items: list[Item]) -> list[str]:
        with self._lock:
            self.calls.append((list(items), current_micro_batch()))
        if len({(w, h) for _, w, h in items}) > 1:
            raise RuntimeError("stack expects each tensor to be equal size")
        return [name for name, _, _ in items]

    def stages(self) -> dict[str, Any]:
        return {"preprocess": self.preprocess, "inference": list, "postprocess": list}


def run(
    items: Sequence[Any], rule: ShapeRule, size: int = 8, owners: Sequence[int] | None = None
) -> tuple[list[Any], Recorder]:
    recorder = Recorder()
    with Pipeline(recorder.stages(), micro_batch_size=size, shape_rule=rule) as pipeline:
        batch = pipeline.submit_batch(list(items), owners=owners)
        assert batch.wait(30)
    answers = [f.exception() or f.result() for f in batch.futures]
    return answers, recorder


PHOTOS: list[Item] = [
    ("a", 640, 480),
    ("b", 480, 640),
    ("c", 640, 480),
    ("d", 800, 600),
    ("e", 480, 640),
    ("f", 640, 480),
    ("g", 320, 320),
    ("h", 800, 600),
]


def test_exact_groups_make_micro_batches_of_one_size_answered_in_place() -> None:
    answers, recorder = run(PHOTOS, ShapeRule(size_of, "exact"), size=4)
    assert [[name for name, _, _ in rows] for rows, _ in recorder.calls] == [
        ["a", "c", "f"],
        ["b", "e"],
        ["d", "h"],
        ["g"],
    ]
    assert answers == [name for name, _, _ in PHOTOS]
    info = recorder.calls[1][1]
    assert info is not None and info.shapes == ((480, 640), (480, 640))
    assert info.padded_shape == (480, 640) and info.item_requests == (1, 4)


def test_orientation_and_rounding_group_near_sizes() -> None:
    rule = ShapeRule(size_of, "orientation")
    groups = plan(rule, PHOTOS, None, 8)
    assert groups.order == (0, 2, 3, 5, 7, 1, 4, 6)  # landscape, portrait, square
    assert groups.sizes == (5, 2, 1)
    near = [("a", 630, 470), ("b", 640, 480), ("c", 700, 480)]
    assert plan(ShapeRule(size_of, 64), near, None, 8).sizes == (2, 1)
    # 4:3 at three sizes, 3:4, 1:1: what a resizer keeping the aspect ratio computes alike
    aspect = plan(ShapeRule(size_of, "aspect"), PHOTOS, None, 8)
    assert aspect.order == (0, 2, 3, 5, 7, 1, 4, 6) and aspect.sizes == (5, 2, 1)


def test_a_pixel_budget_counts_rows_x_the_widest_by_the_tallest() -> None:
    rule = ShapeRule(size_of, None, max_micro_batch_pixels=3 * 640 * 640)
    # 640x480 then 480x640: padded to 640x640, three fit, the fourth does not
    photos = [("a", 640, 480), ("b", 480, 640), ("c", 640, 480), ("d", 480, 640)]
    assert cut_sizes(rule, [size_of(p) for p in photos], 8) == (3, 1)
    padded = ShapeRule(
        size_of, "exact", max_micro_batch_pixels=4 * 640 * 480, allowed_sizes=(1, 2, 8)
    )
    # four of one size fit 4 x 640x480, but padded to 8 rows they would not
    assert cut_sizes(padded, [(640, 480)] * 4, 8) == (2, 2)


def test_an_unreadable_item_goes_to_a_group_of_its_own_and_fails_alone() -> None:
    items: list[Any] = [("a", 640, 480), b"not an image", ("c", 640, 480)]

    def preprocess(rows: list[Any]) -> list[str]:
        if any(not isinstance(row, tuple) for row in rows):
            raise ValueError("cannot identify image file")
        return [row[0] for row in rows]

    with Pipeline(
        {"preprocess": preprocess}, micro_batch_size=4, shape_rule=ShapeRule(size_of)
    ) as pipeline:
        batch = pipeline.submit_batch(items)
        assert batch.wait(30)
    answers = [f.exception() or f.result() for f in batch.futures]
    assert answers[0] == "a" and answers[2] == "c" and isinstance(answers[1], ValueError)


def test_defect_items_of_unknown_shape_shared_a_micro_batch_and_were_padded() -> None:
    # Issue 32, defect 4: two photos whose shapes could not be read (640x480 and 480x640 as
    # line-wrapped base64) went to one "unknown" group, shared a micro-batch and were padded
    # to 640x640: neither got its answer alone. An unknown shape may be any shape, so its
    # item never shares a micro-batch, with known shapes or other unknown ones.
    unread = {"u1", "u2", "u3"}

    def measure(item: Item) -> Any:
        return None if item[0] in unread else size_of(item)

    def padding(rows: list[Item]) -> list[tuple[str, tuple[int, int]]]:
        padded = (max(w for _, w, _ in rows), max(h for _, _, h in rows))  # as torchvision
        return [(name, padded) for name, _, _ in rows]

    items: list[Item] = [
        ("u1", 640, 480),
        ("k1", 640, 480),
        ("u2", 480, 640),
        ("k2", 640, 480),
        ("u3", 640, 480),
        ("k3", 480, 640),
    ]
    seen: list[list[str]] = []

    def preprocess(rows: list[Item]) -> list[tuple[str, tuple[int, int]]]:
        seen.append([name for name, _, _ in rows])
        return padding(rows)

    rule = ShapeRule(measure, "exact")
    with Pipeline({"preprocess": preprocess}, micro_batch_size=4, shape_rule=rule) as pipeline:
        batch = pipeline.submit_batch(items)
        assert batch.wait(30)
    assert [f.result() for f in batch.futures] == [padding([item])[0] for item in items]
    assert sorted(seen) == [["k1", "k2"], ["k3"], ["u1"], ["u2"], ["u3"]]
    # A KServe request whose first instance is unreadable: the rest still share by shape.
    cut = plan(rule, [items[0], items[1], items[3]], [0, 0, 0], 4)
    assert cut.order == (0, 1, 2) and cut.sizes == (1, 2)


class UnknownShapes(PipelineObserver):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_shapes_unknown(self, count: int) -> None:
        self.counts.append(count)


@pytest.mark.parametrize(("groups", "counts"), [("exact", [2]), (None, [])])
def test_items_cut_alone_for_an_unknown_shape_are_reported(groups: Any, counts: list[int]) -> None:
    observer = UnknownShapes()
    rule = ShapeRule(size_of, groups, max_micro_batch_pixels=10**6)
    stages = {"preprocess": lambda rows: [str(row) for row in rows]}
    with Pipeline(stages, micro_batch_size=4, shape_rule=rule, observer=observer) as pipeline:
        for items in ([("a", 4, 4), b"x", b"y", ("b", 4, 4)], [("c", 4, 4)]):
            assert pipeline.submit_batch(items).wait(30)
    assert observer.counts == counts  # a batch whose shapes were all read reports nothing


def test_a_requests_items_of_different_shapes_straddle_micro_batches_of_one_shape() -> None:
    # A KServe request of three instances: two sizes. Its items stay together in the order,
    # and the cut splits where the shape changes.
    items = [("x", 640, 480), ("y1", 640, 480), ("y2", 480, 640), ("y3", 640, 480)]
    answers, recorder = run(items, ShapeRule(size_of, "exact"), owners=[0, 1, 1, 1])
    assert answers == ["x", "y1", "y2", "y3"]
    assert all(len({(w, h) for _, w, h in rows}) == 1 for rows, _ in recorder.calls)


@pytest.mark.parametrize("value", ["round", 0, -3, True, 2.5, [64]])
def test_bad_shape_settings_fail_the_config_naming_the_key(value: Any) -> None:
    with pytest.raises(ConfigError, match="micro_batching.shape_groups: got"):
        MicroBatchingConfig.from_mapping({"shape_groups": value})


def test_shapes_and_lengths_are_not_combined() -> None:
    with pytest.raises(ConfigError, match="shape_groups: set with a length setting"):
        MicroBatchingConfig.from_mapping({"shape_groups": "exact", "order": "length"})


@given(
    shapes=st.lists(
        st.one_of(st.none(), st.tuples(st.integers(1, 5), st.integers(1, 5))),
        min_size=1,
        max_size=30,
    ),
    size=st.integers(1, 8),
    groups=st.sampled_from(["exact", "aspect", "orientation", 2, None]),
    budget=st.none() | st.integers(1, 200),
)
@example(shapes=[None, None], size=2, groups="exact", budget=None)  # issue 32, defect 4
def test_every_item_is_answered_once_in_its_place_and_no_micro_batch_spans_two_groups(
    shapes: list[tuple[int, int] | None], size: int, groups: Any, budget: int | None
) -> None:
    items = [
        (f"i{n}", *shape) if shape is not None else f"bad{n}" for n, shape in enumerate(shapes)
    ]
    rule = ShapeRule(size_of, groups, budget)
    seen: list[list[Any]] = []

    def preprocess(rows: list[Any]) -> list[Any]:
        seen.append(list(rows))
        return [row[0] if isinstance(row, tuple) else row for row in rows]

    with Pipeline({"preprocess": preprocess}, micro_batch_size=size, shape_rule=rule) as p:
        batch = p.submit_batch(items)
        assert batch.wait(30)
    answers = [f.result() for f in batch.futures]
    assert answers == [item[0] if isinstance(item, tuple) else item for item in items]
    assert sorted(map(str, (row for rows in seen for row in rows))) == sorted(map(str, items))
    for rows in seen:
        assert 1 <= len(rows) <= size
        assert len({rule.key(rule.shape_of(row)) for row in rows}) == 1
        unknown = [row for row in rows if rule.shape_of(row) is None]
        assert groups is None or not unknown or len(rows) == 1  # an unknown shape: alone


def test_defect_an_item_shape_raising_a_base_exception_failed_the_batch() -> None:
    class Stop(BaseException):
        pass

    def measure(item: Any) -> Any:
        if item == ("odd", 4, 4):
            raise Stop
        return size_of(item)

    answers, _ = run([("a", 4, 4), ("odd", 4, 4), ("b", 4, 4)], ShapeRule(measure, "exact"))
    assert answers == ["a", "odd", "b"]  # the odd one's shape is unknown: a group of its own
