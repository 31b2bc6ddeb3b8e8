"""The isolation defects reproduced on 9a922de, through the pipeline's public API (each
test here fails there): its verdicts counted evidence inside a batch, in three places."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ts_microbatch import Pipeline


class Calls:
    """A stage function that records each call's items and fails when ``fails`` says so."""

    def __init__(self, fails: Callable[[list[int]], bool]) -> None:
        self.fails = fails
        self.calls: list[list[int]] = []
        self._lock = threading.Lock()

    def __call__(self, items: list[int]) -> list[int]:
        with self._lock:
            self.calls.append(list(items))
        if self.fails(list(items)):
            raise RuntimeError(f"cannot run {items}")
        return list(items)


def mixed(items: list[int]) -> bool:
    """ "Landscape and portrait stacked": an item's parity is its orientation."""
    return len({item % 2 for item in items}) > 1


def run(
    inference: Calls,
    items: list[int],
    micro_batch_size: int,
    *,
    owners: list[int] | None = None,
    preprocess: Calls | None = None,
    served: bool = False,
) -> list[Any]:
    stages = {"preprocess": preprocess or Calls(lambda items: False), "inference": inference}
    with Pipeline(stages, micro_batch_size=micro_batch_size) as pipeline:
        pipeline.first_stage_served = served
        batch = pipeline.submit_batch(items, owners=owners)
        assert batch.wait(60)
    return [f.exception() or f.result() for f in batch.futures]


def failed_requests(results: list[Any], owners: list[int]) -> set[int]:
    return {owner for owner, r in zip(owners, results) if isinstance(r, BaseException)}


def test_defect_one_grayscale_image_failed_six_good_ones() -> None:
    # [L,P] [L,P] [L,P] [gray] at micro-batch 2; each image alone is served but the gray
    # one. Good requests answered: 0/6.
    inference = Calls(lambda items: mixed(items) or 6 in items)
    results = run(inference, list(range(7)), 2)
    assert [0, 1] in inference.calls and [6] in inference.calls  # every first run failed
    assert failed_requests(results, list(range(7))) == {6}


def test_defect_three_bad_kserve_requests_failed_every_good_one() -> None:
    # Three bad KServe requests of two instances fill the first micro-batch of 6; six good
    # ones follow, each of two orientations (their halves fail only in each other's
    # company); a fresh model. The three were enough for a verdict: 0/6 good answered.
    owners = [request for request in range(9) for _ in range(2)]
    bad = set(range(6))
    inference = Calls(lambda items: mixed(items) or bool(bad.intersection(items)))
    results = run(inference, list(range(18)), 6, owners=owners)
    assert list(range(6)) in inference.calls and list(range(6, 12)) in inference.calls
    assert failed_requests(results, owners) == {0, 1, 2}


def test_defect_one_request_of_256_bad_instances_cost_592_calls() -> None:
    preprocess = Calls(lambda items: True)
    results = run(
        Calls(lambda items: False), list(range(256)), 32, owners=[0] * 256,
        preprocess=preprocess, served=True,
    )  # fmt: skip
    assert all(isinstance(r, BaseException) for r in results)
    assert len(preprocess.calls) <= 2 * 8  # a first run and a probe per micro-batch at most


def test_defect_four_bad_requests_failing_alike_failed_a_good_one() -> None:
    # "Up to four" was a floor: four requests failing alone alike at inference were
    # evidence enough for a verdict that failed request 19 beside them.
    bad = {2, 16, 17, 18}
    inference = Calls(lambda items: bool(bad.intersection(items)))
    results = run(inference, list(range(32)), 4)
    assert [16, 17, 18, 19] in inference.calls  # the good one's first run failed with them
    assert failed_requests(results, list(range(32))) == bad
