"""The detection example on a real TorchServe: parallel photos of different sizes, batched
by the frontend, each answered as the same photo alone (within the tolerance docs/images.md
states); and the README's first path, TorchServe's stock ObjectDetector behind the mixin
with no grouping, answering a mixed batch 200 each."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from tests.helpers import load_module
from tests.image_answers import boxes_close
from tests.integration.servers import model_log, registered, scraped, settled_scrape
from tests.integration.test_torchserve import parallel
from tests.torchserve.images import make_jpeg
from ts_microbatch.tools.mar import override_mar
from ts_microbatch.tools.server import TorchServe

build = load_module("examples/object_detector/build_mar.py", "ts_microbatch_detector_build_mar")
NAME, STOCK = "detector_mb", "stock_detector"
SIZES = [(640, 480), (480, 640), (800, 600), (320, 320), (1024, 768), (600, 800), (512, 384)]
PHOTOS = [make_jpeg(300 + i, size=SIZES[i % len(SIZES)]) for i in range(16)]
# The README's "any BaseHandler subclass: add the mixin", over the stock ObjectDetector.
STOCK_HANDLER = """
from ts.torch_handler.object_detector import ObjectDetector

from ts_microbatch import MicroBatchingMixin


class Detector(MicroBatchingMixin, ObjectDetector):
    pass
"""


@pytest.fixture(scope="module")
def server(
    shared_server: TorchServe, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    store, work = shared_server.model_store, tmp_path_factory.mktemp("work")
    mar = build.build_mar(store, work_dir=work)
    handler = work / "stock_detector_handler.py"
    handler.write_text(STOCK_HANDLER, encoding="utf-8")
    override_mar(mar, store / f"{STOCK}.mar", {"shape_groups": None}, handler=handler)
    with registered(shared_server, NAME, STOCK, batch_size=8, max_batch_delay_ms=200) as ts:
        yield ts


def test_parallel_photos_of_different_sizes_are_each_answered_as_alone(
    server: TorchServe,
) -> None:
    alone = [server.predict(NAME, photo, content_type="image/jpeg") for photo in PHOTOS]
    assert [r.status for r in alone] == [200] * len(PHOTOS)
    before = settled_scrape(server, NAME)
    responses = parallel(server, PHOTOS, name=NAME)
    summary = scraped(server, NAME, before)
    # The scenario: the frontend put photos of several sizes in each batch (16 photos of 7
    # sizes in batches of up to 8), and photos of one size shared micro-batches.
    assert summary["mean_batch_size"] >= 4 and summary["mean_micro_batch_size"] > 1, summary
    assert [r.status for r in responses] == [200] * len(PHOTOS)
    assert all(boxes_close(r.json(), a.json()) for r, a in zip(responses, alone))
    assert all(len(r.json()) == 100 for r in responses)  # untrained: every box answered


def test_a_kserve_v1_request_of_several_sizes(server: TorchServe) -> None:
    instances = [{"b64": base64.b64encode(photo).decode()} for photo in PHOTOS[:3]]
    resp = server.request(
        "POST",
        f"{server.inference_url}/predictions/{NAME}",
        body=json.dumps({"instances": instances}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 200, resp.body
    alone = [server.predict(NAME, photo).json() for photo in PHOTOS[:3]]
    assert len(resp.json()["predictions"]) == 3
    assert all(boxes_close(got, want) for got, want in zip(resp.json()["predictions"], alone))


def test_the_stock_object_detector_behind_the_mixin_answers_mixed_sizes_200(
    server: TorchServe,
) -> None:
    # VisionHandler.preprocess stacks: every micro-batch mixing sizes raises. Each request
    # alone is served, so each must be served in any company (before: 500 for all 8).
    responses = parallel(server, PHOTOS[:8], name=STOCK)
    assert [r.status for r in responses] == [200] * 8, [r.body[:200] for r in responses]
    assert "stack expects each tensor to be equal size" in model_log(server, STOCK)  # the scenario
