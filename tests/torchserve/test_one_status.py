"""One request, one status: what a body gets never depends on what shared its batch.

Through TorchServe's own loader and ``Service.predict``, with the stock ImageClassifier
behind the drop-in ``MicroBatching``, the example image handler and the BERT example. The
rule (ts_microbatch.core.isolation, docs/failures.md): once the first stage has served a
request, a request failing there alone has met a bad input of its own (400), alone or in
any batch; a verdict that fails a whole batch needs a request that failed alone; a model
whose first stage never served one request answers its failures 500.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT
from tests.torchserve.bert import SMALL_BERT, build, example_config
from tests.torchserve.images import make_jpeg
from tests.torchserve.test_bert_handler import extract as extract_bert
from tests.torchserve.test_bert_handler import start as start_bert
from tests.torchserve.ts_machinery import decode, load_service, request, write_manifest

TOLERANCE = 1e-4  # batch size changes oneDNN's kernels: the last float places move

DROP_IN_HANDLER = """
from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatching


class DropInHandler(ImageClassifier):
    def __init__(self):
        self.handle = MicroBatching(self)

    def initialize(self, ctx):
        super().initialize(ctx)
        section = ctx.model_yaml_config.get("micro_batching", {})
        self.handle.micro_batch_size = section.get("micro_batch_size", 1)
        self.handle.parallelism = section.get("parallelism", {})
"""
MIXIN_DETECTOR = """
from ts.torch_handler.object_detector import ObjectDetector

from ts_microbatch import MicroBatchingMixin


class Detector(MicroBatchingMixin, ObjectDetector):
    pass
"""
# A detector with the torchvision interface (a list of per-image dicts) and no weights to
# load: what matters here is VisionHandler.preprocess stacking the images.
TINY_DETECTOR = """
import torch
from torch import nn


class TinyDetector(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, images):
        out = []
        for image in images:
            h, w = image.shape[-2:]
            box = torch.tensor([[0.0, 0.0, float(w), float(h)]]) * self.scale
            out.append({"boxes": box, "labels": torch.tensor([1]), "scores": torch.ones(1)})
        return out
