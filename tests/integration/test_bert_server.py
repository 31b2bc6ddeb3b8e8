"""The BERT example on a real TorchServe: parallel texts of mixed lengths, batched by the
frontend and cut into micro-batches, each answered as the same text alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.integration.servers import registered, scraped, settled_scrape
from tests.integration.test_torchserve import parallel
from tests.torchserve.bert import SMALL_BERT, build, close, example_config, texts
from ts_microbatch.tools.server import TorchServe

NAME = "bert_mb"
JSON = "application/json"


@pytest.fixture(scope="module")
def server(
    shared_server: TorchServe, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    store, work = shared_server.model_store, tmp_path_factory.mktemp("bert_build")
    config = work / "model-config.yaml"
    config.write_text(json.dumps(example_config()), encoding="utf-8")
    build.build_mar(
        store, work_dir=work, model_config=config, bert=SMALL_BERT, archive_format="zip-store"
    )
    with registered(shared_server, NAME, batch_size=32, max_batch_delay_ms=200) as ts:
        yield ts


def test_parallel_texts_of_mixed_lengths_get_what_they_get_alone(server: TorchServe) -> None:
    lengths = [3, 280, 12, 150, 6, 60, 220, 25, 9, 110, 300, 40, 4, 190, 75, 17]
    bodies = [texts.make_text(700 + i, n).encode() for i, n in enumerate(lengths)]
    reference = [server.predict(NAME, body, content_type="text/plain") for body in bodies]
    assert [r.status for r in reference] == [200] * len(bodies)
    before = settled_scrape(server, NAME)  # the reference requests' lines included
    answers = parallel(server, bodies, name=NAME)
    summary = scraped(server, NAME, before)
    assert summary["mean_micro_batch_size"] > 1  # texts did share micro-batches
    assert [a.status for a in answers] == [200] * len(bodies)
    for i, (got, want) in enumerate(zip(answers, reference)):
        assert close(got.json()["scores"], want.json()["scores"]), (i, lengths[i])


def test_json_and_kserve_bodies_and_a_bad_one_in_parallel(server: TorchServe) -> None:
    one, two = texts.make_text(800, 30), texts.make_text(801, 90)
    want = {
        t: server.predict(NAME, t.encode(), content_type="text/plain").json() for t in (one, two)
    }
    v1 = f"{server.inference_url}/v1/models/{NAME}:predict"
    v2 = f"{server.inference_url}/v2/models/{NAME}/infer"
    predictions = f"{server.inference_url}/predictions/{NAME}"
    tensor = {"name": "text", "shape": [2], "datatype": "BYTES", "data": [one, two]}
    calls = [
        (predictions, {"text": one}),
        (v1, {"instances": [one, {"text": two}]}),
        (v2, {"id": "r1", "inputs": [tensor]}),
        (predictions, {"text": ""}),
    ] * 4
    bodies = [json.dumps(body).encode() for _, body in calls]

    def post(index: int) -> tuple[int, Any]:
        url = calls[index][0]
        resp = server.request("POST", url, bodies[index], {"Content-Type": JSON})
        return resp.status, resp.json()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        answers = list(pool.map(post, range(len(calls))))
    for k in range(0, len(calls), 4):
        (s1, plain), (s2, kv1), (s3, kv2), (s4, bad) = answers[k : k + 4]
        assert (s1, s2, s3, s4) == (200, 200, 200, 400), answers[k : k + 4]
        assert close(plain["scores"], want[one]["scores"])
        got_v2 = [json.loads(d) for d in kv2["outputs"][0]["data"]]
        for got in (kv1["predictions"], got_v2):
            assert len(got) == 2
            assert all(close(p["scores"], want[t]["scores"]) for p, t in zip(got, (one, two)))
        assert "empty" in bad["message"]
