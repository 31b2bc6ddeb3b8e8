"""Through TorchServe's own machinery, not an imitation of it.

TorchServe's ``TsModelLoader`` loads the handler (and a request envelope) from a model
directory laid out as a .mar extracts; ``Service.predict`` runs a batch exactly as the
worker does, with the one Context it keeps for the model; the binary response is decoded
the way the frontend reads it, so each request's status and body are what a client gets.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.torchserve.images import make_jpeg
from tests.torchserve.ts_machinery import decode, load_service, request, write_manifest
from ts_microbatch import ConfigError

# TorchServe's own ImageClassifier with upstream's micro-batching example body; only the
# import names ts_microbatch.
DROP_IN_HANDLER = """
from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatching


class DropInHandler(ImageClassifier):
    def __init__(self):
        mb_handle = MicroBatching(self)
        self.handle = mb_handle

    def initialize(self, ctx):
        super().initialize(ctx)
        section = ctx.model_yaml_config.get("micro_batching", {})
        self.handle.micro_batch_size = section.get("micro_batch_size", 1)
        parallelism = section.get("parallelism", None)
        if parallelism:
            self.handle.parallelism = parallelism
"""

MODEL_CONFIG = """
micro_batching:
  micro_batch_size: 4
  parallelism:
    preprocess: 2
    inference: 1
    postprocess: 1
