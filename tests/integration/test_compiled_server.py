"""A compiled model on a real TorchServe: warm-up before the worker is ready, padding to
allowed sizes under batches of varying size, zero recompiles, and bad settings refused at
registration."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from tests.compiled_model import build
from tests.integration.servers import model_log, scraped
from tests.integration.test_torchserve import parallel
from ts_microbatch.tools.server import TorchServe

SERVED = {
    "micro_batch_size": 8,
    "allowed_micro_batch_sizes": [1, 2, 4, 8],
    "pad": "tensors",
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
    "warmup": {"iterations": 2},
}
MARS = {
    "tiny-compiled": SERVED,
    "tiny-bad-allowed": {**SERVED, "allowed_micro_batch_sizes": [1, 2], "micro_batch_size": 4},
    "tiny-bad-warmup": {**SERVED, "warmup": {"iterations": 0}},
}
BATCH = 16


@pytest.fixture(scope="module")
def server(
    shared_server: TorchServe, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    store = shared_server.model_store
    work = tmp_path_factory.mktemp("compiled_build")
    for name, micro_batching in MARS.items():
        config = build.model_config(
            micro_batching, minWorkers=1, maxWorkers=1, batchSize=BATCH, maxBatchDelay=100
        )
        build.build_mar(store, work / name, name, config)
    yield shared_server  # each test registers the model it is about
    shared_server.unregister("tiny-compiled", drain=False)


def test_compiled_model_warms_up_at_registration_and_never_recompiles_under_varying_load(
    server: TorchServe,
) -> None:
    resp = server.register("tiny-compiled.mar", batch_size=BATCH, max_batch_delay_ms=100)
    assert resp.status == 200, resp.body
    log = model_log(server, "tiny-compiled")
    # The scenario: the worker compiled every allowed size, on its inference thread,
    # before TorchServe marked it ready.
    assert "warm-up of sizes [1, 2, 4, 8] took" in log
    assert "warm-up compiled 4 graphs on threads ts-microbatch-inference-0" in log
    eager = build.eager_model()
    generator = torch.Generator().manual_seed(11)
    for round_size in (1, 3, 5, 7, 11, 13, 16, 2, 9, 6):
        rows = torch.randn(round_size, 16, generator=generator)
        bodies = [json.dumps(row.tolist()).encode() for row in rows]
        responses = parallel(server, bodies, name="tiny-compiled")
        assert [r.status for r in responses] == [200] * round_size
        got = torch.tensor([json.loads(r.body) for r in responses])
        with torch.inference_mode():
            assert torch.allclose(got, eager(rows), atol=1e-5, rtol=0)
    summary = scraped(server, "tiny-compiled")
    assert summary["requests"] >= 73, summary
    assert summary["padded_per_micro_batch"] > 0, summary  # padding happened
    assert summary["recompiles"] == 0, summary
    assert "recompiled" not in model_log(server, "tiny-compiled")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "tiny-bad-allowed",
            "allowed_micro_batch_sizes: got [1, 2], expected the largest to be at least "
            "micro_batch_size (4)",
        ),
        ("tiny-bad-warmup", "micro_batching.warmup.iterations: got 0, expected an integer >= 1"),
    ],
)
def test_bad_padding_or_warmup_setting_fails_registration(
    server: TorchServe, name: str, message: str
) -> None:
    resp = server.register(f"{name}.mar", batch_size=4, max_batch_delay_ms=50)
    assert resp.status >= 400, resp.body
    assert message in model_log(server, name)  # its own worker's lines on the shared server
    assert server.request("GET", f"{server.management_url}/models/{name}").status == 404
