"""The fraud scorer example on a real TorchServe: parallel JSON bodies, batched by the
frontend and cut into micro-batches, each scored as the same body alone; bad bodies among
them 400 each; KServe v1 on its own route."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.helpers import load_module
from tests.integration.servers import registered, scraped, settled_scrape
from ts_microbatch.tools.server import TorchServe

build = load_module("examples/tabular_scorer/build_mar.py", "ts_microbatch_tabular_build_mar")
NAME = "tabular_mb"
JSON = "application/json"
ROWS = [build.prepare.make_features(900 + i) for i in range(24)]
BAD = [
    ({"features": [0.5] * 127}, '"features" has 127 values'),
    ({"features": ["x"] * 128}, 'features[0] is the string "x"'),
    ({"features": [float("nan")] * 128}, "features[0] is nan"),  # json.dumps writes NaN
]


@pytest.fixture(scope="module")
def server(
    shared_server: TorchServe, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    build.build_mar(shared_server.model_store, work_dir=tmp_path_factory.mktemp("work"))
    with registered(shared_server, NAME, batch_size=32, max_batch_delay_ms=200) as ts:
        yield ts


def post_all(server: TorchServe, calls: list[tuple[str, Any]]) -> list[tuple[int, Any]]:
    """Every (url, body) at once, each from its own thread."""

    def post(call: tuple[str, Any]) -> tuple[int, Any]:
        resp = server.request("POST", call[0], json.dumps(call[1]).encode(), {"Content-Type": JSON})
        return resp.status, resp.json()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(post, calls))


def test_parallel_bodies_are_scored_as_alone_and_bad_ones_400_each(server: TorchServe) -> None:
    predictions = f"{server.inference_url}/predictions/{NAME}"
    alone = [post_all(server, [(predictions, {"features": row})])[0] for row in ROWS]
    assert [status for status, _ in alone] == [200] * len(ROWS)
    calls = [(predictions, {"features": row}) for row in ROWS]
    for k, (body, _) in enumerate(BAD):
        calls.insert(5 + 8 * k, (predictions, body))
    before = settled_scrape(server, NAME)
    answers = post_all(server, calls)
    summary = scraped(server, NAME, before)
    # The scenario: the frontend batched them and good and bad bodies shared micro-batches.
    assert summary["mean_batch_size"] >= 4 and summary["mean_micro_batch_size"] > 1, summary
    bad_at = [5 + 8 * k for k in range(len(BAD))]
    assert [status for status, _ in answers] == [
        400 if i in bad_at else 200 for i in range(len(calls))
    ]
    for k, i in enumerate(bad_at):
        assert answers[i][1]["message"].startswith(BAD[k][1]), answers[i]
    good = [body for i, (_, body) in enumerate(answers) if i not in bad_at]
    # The same request alone went through the same frontend: a micro-batch of other rows
    # may sum the matrix product in another order (float32), so within 1e-6.
    assert all(abs(g["score"] - a["score"]) <= 1e-6 for g, (_, a) in zip(good, alone))


def test_a_kserve_v1_request_on_its_route(server: TorchServe) -> None:
    url = f"{server.inference_url}/v1/models/{NAME}:predict"
    body = {"instances": [ROWS[0], {"features": ROWS[1]}]}
    ((status, answer),) = post_all(server, [(url, body)])
    assert status == 200, answer
    alone = [post_all(server, [(url, {"instances": [row]})])[0][1] for row in ROWS[:2]]
    got = [p["score"] for p in answer["predictions"]]
    assert len(got) == 2
    assert all(abs(g - a["predictions"][0]["score"]) <= 1e-6 for g, a in zip(got, alone))