"""


@pytest.fixture(scope="module")
def extracted_mar(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("drop_in_mar")
    for name in ("model.py", "resnet18.pth", "index_to_name.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, directory / name)
    (directory / "drop_in_handler.py").write_text(DROP_IN_HANDLER, encoding="utf-8")
    (directory / "model-config.yaml").write_text(MODEL_CONFIG, encoding="utf-8")
    write_manifest(
        directory,
        "drop_in",
        "drop_in_handler.py",
        serializedFile="resnet18.pth",
        modelFile="model.py",
        configFile="model-config.yaml",
    )
    return directory


@pytest.fixture(scope="module")
def service(extracted_mar: Path) -> Iterator[Any]:
    service = load_service(extracted_mar)
    yield service
    service._entry_point.shutdown()


def good_jpegs(n: int, first_seed: int = 40) -> list[bytes]:
    return [make_jpeg(first_seed + i, size=(320, 240)) for i in range(n)]


def test_hang_stock_handler_bad_inputs_got_500_instead_of_400(service: Any) -> None:
    # Before: an empty body 500 (TypeError), a truncated JPEG 500 (OSError), a JPEG
    # header without data 500. Isolated in the first stage while the rest of the batch
    # got through it, each is that request's input: 400 with the message.
    jpeg = good_jpegs(1)[0]
    bodies = good_jpegs(5)
    bad = {5: b"", 6: jpeg[: len(jpeg) // 2], 7: jpeg[:200]}
    batch = [request(i, b) for i, b in enumerate(bodies)]
    batch += [request(i, body) for i, body in bad.items()]
    code, answers = decode(service.predict(batch))
    assert code == 200
    assert [a[0] for a in answers] == [f"req-{i}" for i in range(8)]
    assert [a[1] for a in answers] == [200] * 5 + [400] * 3
    for _, _, body in answers[5:]:
        error = json.loads(body)
        assert error["code"] == 400 and error["message"] and error["request_id"]
    assert all(len(json.loads(body)) == 5 for _, _, body in answers[:5])  # top-5 classes


def test_stock_handler_a_batch_of_bad_bodies_gets_what_each_gets_alone(service: Any) -> None:
    # Truncated JPEGs raise a plain OSError. Once the first stage has served a request
    # (the tests above), a request failing there alone has met a bad input: 400, whatever
    # shares its batch (a model whose first stage never served answers 500 alike:
    # test_one_status.py).
    jpeg = good_jpegs(1)[0]
    assert [a[1] for a in decode(service.predict([request(0, good_jpegs(1)[0])]))[1]] == [200]
    code, answers = decode(service.predict([request(i, jpeg[:-300]) for i in range(3)]))
    (alone,) = decode(service.predict([request(0, jpeg[:-300])]))[1]
    assert code == 200 and [a[1] for a in answers] == [400, 400, 400] == [alone[1]] * 3


def test_hang_json_envelope_status_landed_on_another_request(extracted_mar: Path) -> None:
    # TorchServe's json envelope flattens the instances of several requests into one list.
    # A failure at flattened index i used to set the status of request i (here request 2,
    # which is fine); an index past the number of requests raised IndexError: 503 for all.
    service = load_service(extracted_mar, envelope="json")
    try:
        good = [base64.b64encode(b).decode() for b in good_jpegs(4, first_seed=70)]
        bad = base64.b64encode(b"not an image at all").decode()

        def body(*instances: str) -> dict[str, Any]:
            # As the worker's protocol reader hands it over: application/json already parsed.
            return json.loads(json.dumps({"instances": [{"data": {"b64": x}} for x in instances]}))

        batch = [
            request(0, body(good[0], good[1]), "application/json"),
            request(1, body(bad), "application/json"),  # flattened index 2
            request(2, body(good[2]), "application/json"),
            request(3, body(good[3], bad), "application/json"),  # flattened index 5 > 3
        ]
        code, answers = decode(service.predict(batch))
        assert code == 200
        assert [a[1] for a in answers] == [200, 200, 200, 200]  # no status on a wrong request
        predictions = [json.loads(b)["predictions"] for _, _, b in answers]
        assert [len(p) for p in predictions] == [2, 1, 1, 2]
        assert predictions[1][0]["code"] == 400 and predictions[3][1]["code"] == 400
        for instance in predictions[0] + predictions[2] + predictions[3][:1]:
            assert "code" not in instance and len(instance) == 5
    finally:
        service._entry_point.__self__._handle_fn.shutdown()


def test_kserve_v1_and_v2_requests_mixed_with_plain_ones_in_one_batch(
    service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the KServe bundle deploys it (kserve: true): {"instances": ...} bodies are v1
    # requests too, not only the strict v2 shape the default "auto" takes.
    drop_in = service._entry_point  # DropInHandler.handle is the MicroBatching object
    monkeypatch.setattr(drop_in, "_config", dataclasses.replace(drop_in.config, kserve=True))
    images = good_jpegs(5, first_seed=90)
    b64 = [base64.b64encode(image).decode() for image in images]
    _, plain = decode(service.predict([request(i, image) for i, image in enumerate(images)]))
    reference = [json.loads(body) for _, _, body in plain]
    v2_body = {
        "id": "v2-request",
        "inputs": [{"name": "image", "shape": [2], "datatype": "BYTES", "data": b64[3:5]}],
    }
    batch = [
        request(0, images[0]),  # plain
        request(1, {"instances": [{"data": b64[1]}, {"b64": b64[2]}]}, "application/json"),
        request(2, v2_body, "application/json"),
        request(3, {"instances": [{"data": b64[0]}, {"data": "bm90IGFuIGltYWdl"}]}),
        request(4, {"inputs": [{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]}),
    ]
    code, answers = decode(service.predict(batch))
    assert code == 200
    assert [status for _, status, _ in answers] == [200, 200, 200, 400, 400]
    bodies = [json.loads(body) for _, _, body in answers]

    def same(got: dict[str, float], want: dict[str, float]) -> None:
        assert list(got) == list(want)  # the same top-5 classes, in order
        assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)

    same(bodies[0], reference[0])
    same(bodies[1]["predictions"][0], reference[1])
    same(bodies[1]["predictions"][1], reference[2])
    assert bodies[2]["id"] == "v2-request" and bodies[2]["model_name"] == "drop_in"
    output = bodies[2]["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [2]
    for text, want in zip(output["data"], reference[3:5]):
        same(json.loads(text), want)
    assert bodies[3]["error"].startswith("instance 1: ")
    assert "unknown datatype 'FP8'" in bodies[4]["error"]


@pytest.mark.parametrize("envelope", ["kserve", "kservev2"])
def test_torchserve_kserve_envelope_fails_the_load_saying_what_to_change(
    extracted_mar: Path, envelope: str
) -> None:
    # TorchServe's KServe envelopes answer only the first request of a batch: 503 for the
    # rest. Loaded by TorchServe's own loader with that envelope, the handler refuses.
    with pytest.raises(ConfigError, match=f"service_envelope={envelope}: TorchServe's KServe"):
        load_service(extracted_mar, envelope=envelope)
