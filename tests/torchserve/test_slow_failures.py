"""A good request's answer does not wait on a bad one's slowness (issue 49, the deadline
rule in docs/failures.md): a micro-batch whose failing call was slow is split into its
requests at once, so each bad request fails slowly once more, alone, instead of once per
halving, each time in its good neighbours' way.

Through TorchServe's own worker machinery on both workers, as in
``test_known_good_service.py``: a handler whose preprocess takes 200 ms to refuse a bad
body (as PIL takes up to ~176 ms on a hostile one) and a millisecond on a good one,
``timeout_s: 2``. Halving, the 16-request batch below spent 2.4-2.8 s in failing calls and
its good requests got 504; each scenario is proven (a good and a bad body shared a failing
call) before its answers are asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.torchserve.test_known_good_service import Worker

SLOW_HANDLER = """
import time

from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import MicroBatchingMixin


class SlowToRefuse(MicroBatchingMixin, BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True
        self.calls = []
        self.start_micro_batching(context)

    def preprocess(self, data):
        texts = [bytes(row.get("body") or row.get("data")).decode() for row in data]
        self.calls.append(texts)
        for text in texts:
            time.sleep(0.2 if text.startswith("bad") else 0.001)
            if text.startswith("bad"):
                raise ValueError("cannot read " + text)
        return texts

    def inference(self, texts, *args, **kwargs):
        return [len(text) for text in texts]

    def postprocess(self, lengths):
        return [{"length": n} for n in lengths]
"""

HANDLER = ("slow_to_refuse_handler.py", SLOW_HANDLER)


@pytest.mark.parametrize("kind", ["synchronous", "asynchronous"])
@pytest.mark.parametrize(
    ("micro_batch_size", "bad_at"),
    [(4, (1, 6, 11, 12)), (8, (0, 5, 9, 14))],  # 4 bad among 16: in every micro-batch
)
def test_slow_failures_never_make_a_good_request_time_out(
    kind: str, micro_batch_size: int, bad_at: tuple[int, ...], tmp_path: Path
) -> None:
    worker = Worker(kind, tmp_path / "slow", micro_batch_size, HANDLER, timeout_s=2)
    try:
        warm = [f"good {n}" for n in range(16)]  # its passing calls: the stage's pace
        assert [status for status, _ in worker.send(warm)] == [200] * 16
        texts = [f"bad {n}" if n in bad_at else f"good {n}" for n in range(16)]
        calls = len(worker.handler.calls)
        got = worker.send(texts)
        made = worker.handler.calls[calls:]
        shared = [c for c in made if any(t.startswith("bad") for t in c) and len(c) > 1]
        assert shared and any(t.startswith("good") for t in shared[0])  # the scenario
        for text, (status, body) in zip(texts, got):
            if text.startswith("bad"):
                assert status == 400 and f"cannot read {text}" in body["message"], body
            else:
                assert (status, body) == (200, {"length": len(text)}), (text, body)
        # Each bad body failed twice: in its micro-batch's call, then alone.
        for text in (t for t in texts if t.startswith("bad")):
            assert sum(text in c for c in made) == 2, (text, made)
    finally:
        worker.close()
