"""The cut: where a batch becomes micro-batches (``ts_microbatch.core.micro_batch.cut``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ts_microbatch.core.batch import Batch
from ts_microbatch.core.micro_batch import cut
from ts_microbatch.core.order import Order

pytestmark = pytest.mark.generative


def test_items_are_cut_in_order_size_at_a_time_the_last_holding_the_rest() -> None:
    items = list("abcdefghij")
    batch = Batch(len(items))
    mbs = cut(batch, items, 4)
    assert [list(mb.items) for mb in mbs] == [list("abcd"), list("efgh"), list("ij")]
    assert [(mb.index, mb.offset, mb.attempt) for mb in mbs] == [(0, 0, 0), (1, 4, 0), (2, 8, 0)]
    assert all(mb.batch is batch for mb in mbs)
    assert [mb.indices for mb in mbs] == [range(0, 4), range(4, 8), range(8, 10)]
    assert [mb.payload for mb in mbs] == [list(mb.items) for mb in mbs]


def test_a_size_over_the_batch_gives_one_micro_batch() -> None:
    [mb] = cut(Batch(3), [1, 2, 3], 8)
    assert list(mb.items) == [1, 2, 3] and mb.indices == range(3)


def test_a_request_of_several_items_may_straddle_two_micro_batches() -> None:
    # The cut goes by items, as a stage sees rows; each micro-batch reaches the request.
    owners = [0, 0, 0, 1, 1]
    batch = Batch(5, owners=owners)
    mbs = cut(batch, ["r0a", "r0b", "r0c", "r1a", "r1b"], 2)
    assert [mb.owners for mb in mbs] == [(0, 0), (0, 1), (1,)]
    # Bisection halves, by contrast, never split a request.
    assert [h.owners for h in mbs[1].halves()] == [(0,), (1,)]


def test_items_that_are_not_one_per_future_are_refused() -> None:
    with pytest.raises(ValueError, match="cut: got 2 items for a cut of 3"):
        cut(Batch(3), [1, 2], 2)


def test_a_cut_that_reorders_a_requests_items_is_refused() -> None:
    # Requests may be reordered (by length, by shape), a request's items never: its lowest
    # failing item is then the first of each run of it (Outcomes.skip_items_above).
    assert Order(4, owners=[0, 0, 1, 1], items=[2, 3, 0, 1]).requests == (1, 1, 0, 0)
    with pytest.raises(ValueError, match="request 1's items are not in item order"):
        Order(4, owners=[0, 0, 1, 1], items=[0, 1, 3, 2])


@given(n=st.integers(0, 60), size=st.integers(1, 70))
def test_every_item_lands_in_exactly_one_micro_batch_in_order(n: int, size: int) -> None:
    items = list(range(n))
    mbs = cut(Batch(n), items, size)
    assert [item for mb in mbs for item in mb.items] == items
    assert [mb.index for mb in mbs] == list(range(len(mbs)))
    assert all(len(mb) == size for mb in mbs[:-1])
    assert all(1 <= len(mb) <= size for mb in mbs)
    assert [mb.offset for mb in mbs] == list(range(0, n, size))
