"""The segmentation example on a real TorchServe: photos of different sizes and bad bodies
sent in parallel, batched by the frontend; each photo's mask is the one it gets alone
(within the tolerance docs/images.md states), each bad body gets its own 400."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import load_module
from tests.image_answers import masks_close
from tests.integration.servers import registered, scraped, settled_scrape
from tests.integration.test_torchserve import parallel
from tests.torchserve.images import make_jpeg
from ts_microbatch.tools.server import TorchServe

build = load_module("examples/image_segmenter/build_mar.py", "ts_microbatch_segmenter_build_mar")
NAME = "segmenter_mb"
# A 96 px cap keeps each forward at milliseconds: the model sees 96x72 (three sizes, five
# photos), 72x96 (two sizes), 96x54, 96x96 and 64x48.
SIZES = [(160, 120), (120, 160), (200, 150), (96, 96), (128, 72), (64, 48), (128, 96)]
SIZES += [(90, 120), (160, 120), (200, 150)]
PHOTOS = [make_jpeg(600 + i, size=size) for i, size in enumerate(SIZES)]
BAD = [b"", b"%PDF-1.4 not a photo", PHOTOS[0][:2000]]


@pytest.fixture(scope="module")
def server(
    shared_server: TorchServe, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    work = tmp_path_factory.mktemp("work")
    build.build_mar(shared_server.model_store, work_dir=work, handler_settings={"max_side": 96})
    with registered(shared_server, NAME, batch_size=8, max_batch_delay_ms=200) as ts:
        yield ts


def test_parallel_photos_get_their_masks_alone_and_bad_bodies_their_own_400(
    server: TorchServe,
) -> None:
    alone = [server.predict(NAME, photo, content_type="image/jpeg") for photo in PHOTOS]
    assert [r.status for r in alone] == [200] * len(PHOTOS)
    before = settled_scrape(server, NAME)
    responses = parallel(server, PHOTOS + BAD, name=NAME)
    summary = scraped(server, NAME, before)
    # The scenario: the frontend batched photos of several sizes with the bad bodies, and
    # photos of one model size shared micro-batches.
    assert summary["mean_batch_size"] >= 4 and summary["mean_micro_batch_size"] > 1, summary
    assert [r.status for r in responses] == [200] * len(PHOTOS) + [400] * len(BAD)
    for got, want in zip(responses, alone):
        assert masks_close(got.json(), want.json())
    messages = [r.json()["message"] for r in responses[len(PHOTOS) :]]
    assert messages[0].startswith("the request body is empty"), messages
    assert messages[1].startswith("the request body (20 bytes) is not an image"), messages
    assert messages[2].startswith("the image (2000 bytes) is truncated"), messages
