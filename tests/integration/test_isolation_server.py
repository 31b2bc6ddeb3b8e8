"""Isolation through a real TorchServe: up to eight bad requests in parallel mixes with
photos whose micro-batches fail only in company; every request that passes alone gets
exactly its answer alone (``ts_microbatch.core.isolation``: an item fails only alone).

On both workers: the synchronous one and the asynchronous one (``asyncCommunication:
true``), its frontend fixed by the package's Java agent (ts_microbatch/agent/README.md;
0.12.0's own fails on batches of more than one request). The frontend batches for either,
and each batch runs through the same pipeline (``MicroBatching.handle_async`` on the
asynchronous worker)."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.servers import build, local_server, model_log, registered, settled_scrape
from tests.integration.test_async_agent import jdk_problem
from tests.integration.test_faults import wait_for_log
from tests.integration.test_torchserve import parallel
from tests.torchserve.images import make_jpeg
from ts_microbatch import agent
from ts_microbatch.tools.scrape import summarize
from ts_microbatch.tools.server import TorchServe

HANDLER = Path(__file__).parent / "handlers" / "stacking_handler.py"
NAME = "stacking"
BATCH = 8


WORKERS = {"sync": "", "async": "asyncCommunication: true\n"}  # model-config.yaml lines


@pytest.fixture(scope="module", params=list(WORKERS))
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    extra = WORKERS[request.param]
    if extra and jdk_problem():
        pytest.skip(jdk_problem() or "")
    if extra and agent.missing():
        pytest.fail(agent.missing() or "")  # a JDK is here: `make test` builds it first
    if extra:  # the agent is the frontend's: a server of its own
        store = tmp_path_factory.mktemp("stacking_store")
        ts = local_server(store, tmp_path_factory.mktemp("stacking_torchserve"))
        ts.properties["vmargs"] = agent.vmargs()
        started: contextlib.AbstractContextManager[TorchServe] = ts
    else:
        ts = request.getfixturevalue("shared_server")
        started = contextlib.nullcontext(ts)
    work = tmp_path_factory.mktemp("stacking_build")
    (work / "mb.json").write_text(json.dumps({"micro_batch_size": 2, "kserve": True}))
    (work / "model-config.yaml").write_text(
        f"minWorkers: 1\nmaxWorkers: 1\nbatchSize: {BATCH}\nmaxBatchDelay: 100\n" + extra
    )
    build.build_mar(
        ts.model_store,
        model_name=NAME,
        work_dir=work / NAME,
        handler=HANDLER,
        micro_batching_json=work / "mb.json",
        model_config=work / "model-config.yaml",
        archive_format="zip-store",
    )
    with started, registered(ts, NAME, batch_size=BATCH, max_batch_delay_ms=100):
        # The worker the test is about, from TorchServe's own log line, and on the
        # asynchronous one the agent's classes in its frontend.
        assert ("handle_connection_async" in model_log(ts, NAME)) == bool(extra)
        assert ("AsyncBatchAggregator replaced" in ts.log("ts_log.log")) == bool(extra)
        yield ts


def gray_jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (64, 48), color=seed % 256).save(out, format="JPEG")
    return out.getvalue()


def test_up_to_eight_bad_requests_never_fail_a_request_that_passes_alone(
    server: TorchServe,
) -> None:
    photos = [make_jpeg(300 + i, size=(64, 48) if i % 2 else (48, 64)) for i in range(8)]
    grays = [gray_jpeg(i) for i in range(8)]
    alone = {body: server.predict(NAME, body) for body in photos + grays}
    assert all(alone[body].status == 200 for body in photos)
    assert all(alone[body].status == 500 for body in grays)
    rng = random.Random(7)
    for bad_count in (0, 1, 3, 8):
        mix = photos * 2 + grays[:bad_count]
        rng.shuffle(mix)
        for body, resp in zip(mix, parallel(server, mix, NAME)):
            want = alone[body]
            assert resp.status == want.status, (resp.status, resp.body)
            if want.status == 200:
                assert resp.json() == want.json()
    # The scenario: micro-batches failed in company and were taken apart.
    wait_for_log(server, "re-running them apart to find the failing ones", model=NAME)
    assert "judged broken" not in model_log(server, NAME)


def test_kserve_v1_v2_and_plain_requests_sharing_micro_batches_each_get_their_own_answer(
    server: TorchServe,
) -> None:
    photos = [make_jpeg(950 + i, size=(64, 48)) for i in range(10)]
    b64 = [base64.b64encode(photo).decode() for photo in photos]
    alone = [server.predict(NAME, photo).json() for photo in photos]
    before = settled_scrape(server, NAME)

    def v1(*indices: int) -> bytes:
        return json.dumps({"instances": [{"b64": b64[i]} for i in indices]}).encode()

    def v2(*indices: int, request_id: str) -> bytes:
        tensor = {"name": "image", "shape": [len(indices)], "datatype": "BYTES"}
        return json.dumps(
            {"id": request_id, "inputs": [{**tensor, "data": [b64[i] for i in indices]}]}
        ).encode()

    v1_url, v2_url = f"/v1/models/{NAME}:predict", f"/v2/models/{NAME}/infer"
    calls = [(v1_url, v1(i)) for i in range(5)] + [
        (v1_url, v1(5, 6, 7)),
        (v2_url, v2(8, request_id="one")),
        (v2_url, v2(8, 9, request_id="two")),
        (f"/predictions/{NAME}", photos[9]),
        (v1_url, json.dumps({"instances": [{"b64": base64.b64encode(b"no").decode()}]}).encode()),
    ]
    with ThreadPoolExecutor(len(calls)) as pool:
        got = list(
            pool.map(
                lambda call: server.request(
                    "POST", server.inference_url + call[0], body=call[1],
                    headers={"Content-Type": "application/json"},
                ),
                calls,
            )
        )  # fmt: skip
    assert [r.status for r in got] == [200] * 9 + [400], [r.body for r in got]
    for i in range(5):
        assert got[i].json()["predictions"] == [alone[i]]
    assert got[5].json()["predictions"] == alone[5:8]
    for answer, request_id, indices in ((got[6], "one", [8]), (got[7], "two", [8, 9])):
        body = answer.json()
        assert body["id"] == request_id
        (output,) = body["outputs"]  # each photo's three means: FP64 of shape [n, 3]
        assert output["shape"] == [len(indices), 3], output
        assert output["data"] == [v for i in indices for v in alone[i]]
    assert got[8].json() == alone[9]
    # The scenario: micro-batches held instances of several requests, on either worker.
    summary = summarize(settled_scrape(server, NAME), before, NAME)
    assert summary["mean_micro_batch_size"] > 1, summary
