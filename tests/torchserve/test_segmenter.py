"""The segmentation example (examples/image_segmenter) through TorchServe's loader and
``Service.predict``: photos of different sizes at their own aspect ratio, grouped by the
size the model sees, each stacked with its own size only, each mask as alone.

The model is torchvision's DeepLabV3 (MobileNetV3) with untrained seeded weights; the cap
is 96 px here so a forward takes milliseconds. A mask depends on every pixel the model saw,
so a photo padded or answered with another's mask would show.
"""

from __future__ import annotations

import base64
import json
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import load_module
from tests.image_answers import mask_of, masks_close
from tests.torchserve.images import make_jpeg
from tests.torchserve.ts_machinery import decode, load_service, request

build = load_module("examples/image_segmenter/build_mar.py", "ts_microbatch_segmenter_build_mar")
CAP = 96
# Under a 96 px cap: 160x120 and 200x150 are both 96x72, 120x160 is 72x96, 64x48 stays.
SIZES = [(160, 120), (120, 160), (200, 150), (96, 96), (160, 120), (64, 48), (200, 150)]
SIZES += [(120, 160)]
PHOTOS = [make_jpeg(40 + i, size=size) for i, size in enumerate(SIZES)]
MODEL_SIZES = [(96, 72), (72, 96), (96, 72), (96, 96), (96, 72), (64, 48), (96, 72), (72, 96)]
JPEG = "image/jpeg"


def extracted(tmp: Path) -> Path:
    """The example's .mar with a small cap, laid out as TorchServe extracts it."""
    mar = build.build_mar(tmp / "store", work_dir=tmp / "work", handler_settings={"max_side": CAP})
    directory = tmp / "model"
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(directory)
    return directory


def variant(model_dir: Path, tmp: Path, section: str, **settings: Any) -> Path:
    """A copy of the extracted model with ``settings`` over a section of its
    model-config.yaml (no second build: the weights are the same)."""
    directory = tmp / "variant"
    shutil.copytree(model_dir, directory)
    config_path = directory / "model-config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config[section] = {**config.get(section, {}), **settings}
    config_path.write_text(yaml.safe_dump(config))
    return directory


def start(directory: Path) -> Any:
    return load_service(directory, model_name="segmenter_mb", handler="segmenter_handler.py")


def handler_of(service: Any) -> Any:
    return service._entry_point.__self__


def predict(service: Any, bodies: list[tuple[Any, str]]) -> list[tuple[int, Any]]:
    batch = [request(i, body, content_type) for i, (body, content_type) in enumerate(bodies)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, json.loads(body)) for _, status, body in answers]


def record_forwards(service: Any) -> list[list[tuple[int, int]]]:
    """Wraps the model: the (width, height) of each row of each forward."""
    handler = handler_of(service)
    model, calls = handler.model, []

    def recording(batch: Any) -> Any:
        calls.append([(int(batch.shape[3]), int(batch.shape[2]))] * int(batch.shape[0]))
        return model(batch)

    handler.model = recording
    return calls


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extracted(tmp_path_factory.mktemp("segmenter"))


@pytest.fixture(scope="module")
def grouped(model_dir: Path) -> Iterator[Any]:
    service = start(model_dir)
    yield service
    handler_of(service).micro_batching.shutdown()


@pytest.fixture(scope="module")
def alone(grouped: Any) -> list[Any]:
    answers = [predict(grouped, [(photo, JPEG)])[0] for photo in PHOTOS]
    assert [status for status, _ in answers] == [200] * len(PHOTOS)
    # Masks of different photos differ far beyond the tolerance: a swap would show.
    assert not masks_close(answers[0][1], answers[4][1])
    return [mask for _, mask in answers]


def test_photos_of_one_model_size_share_a_forward_and_each_gets_its_mask_alone(
    grouped: Any, alone: list[Any]
) -> None:
    calls = record_forwards(grouped)
    got = predict(grouped, [(photo, JPEG) for photo in PHOTOS])
    # The scenario: photos of different sizes that the cap brings to one size (160x120 and
    # 200x150 at 96x72) were stacked together, and no forward mixed sizes.
    assert any(len(call) > 1 for call in calls), calls
    assert sorted(size for call in calls for size in call) == sorted(MODEL_SIZES)
    assert [status for status, _ in got] == [200] * len(PHOTOS)
    assert [(m["width"], m["height"]) for _, m in got] == MODEL_SIZES
    assert all(masks_close(mask, want) for (_, mask), want in zip(got, alone))


def test_with_aspect_groups_a_micro_batch_of_two_sizes_runs_one_forward_per_size(
    model_dir: Path, tmp_path: Path, alone: list[Any]
) -> None:
    # 96x72 and 64x48 are one aspect ratio (4:3) but two sizes: inference stacks each size
    # on its own instead of padding the smaller photo.
    service = start(variant(model_dir, tmp_path, "micro_batching", shape_groups="aspect"))
    try:
        calls = record_forwards(service)
        got = predict(service, [(PHOTOS[0], JPEG), (PHOTOS[5], JPEG)])
        assert sorted(calls) == [[(64, 48)], [(96, 72)]]
        assert [status for status, _ in got] == [200, 200]
        assert masks_close(got[0][1], alone[0]) and masks_close(got[1][1], alone[5])
    finally:
        handler_of(service).micro_batching.shutdown()


def test_the_answer_is_a_png_mask_and_class_counts(grouped: Any, alone: list[Any]) -> None:
    answer = alone[1]
    assert set(answer) == {"width", "height", "mask", "classes"}
    mask = mask_of(answer)
    assert mask.shape == (96, 72) and mask.max() < 21  # (height, width), VOC's 21 classes
    assert sum(answer["classes"].values()) == 72 * 96
    assert set(answer["classes"]) <= set(voc_labels())  # names, not indices


def voc_labels() -> list[str]:
    from torchvision.models.segmentation import DeepLabV3_MobileNet_V3_Large_Weights

    return list(DeepLabV3_MobileNet_V3_Large_Weights.COCO_WITH_VOC_LABELS_V1.meta["categories"])


def test_kserve_v1_instances_of_different_sizes_each_get_their_mask(
    grouped: Any, alone: list[Any]
) -> None:
    body = {"instances": [{"b64": base64.b64encode(PHOTOS[i]).decode()} for i in (0, 1, 5)]}
    ((status, answer),) = predict(grouped, [(json.dumps(body).encode(), "application/json")])
    assert status == 200
    assert all(masks_close(a, alone[i]) for a, i in zip(answer["predictions"], (0, 1, 5)))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "the request body is empty: send an image"),
        (b"%PDF-1.4 not a photo", "the request body (20 bytes) is not an image"),
        (PHOTOS[0][:3000], "the image (3000 bytes) is truncated"),
    ],
)
def test_a_bad_body_gets_a_400_saying_what_was_sent(
    grouped: Any, alone: list[Any], body: bytes, message: str
) -> None:
    got = predict(grouped, [(PHOTOS[3], JPEG), (body, JPEG), (PHOTOS[6], JPEG)])
    assert [status for status, _ in got] == [200, 400, 200]
    assert got[1][1]["message"].startswith(message), got[1][1]
    assert masks_close(got[0][1], alone[3]) and masks_close(got[2][1], alone[6])


def test_a_bad_cap_fails_the_model_load(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="handler.max_side: got 0, expected an integer >= 1"):
        start(variant(model_dir, tmp_path, "handler", max_side=0))
