"""The detection example (examples/object_detector) through TorchServe's loader and
``Service.predict``: photos of different sizes, each answered as alone (within the
tolerance docs/images.md states for the floats; statuses and which photo gets which answer
exactly).

The model is torchvision's Faster R-CNN with untrained weights (every box answered,
threshold 0), so an answer is 100 boxes whose coordinates depend on every pixel the model
saw: any padding a batch adds shows.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import load_module
from tests.image_answers import boxes_close
from tests.torchserve.images import make_jpeg, with_app_segments, wrapped
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch.torchserve.images import HEADER_BYTES_MAX

build = load_module("examples/object_detector/build_mar.py", "ts_microbatch_detector_build_mar")
SIZES = [(640, 480), (480, 640), (800, 600), (320, 320), (640, 480), (600, 800), (512, 384)]
SIZES += [(480, 640)]
PHOTOS = [make_jpeg(90 + i, size=size) for i, size in enumerate(SIZES)]
JPEG = "image/jpeg"


def extracted(tmp: Path, **overrides: Any) -> Path:
    """The example's .mar, built as build_mar.py builds it, laid out as TorchServe
    extracts it."""
    mar = build.build_mar(tmp / "store", work_dir=tmp / "work", overrides=overrides)
    directory = tmp / "model"
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(directory)
    return directory


def start(directory: Path) -> Any:
    return load_service(directory, model_name="detector_mb", handler="detector_handler.py")


def handler_of(service: Any) -> Any:
    return service._entry_point.__self__


def predict(service: Any, bodies: list[tuple[Any, str]]) -> list[tuple[int, Any]]:
    batch = [request(i, body, content_type) for i, (body, content_type) in enumerate(bodies)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, json.loads(body)) for _, status, body in answers]


def record_preprocess(service: Any) -> list[list[tuple[int, int]]]:
    """Wraps the handler's preprocess: the (width, height) of each call's images."""
    handler = handler_of(service)
    preprocess, calls = handler.preprocess, []

    def recording(data: list[Any]) -> Any:
        images = preprocess(data)
        calls.append([(int(image.shape[2]), int(image.shape[1])) for image in images])
        return images

    handler.preprocess = recording
    return calls


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    service = start(extracted(tmp_path_factory.mktemp("detector")))
    yield service
    handler_of(service).micro_batching.shutdown()


@pytest.fixture(scope="module")
def alone(grouped: Any) -> list[Any]:
    answers = [predict(grouped, [(photo, JPEG)])[0] for photo in PHOTOS]
    assert all(status == 200 and len(boxes) == 100 for status, boxes in answers)
    return [boxes for _, boxes in answers]


def test_with_aspect_groups_every_photo_gets_its_answer_alone(
    grouped: Any, alone: list[Any]
) -> None:
    calls = record_preprocess(grouped)
    got = predict(grouped, [(photo, JPEG) for photo in PHOTOS])
    # The scenario: photos of different sizes shared micro-batches (640x480 with 800x600:
    # one aspect ratio, resized by the detector to one size), and no call mixed ratios.
    assert any(len(set(call)) > 1 for call in calls), calls
    assert all(len({w * 1000 // h for w, h in call}) == 1 for call in calls), calls
    assert [status for status, _ in got] == [200] * len(PHOTOS)
    # Nothing was padded: each photo's rows are its rows alone, so its boxes are its boxes
    # alone up to the kernels' batch dependence (docs/images.md#exact-and-equal).
    assert all(boxes_close(boxes, want) for (_, boxes), want in zip(got, alone))


def test_defect_wrapped_base64_photos_shared_a_padded_micro_batch(
    grouped: Any, alone: list[Any]
) -> None:
    # Issue 32, defect 4: a 640x480 and a 480x640 photo sent as base64 in 76-column lines
    # (the base64 command's output; text/plain reaches the handler as a str, which it
    # b64decodes) lost their shapes, shared a micro-batch, were padded to 640x640, and
    # neither got its boxes alone (0 of 2; 2 of 2 unwrapped).
    calls = record_preprocess(grouped)
    bodies = [(wrapped(PHOTOS[i], 76), "text/plain") for i in (0, 1)]
    got = predict(grouped, bodies)
    assert sorted(calls) == [[(480, 640)], [(640, 480)]]
    assert [status for status, _ in got] == [200, 200]
    assert [boxes for _, boxes in got] == [alone[0], alone[1]]


def test_a_photo_of_unknown_shape_shares_no_micro_batch_and_gets_its_answer_alone(
    grouped: Any, alone: list[Any]
) -> None:
    # The 480x640 photo's frame header sits past the reader's cap: its shape is unknown,
    # the handler decodes it all the same. It must not meet the 640x480 ones.
    deep = with_app_segments(PHOTOS[1], HEADER_BYTES_MAX + 1024)
    calls = record_preprocess(grouped)
    bodies = [(wrapped(PHOTOS[0], 64), "text/plain"), (wrapped(deep, 76, "\r\n"), "text/plain")]
    got = predict(grouped, [*bodies, (PHOTOS[4], JPEG)])
    assert sorted(calls) == [[(480, 640)], [(640, 480), (640, 480)]]
    assert [status for status, _ in got] == [200, 200, 200]
    assert [boxes for _, boxes in got] == [alone[0], alone[1], alone[4]]


def test_without_groups_a_photo_beside_another_size_is_padded_and_answered_otherwise(
    tmp_path: Path, alone: list[Any]
) -> None:
    # What docs/images.md warns of: torchvision pads a micro-batch's images to its largest.
    service = start(extracted(tmp_path, shape_groups=None))
    try:
        calls = record_preprocess(service)
        got = predict(service, [(PHOTOS[0], JPEG), (PHOTOS[1], JPEG)])
        assert calls == [[(640, 480), (480, 640)]]  # the scenario: one mixed micro-batch
        assert [status for status, _ in got] == [200, 200]
        assert not boxes_close(got[1][1], alone[1])  # far beyond the kernels' difference
    finally:
        handler_of(service).micro_batching.shutdown()


def test_kserve_v1_instances_of_different_sizes_each_get_their_boxes(
    grouped: Any, alone: list[Any]
) -> None:
    import base64

    body = {"instances": [{"b64": base64.b64encode(PHOTOS[i]).decode()} for i in (0, 1, 4)]}
    ((status, answer),) = predict(grouped, [(json.dumps(body).encode(), "application/json")])
    assert status == 200 and len(answer["predictions"]) == 3
    assert all(boxes_close(a, alone[i]) for a, i in zip(answer["predictions"], (0, 1, 4)))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "the request body is empty: send an image"),
        (b"%PDF-1.4 not a photo", "the request body (20 bytes) is not an image"),
        (PHOTOS[0][:3000], "the image (3000 bytes) is truncated"),
    ],
)
def test_a_bad_body_gets_a_400_saying_what_was_sent(
    grouped: Any, body: bytes, message: str
) -> None:
    got = predict(grouped, [(PHOTOS[3], JPEG), (body, JPEG), (PHOTOS[6], JPEG)])
    assert [status for status, _ in got] == [200, 400, 200]
    assert got[1][1]["message"].startswith(message), got[1][1]
    assert "object at 0x" not in got[1][1]["message"]


def test_defect_hostile_jpeg_headers_held_up_their_batch(grouped: Any, alone: list[Any]) -> None:
    # Issue 40: a JPEG start-of-image marker then zeros to the 1 MiB cap took seconds to
    # read (PIL skipped the zeros a byte at a time) on the thread that cuts the batch,
    # before timeout_s started; a dozen passed the frontend's responseTimeout. Now the
    # cutting thread takes a bounded number of Python steps, the timeout counts the cut,
    # and the good photo is served beside the hostile bodies, each of which gets its 400.
    from dataclasses import replace

    from tests.torchserve.hostile_headers import python_steps

    hostile = b"\xff\xd8\xff" + bytes(HEADER_BYTES_MAX - 3)
    micro_batching = handler_of(grouped).micro_batching
    config = micro_batching.base_config
    micro_batching.configure(replace(config, timeout_s=30.0))
    try:
        bodies = [(hostile, JPEG)] * 12 + [(PHOTOS[3], JPEG)]
        got, steps = python_steps(lambda: predict(grouped, bodies), limit=500_000)
    finally:
        micro_batching.configure(config)
    assert [status for status, _ in got] == [400] * 12 + [200]
    assert got[-1][1] == alone[3]
    assert steps <= 500_000  # the defect: ~20 per byte, 21 million for each hostile body