"""
MODEL_CONFIG = {
    "micro_batching": {
        "micro_batch_size": 4,
        "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1},
    }
}


def laid_out(
    directory: Path, model_dir: Path, handler_name: str, handler_code: str, config: Any
) -> Path:
    for name in ("model.py", "resnet18.pth", "index_to_name.json"):
        shutil.copy(model_dir / name, directory / name)
    (directory / handler_name).write_text(handler_code, encoding="utf-8")
    (directory / "model-config.yaml").write_text(json.dumps(config), encoding="utf-8")
    write_manifest(
        directory,
        "status_model",
        handler_name,
        serializedFile="resnet18.pth",
        modelFile="model.py",
        configFile="model-config.yaml",
    )
    return directory


def drop_in(tmp: Path, model_dir: Path) -> Any:
    directory = laid_out(tmp, model_dir, "drop_in_handler.py", DROP_IN_HANDLER, MODEL_CONFIG)
    return load_service(directory, model_name="status_model", handler="drop_in_handler.py")


def example_image(tmp: Path, model_dir: Path) -> Any:
    code = Path(ROOT, "handlers/micro_batching_handler.py").read_text(encoding="utf-8")
    config = {**MODEL_CONFIG, "handler": {"decoder": "pil-draft"}}
    directory = laid_out(tmp, model_dir, "micro_batching_handler.py", code, config)
    return load_service(directory, model_name="status_model", handler="micro_batching_handler.py")


def entry(service: Any) -> Any:
    """The MicroBatching a service runs: the drop-in's ``handle``, or the mixin's."""
    handler = getattr(service._entry_point, "__self__", None)  # the mixin's bound handle
    mixin = getattr(handler, "micro_batching", None)
    return mixin if mixin is not None else service._entry_point


def predict(service: Any, bodies: list[tuple[bytes, str]]) -> list[tuple[int, Any]]:
    batch = [request(i, body, content_type) for i, (body, content_type) in enumerate(bodies)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, _json(body)) for _, status, body in answers]


def _json(body: bytes) -> Any:
    answer = json.loads(body)
    if isinstance(answer, dict):
        answer.pop("request_id", None)  # a request's own id: different in every batch
    return answer


def same_answer(got: Any, want: Any) -> bool:
    """Equal, floats within TOLERANCE; a top-k dict may swap classes tied within it."""
    if isinstance(want, dict) and want and all(isinstance(v, float) for v in want.values()):
        if not isinstance(got, dict) or len(got) != len(want):
            return False
        ordered = zip(sorted(got.values()), sorted(want.values()))
        if any(abs(a - b) > TOLERANCE for a, b in ordered):
            return False
        floor = min(want.values())
        return all(
            abs(got[k] - want[k]) <= TOLERANCE if k in want else abs(got[k] - floor) <= TOLERANCE
            for k in got
        )
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same_answer(got[k], want[k]) for k in want)
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(same_answer(g, w) for g, w in zip(got, want))
        )
    if isinstance(want, float):
        return isinstance(got, float) and abs(got - want) <= TOLERANCE
    return bool(got == want)


JPEG = "image/jpeg"
GOOD = [make_jpeg(60 + i, size=(320, 240)) for i in range(4)]
PORTRAIT = make_jpeg(70, size=(240, 320))
BAD = {
    "empty": b"",
    "truncated": GOOD[0][: len(GOOD[0]) // 2],
    "header-only": GOOD[1][:200],
    "not-an-image": b"this is not a picture at all",
}
IMAGE_BODIES: dict[str, tuple[bytes, str]] = {
    **{f"good-{i}": (body, JPEG) for i, body in enumerate(GOOD)},
    "portrait": (PORTRAIT, JPEG),
    **{name: (body, JPEG) for name, body in BAD.items()},
}


class Alone:
    """Each body's answer sent alone, once per service."""

    def __init__(self, service: Any, bodies: dict[str, tuple[bytes, str]]) -> None:
        self.service = service
        self.bodies = bodies
        self.answers: dict[str, tuple[int, Any]] = {}

    def __getitem__(self, name: str) -> tuple[int, Any]:
        if name not in self.answers:
            (self.answers[name],) = predict(self.service, [self.bodies[name]])
        return self.answers[name]

    def check_batch(self, names: list[str], micro_batch_size: int) -> None:
        entry(self.service).micro_batch_size = micro_batch_size
        got = predict(self.service, [self.bodies[name] for name in names])
        for name, (status, answer) in zip(names, got):
            want_status, want = self[name]
            assert status == want_status, (name, status, answer, want_status, want)
            assert same_answer(answer, want), (name, answer, want)


@pytest.fixture(scope="module")
def drop_in_service(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    service = drop_in(tmp_path_factory.mktemp("drop_in"), model_dir)
    assert predict(service, [(GOOD[0], JPEG)])[0][0] == 200  # the first stage has served
    yield service
    service._entry_point.shutdown()


@pytest.fixture(scope="module")
def image_service(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    service = example_image(tmp_path_factory.mktemp("image"), model_dir)
    assert predict(service, [(GOOD[0], JPEG)])[0][0] == 200
    yield service
    entry(service).shutdown()


def test_defect_a_bad_body_alone_got_500_and_400_in_a_batch(drop_in_service: Any) -> None:
    # A truncated JPEG raises a plain OSError in ImageClassifier's preprocess. Alone, no
    # other request "got through the first stage", and it was answered 500.
    truncated = BAD["truncated"]
    (alone,) = predict(drop_in_service, [(truncated, JPEG)])
    mixed = predict(drop_in_service, [(GOOD[1], JPEG), (truncated, JPEG), (GOOD[2], JPEG)])
    assert alone[0] == mixed[1][0] == 400
    assert alone[1]["type"] == "OSError" and alone[1] == mixed[1][1]
    assert [mixed[0][0], mixed[2][0]] == [200, 200]


def test_a_model_whose_first_stage_never_served_answers_its_failures_500(
    model_dir: Path, tmp_path: Path
) -> None:
    # Nothing shows the input is at fault: the first batch since load fails alike.
    service = drop_in(tmp_path, model_dir)
    try:
        truncated = BAD["truncated"]
        assert [s for s, _ in predict(service, [(truncated, JPEG)] * 3)] == [500] * 3
        assert [s for s, _ in predict(service, [(GOOD[0], JPEG)])] == [200]
        assert [s for s, _ in predict(service, [(truncated, JPEG)] * 3)] == [400] * 3
    finally:
        service._entry_point.shutdown()


@pytest.mark.generative
@settings(max_examples=25)
@given(
    names=st.lists(st.sampled_from(sorted(IMAGE_BODIES)), min_size=1, max_size=12),
    micro_batch_size=st.integers(1, 5),
)
@example(
    names=["truncated", "not-an-image", "empty", "header-only", "truncated"], micro_batch_size=1
)
@example(names=["good-0", "portrait", "truncated", "good-1"], micro_batch_size=4)
def test_each_body_gets_what_it_gets_alone_from_the_stock_handler(
    drop_in_service: Any, names: list[str], micro_batch_size: int
) -> None:
    _alone_of(drop_in_service).check_batch(names, micro_batch_size)


@pytest.mark.generative
@settings(max_examples=25)
@given(
    names=st.lists(st.sampled_from(sorted(IMAGE_BODIES)), min_size=1, max_size=12),
    micro_batch_size=st.integers(1, 5),
)
@example(names=["truncated", "truncated", "truncated", "truncated"], micro_batch_size=1)
def test_each_body_gets_what_it_gets_alone_from_the_example_handler(
    image_service: Any, names: list[str], micro_batch_size: int
) -> None:
    _alone_of(image_service).check_batch(names, micro_batch_size)


_ALONE: dict[int, Alone] = {}


def _alone_of(service: Any, bodies: dict[str, tuple[bytes, str]] = IMAGE_BODIES) -> Alone:
    if id(service) not in _ALONE:
        _ALONE[id(service)] = Alone(service, bodies)
    return _ALONE[id(service)]


# -- images of different sizes under the stock ObjectDetector -------------------------


def detector(tmp: Path) -> Any:
    # Its own module name: this process already imported the ResNet's "model".
    (tmp / "tiny_detector.py").write_text(TINY_DETECTOR, encoding="utf-8")
    torch.save({"scale": torch.ones(1)}, tmp / "detector.pth")
    (tmp / "detector_handler.py").write_text(MIXIN_DETECTOR, encoding="utf-8")
    config = {"micro_batching": {"micro_batch_size": 2, "parallelism": {"preprocess": 2}}}
    (tmp / "model-config.yaml").write_text(json.dumps(config), encoding="utf-8")
    write_manifest(
        tmp,
        "detector",
        "detector_handler.py",
        serializedFile="detector.pth",
        modelFile="tiny_detector.py",
        configFile="model-config.yaml",
    )
    return load_service(tmp, model_name="detector", handler="detector_handler.py")


def test_defect_mixed_sizes_under_the_stock_object_detector_failed_all_8(tmp_path: Path) -> None:
    # VisionHandler.preprocess stacks a micro-batch's images: every micro-batch mixing
    # sizes raised, and "every micro-batch of a batch of four or more requests failed its
    # first run alike" answered all 8 with 500, though each image alone is answered 200.
    sizes = [(640, 480), (480, 640), (800, 600), (320, 320), (1024, 768), (600, 800)]
    sizes += [(512, 384), (384, 512)]
    bodies = [(make_jpeg(80 + i, size=size), JPEG) for i, size in enumerate(sizes)]
    service = detector(tmp_path)
    try:
        handler = service._entry_point.__self__
        stacked: list[int] = []
        preprocess = handler.preprocess

        def recording(data: list[Any]) -> Any:
            stacked.append(len(data))
            return preprocess(data)

        handler.preprocess = recording
        got = predict(service, bodies)
        assert stacked[:4] == [2, 2, 2, 2]  # the scenario: four mixed micro-batches ran
        assert [status for status, _ in got] == [200] * 8
        for (width, height), (_, answer) in zip(sizes, got):
            # ObjectDetector's answer for our tiny model: the image's own box
            assert [list(box.values())[0] for box in answer] == [[0.0, 0.0, width, height]]
    finally:
        service._entry_point.__self__.micro_batching.shutdown()


# -- the BERT example ----------------------------------------------------------------


TEXT = "text/plain"


@pytest.fixture(scope="module")
def bert_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.make_model_dir(tmp_path_factory.mktemp("bert") / "model", bert=SMALL_BERT)


def bert(tmp: Path, model_dir: Path, **overrides: Any) -> Any:
    return start_bert(extract_bert(tmp, model_dir, example_config(**overrides)))


def test_defect_a_text_over_the_largest_bucket_was_refused_under_truncate(
    bert_model_dir: Path, tmp_path: Path
) -> None:
    # allowed_sequence_lengths [64] with truncate: true counted a 174-token text at 64, but
    # the handler cut it at max_tokens (512): "a row of 174 tokens cannot be padded to 64",
    # 400 in a batch and 500 alone. The handler now truncates to the largest bucket.
    service = bert(
        tmp_path,
        bert_model_dir,
        allowed_sequence_lengths=[64],
        max_tokens=None,
        truncate=True,
        max_micro_batch_tokens=None,
    )
    try:
        handler = service._entry_point.__self__
        long_text = " ".join(["word"] * 300)
        assert len(handler.tokenizer(long_text)["input_ids"]) > 64  # the scenario
        (alone,) = predict(service, [(long_text.encode(), TEXT)])
        mixed = predict(service, [(b"short text", TEXT), (long_text.encode(), TEXT)])
        assert alone[0] == mixed[1][0] == 200
        assert same_answer(mixed[1][1], alone[1])
    finally:
        service._entry_point.__self__.micro_batching.shutdown()


BERT_BODIES: dict[str, tuple[bytes, str]] = {
    "short": (b"a short review", TEXT),
    "medium": (" ".join(["great movie and cast"] * 12).encode(), TEXT),
    "long": (" ".join(["an awful plot"] * 60).encode(), TEXT),
    "too-long": (" ".join(["word"] * 700).encode(), TEXT),
    "empty": (b"", TEXT),
    "not-utf8": (b"\xff\xfe\xfa", TEXT),
    "json-text": (json.dumps({"text": "fine words"}).encode(), "application/json"),
}


@pytest.fixture(scope="module")
def bert_service(bert_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    service = bert(tmp_path_factory.mktemp("bert_status"), bert_model_dir)
    assert predict(service, [BERT_BODIES["short"]])[0][0] == 200
    yield service
    service._entry_point.__self__.micro_batching.shutdown()


@pytest.mark.generative
@settings(max_examples=25)
@given(
    names=st.lists(st.sampled_from(sorted(BERT_BODIES)), min_size=1, max_size=12),
    micro_batch_size=st.sampled_from([1, 2, 4, 32]),
)
@example(names=["too-long", "short", "empty", "long", "not-utf8"], micro_batch_size=32)
def test_each_text_gets_what_it_gets_alone_from_the_bert_example(
    bert_service: Any, names: list[str], micro_batch_size: int
) -> None:
    _alone_of(bert_service, BERT_BODIES).check_batch(names, micro_batch_size)
