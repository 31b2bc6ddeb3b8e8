"""MicroBatchingHandler against TorchServe's plain ImageClassifier on the same model and batch."""

from __future__ import annotations

import io
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw
from ts.torch_handler.image_classifier import ImageClassifier

from tests.torchserve.images import (
    bomb_png,
    jpeg_rows,
    load_handler_module,
    make_context,
    make_jpeg,
    new_batch,
    statuses,
)
from ts_microbatch import ConfigError, MicroBatchingConfig

BATCH = 8
# Batch size changes oneDNN's kernels, so a request's probabilities in a batch differ from
# its answer alone in the last float places (about 1e-7). Two images' answers must differ
# by more (assert_pairwise_distinct proves it for each set used; make_jpeg's noise: 8e-4).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def plain_results(model_dir: Path) -> list[dict[str, float]]:
    handler = ImageClassifier()
    context = make_context(model_dir, BATCH)
    handler.initialize(context)
    results: list[dict[str, float]] = handler.handle(jpeg_rows(BATCH), context)
    assert_pairwise_distinct(results)  # else rows answered out of order would pass
    return results


@pytest.fixture(scope="module")
def handler(model_dir: Path) -> Any:
    module = load_handler_module()
    h = module.MicroBatchingHandler()
    h.initialize(make_context(model_dir, 32))
    yield h
    h.micro_batching.shutdown()


def assert_same_predictions(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w), "top-5 classes differ"
        assert list(g.values()) == pytest.approx(list(w.values()), abs=TOLERANCE)


# -- isolation: each request's answer is the one it gets alone ---------------------------

THREADS = ("preprocess", "inference", "postprocess")


# (kind, colour, cell size in pixels): no two give the model the same input.
PATTERNS = [
    ("solid", (255, 0, 0), 0),
    ("solid", (0, 255, 0), 0),
    ("solid", (0, 0, 255), 0),
    ("solid", (255, 255, 255), 0),
    ("stripes", (255, 255, 0), 4),
    ("stripes", (0, 255, 255), 12),
    ("checks", (255, 0, 255), 8),
    ("checks", (255, 255, 255), 3),
]


def pattern_image(k: int, size: tuple[int, int] = (96, 72)) -> bytes:
    """PATTERNS[k] drawn on black, as a JPEG for even k and a PNG for odd k."""
    kind, colour, cell = PATTERNS[k]
    image = Image.new("RGB", size, colour if kind == "solid" else (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for x in range(0, size[0], cell or size[0]):
        for y in range(0, size[1], cell or size[1]):
            if kind != "solid" and (x // cell + (y // cell if kind == "checks" else 0)) % 2 == 0:
                draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=colour)
    out = io.BytesIO()
    if k % 2 == 0:
        image.save(out, "JPEG", quality=95)
    else:
        image.save(out, "PNG")
    return out.getvalue()


def truncated_jpeg() -> bytes:
    whole = bytes(make_jpeg(5, size=(96, 72)))
    return whole[: len(whole) // 2]  # headers intact, pixel data cut


GOOD = [{"body": pattern_image(k)} for k in range(8)]
BAD: list[tuple[dict[str, Any], int]] = [  # (row, the status it gets alone)
    ({"body": truncated_jpeg()}, 400),
    ({"body": b""}, 400),
    ({"body": b"\xff\xd8\xff\xe0 this is not really a JPEG"}, 400),
    ({"body": "plain text, not base64!"}, 400),
    ({"body": bomb_png()}, 413),
]
ROWS = GOOD + [row for row, _ in BAD]  # what a batch is drawn from, by index


@dataclass(frozen=True)
class Alone:
    """What a request gets when it is the only one in its batch."""

    status: int
    answer: dict[str, Any]


def same_answer(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Same top-5 classes in the same order, probabilities within TOLERANCE."""
    return list(got) == list(want) and all(
        abs(g - w) <= TOLERANCE for g, w in zip(got.values(), want.values())
    )


def assert_pairwise_distinct(answers: list[dict[str, float]]) -> None:
    """No answer passes for another: a row answered with another row's answer would fail
    ``same_answer`` (and ``assert_same_predictions``, which has the same tolerance)."""
    for (i, a), (j, b) in itertools.combinations(enumerate(answers), 2):
        assert not same_answer(a, b), (i, j, a, b)


def without_request_id(answer: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in answer.items() if key != "request_id"}


@pytest.fixture(scope="module")
def alone(handler: Any, model_dir: Path) -> list[Alone]:
    """Each row of ROWS sent alone, first; the good rows' answers are proven pairwise
    distinct, so a row answered with another's answer cannot pass for its own."""
    answers = []
    for row in ROWS:
        context = make_context(model_dir, 1)
        (answer,) = handler.handle([row], context)
        answers.append(Alone(statuses(context, 1)[0], answer))
    assert [a.status for a in answers] == [200] * len(GOOD) + [code for _, code in BAD]
    assert_pairwise_distinct([a.answer for a in answers[: len(GOOD)]])
    return answers


@contextmanager
def shaped(handler: Any, micro_batch_size: int, threads: tuple[int, int, int]) -> Iterator[None]:
    """The handler at this micro-batch size and parallelism; its config restored after."""
    saved = handler.micro_batching.config
    handler.micro_batching.micro_batch_size = micro_batch_size
    handler.micro_batching.parallelism = dict(zip(THREADS, threads))
    try:
        yield
    finally:
        handler.micro_batching.configure(saved)


def assert_each_answered_as_alone(
    handler: Any, model_dir: Path, alone: list[Alone], picks: list[int]
) -> None:
    """Sends ROWS[k] for k in picks as one batch; each request must get its answer alone."""
    context = make_context(model_dir, len(picks))
    got = handler.handle([ROWS[k] for k in picks], context)
    assert len(got) == len(picks)
    for i, (k, answer, status) in enumerate(zip(picks, got, statuses(context, len(picks)))):
        want = alone[k]
        assert status == want.status, (i, k, answer)
        if want.status == 200:
            assert same_answer(answer, want.answer), (i, k, answer, want.answer)
        else:  # its own error, naming its own request
            assert answer["request_id"] == f"req-{i}"
            assert without_request_id(answer) == without_request_id(want.answer)


# Rows out of their alone order, so a row answered with its neighbour's answer shows.
SHUFFLED = [3, 6, 0, 7, 1, 5, 2, 4]


@pytest.mark.parametrize(
    ("micro_batch_size", "threads"),
    [(size, (1, 1, 1)) for size in range(1, 9)]
    + [(3, (2, 1, 2)), (3, (3, 2, 1)), (2, (2, 2, 2)), (5, (1, 2, 3))],
)
def test_each_request_gets_its_answer_alone(
    handler: Any,
    model_dir: Path,
    alone: list[Alone],
    micro_batch_size: int,
    threads: tuple[int, int, int],
) -> None:
    with shaped(handler, micro_batch_size, threads):
        assert_each_answered_as_alone(handler, model_dir, alone, SHUFFLED)


@pytest.mark.parametrize(
    ("micro_batch_size", "threads", "picks"),
    [
        (4, (2, 1, 2), [3, 8, 6, 0, 7, 1, 5, 2, 4]),  # truncated JPEG among eight images
        (3, (3, 2, 1), [12, 3, 6, 9, 0, 7, 11, 1, 5, 10, 2, 4]),  # every kind of bad body
        (1, (1, 1, 1), [9, 0, 12]),
        (8, (1, 1, 1), [5, 4, 3, 2, 1, 0, 8, 7, 6]),
        (2, (2, 2, 2), [8, 9, 10, 11, 12]),  # nothing good: each still its own 4xx
    ],
)
def test_a_bad_request_gets_its_own_4xx_and_the_others_their_answers_alone(
    handler: Any,
    model_dir: Path,
    alone: list[Alone],
    micro_batch_size: int,
    threads: tuple[int, int, int],
    picks: list[int],
) -> None:
    with shaped(handler, micro_batch_size, threads):
        assert_each_answered_as_alone(handler, model_dir, alone, picks)


@pytest.mark.generative
@settings(max_examples=25)  # each example is a ResNet batch: ~0.1-0.4 s on CPU
@given(
    picks=st.lists(st.integers(0, len(ROWS) - 1), min_size=1, max_size=10),
    micro_batch_size=st.integers(1, 8),
    threads=st.sampled_from([(1, 1, 1), (2, 1, 2), (3, 2, 1), (1, 2, 1), (2, 2, 2)]),
)
@example(picks=[0, 0, 8, 0], micro_batch_size=2, threads=(2, 2, 2))  # one image, one bad
def test_any_batch_of_images_and_bad_bodies_answers_each_as_alone(
    handler: Any,
    model_dir: Path,
    alone: list[Alone],
    picks: list[int],
    micro_batch_size: int,
    threads: tuple[int, int, int],
) -> None:
    with shaped(handler, micro_batch_size, threads):
        assert_each_answered_as_alone(handler, model_dir, alone, picks)


def test_initialize_reads_the_shipped_config(handler: Any) -> None:
    config = handler.micro_batching.config
    assert config.micro_batch_size == 4
    assert config.parallelism.as_dict() == {"preprocess": 2, "inference": 1, "postprocess": 2}


@pytest.mark.parametrize(
    ("micro_batch_size", "threads"),
    [(size, threads) for size in range(1, BATCH + 1) for threads in [(1, 1, 1)]]
    + list(itertools.product([3], [(2, 1, 2), (3, 2, 1)])),
)
def test_matches_plain_image_classifier(
    handler: Any,
    model_dir: Path,
    plain_results: list[dict[str, float]],
    micro_batch_size: int,
    threads: tuple[int, int, int],
) -> None:
    handler.micro_batching.micro_batch_size = micro_batch_size
    handler.micro_batching.parallelism = dict(
        zip(("preprocess", "inference", "postprocess"), threads)
    )
    context = make_context(model_dir, BATCH)
    got = handler.handle(jpeg_rows(BATCH), context)
    assert statuses(context, BATCH) == [200] * BATCH
    assert_same_predictions(got, plain_results)


def test_one_corrupt_image_in_32_gets_400_and_31_normal_predictions(
    handler: Any, model_dir: Path
) -> None:
    handler.micro_batching.configure(
        MicroBatchingConfig.from_mapping(
            {
                "micro_batch_size": 4,
                "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
            }
        )
    )
    rows = jpeg_rows(32)
    clean = handler.handle(rows, make_context(model_dir, 32))
    rows[13] = {"body": rows[13]["body"][: len(rows[13]["body"]) // 3]}  # truncated JPEG
    context = make_context(model_dir, 32)
    got = handler.handle(rows, context)
    codes = statuses(context, 32)
    assert codes[13] == 400 and codes.count(200) == 31
    assert got[13]["type"] == "InvalidInputError" and got[13]["request_id"] == "req-13"
    assert_same_predictions(
        [g for i, g in enumerate(got) if i != 13], [c for i, c in enumerate(clean) if i != 13]
    )


def test_each_kind_of_bad_input_gets_its_own_status(handler: Any, model_dir: Path) -> None:
    rows: list[dict[str, Any]] = jpeg_rows(6)
    rows[1] = {"body": b"\xff\xd8\xff\xe0 this is not really a JPEG"}
    rows[2] = {"body": b""}
    rows[3] = {"body": "plain text, not base64!"}
    rows[4] = {"body": bomb_png()}
    context = make_context(model_dir, 6)
    got = handler.handle(rows, context)
    assert statuses(context, 6) == [200, 400, 400, 400, 413, 200]
    assert "empty" in got[2]["message"]
    assert "12000x12000" in got[4]["message"] and "max_image_pixels" in got[4]["message"]
    assert len(got[0]) == 5 and len(got[5]) == 5


def test_pixel_limit_is_configurable(model_dir: Path) -> None:
    module = load_handler_module()
    h = module.MicroBatchingHandler()
    h.initialize(make_context(model_dir, 2, {"handler": {"max_image_pixels": 300 * 200}}))
    try:
        context = make_context(model_dir, 2)
        h.handle(jpeg_rows(1, size=(300, 200)) + jpeg_rows(1, size=(301, 200)), context)
        assert statuses(context, 2) == [200, 413]
    finally:
        h.micro_batching.shutdown()


@pytest.mark.parametrize(
    ("yaml_config", "message"),
    [
        (
            {"micro_batching": {"micro_batch_size": 0}},
            "model-config.yaml: micro_batching.micro_batch_size: got 0",
        ),
        (
            {"micro_batching": {"parallelism": {"inference": -1}}},
            "micro_batching.parallelism.inference: got -1",
        ),
        ({"handler": {"max_image_pixels": "lots"}}, "handler.max_image_pixels: got 'lots'"),
        (
            {"handler": {"decoder": "magic"}},
            "handler.decoder: got 'magic', expected one of pil, torchvision",
        ),
    ],
)
def test_bad_config_fails_initialize_naming_the_key(
    model_dir: Path, yaml_config: dict[str, Any], message: str
) -> None:
    module = load_handler_module()
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        module.MicroBatchingHandler().initialize(make_context(model_dir, 1, yaml_config))


def name_requests(context: Any, prefix: str, batch: int) -> None:
    """A new batch on ``context``, as Service.predict starts one, with ids "<prefix>-req-<i>"."""
    new_batch(context, batch)
    context.request_ids = {i: f"{prefix}-req-{i}" for i in range(batch)}
    context.metrics.request_ids = context.request_ids


@pytest.mark.parametrize("one_context", [True, False], ids=["one-live-context", "two-contexts"])
def test_two_batches_in_the_pipeline_at_once_each_get_their_own_answers_and_context(
    model_dir: Path, alone: list[Alone], one_context: bool
) -> None:
    """Batch a's first micro-batch is held in inference until batch b's preprocess has
    started, so both batches are in the pipeline at once; then each gets its own answers,
    statuses and, in every stage call, its own requests' ids.

    TorchServe workers are processes and never share a handler; inside one worker two
    batches overlap when a timed-out batch's micro-batches still run as the next arrives,
    on the one Context TorchServe keeps and renews for each batch (one_context)."""
    h = load_handler_module().MicroBatchingHandler()
    threads = {"preprocess": 2, "inference": 1, "postprocess": 2}
    yaml_config = {"micro_batching": {"micro_batch_size": 2, "parallelism": threads}}
    h.initialize(make_context(model_dir, 4, yaml_config))
    mb = h.micro_batching
    picks = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}  # distinct answers: proven by `alone`
    rows = {name: [ROWS[k] for k in ks] for name, ks in picks.items()}
    calls: list[tuple[str, Any, list[int], list[str | None], Any]] = []
    a_held, b_preprocessing = threading.Event(), threading.Event()
    overlapped: list[bool] = []

    def recorded(stage: str) -> Any:
        original = getattr(h, stage)

        def call(data: Any) -> Any:
            info = mb.current_micro_batch()
            indices = list(info.request_indices)
            calls.append((stage, info.context, indices, mb.current_request_ids(), data))
            if stage == "preprocess" and data[0] in rows["b"]:
                b_preprocessing.set()
            if stage == "inference" and not a_held.is_set():  # a's first: b is not sent yet
                a_held.set()
                overlapped.append(b_preprocessing.wait(60))
            return original(data)

        return call

    for stage in THREADS:  # MicroBatching looks the stages up on the handler at each call
        setattr(h, stage, recorded(stage))
    live: dict[str, Any] = {}
    processors: dict[str, list[Any]] = {}
    results: dict[str, list[Any]] = {}

    def handle(name: str) -> None:
        results[name] = h.handle(rows[name], live[name])

    senders = {name: threading.Thread(target=handle, args=(name,)) for name in picks}

    def send(name: str, context: Any) -> None:
        name_requests(context, name, 4)
        live[name], processors[name] = context, context.request_processor
        senders[name].start()

    try:
        send("a", make_context(model_dir, 4))
        assert a_held.wait(60), "batch a never reached inference"
        # TorchServe's one Context, renewed for the next batch; or a context of its own.
        send("b", live["a"] if one_context else make_context(model_dir, 4))
        for sender in senders.values():
            sender.join(60)
        assert not any(sender.is_alive() for sender in senders.values())
    finally:
        b_preprocessing.set()  # never leave a stage thread held
        mb.shutdown()
    assert overlapped == [True], "batch b's preprocess did not start while a was held"
    # Which batch each stage call served, from the rows its preprocess got, not from ids.
    batch_of: dict[int, str] = {}
    for stage, view, indices, _, data in calls:
        if stage == "preprocess":
            (name,) = [n for n in rows if data == [rows[n][i] for i in indices]]
            assert batch_of.setdefault(id(view), name) == name
    assert sorted(batch_of.values()) == ["a", "b"]
    served: dict[tuple[str, str], list[int]] = {}
    for stage, view, indices, ids, _ in calls:
        name = batch_of[id(view)]
        assert ids == [f"{name}-req-{i}" for i in indices], (stage, name, indices, ids)
        served.setdefault((name, stage), []).extend(indices)
    assert {key: sorted(seen) for key, seen in served.items()} == {
        (name, stage): [0, 1, 2, 3] for name in picks for stage in THREADS
    }
    for name, ks in picks.items():
        assert [p.get_response_status_code() for p in processors[name]] == [200] * 4
        for answer, k in zip(results[name], ks):
            assert same_answer(answer, alone[k].answer), (name, k, answer)


def test_context_is_fresh_per_batch(handler: Any, model_dir: Path) -> None:
    context = make_context(model_dir, 2)
    handler.handle([{"body": b""}, jpeg_rows(1)[0]], context)
    assert statuses(context, 2) == [400, 200]
    new_batch(context, 2)
    handler.handle(jpeg_rows(2), context)
    assert statuses(context, 2) == [200, 200]


def test_upstream_style_handler_works_with_only_the_import_swapped(
    model_dir: Path, plain_results: list[dict[str, float]]
) -> None:
    """The upstream example's handler body, verbatim but for `from ts_microbatch import ...`."""
    from ts_microbatch import MicroBatching

    class UpstreamStyleHandler(ImageClassifier):
        def __init__(self) -> None:
            mb_handle = MicroBatching(self)
            self.handle = mb_handle  # type: ignore[method-assign]

        def initialize(self, ctx: Any) -> None:
            super().initialize(ctx)
            parallelism = ctx.model_yaml_config.get("micro_batching", {}).get("parallelism", None)
            if parallelism:
                self.handle.parallelism = parallelism
            self.handle.micro_batch_size = ctx.model_yaml_config.get("micro_batching", {}).get(
                "micro_batch_size", 1
            )

    h = UpstreamStyleHandler()
    yaml_config = {"micro_batching": {"micro_batch_size": 3, "parallelism": {"preprocess": 2}}}
    h.initialize(make_context(model_dir, BATCH, yaml_config))
    try:
        context = make_context(model_dir, BATCH)
        rows = jpeg_rows(BATCH)
        rows[5] = {"body": b"garbage"}
        got = h.handle(rows, context)
        assert statuses(context, BATCH) == [200] * 5 + [400] + [200] * 2
        assert_same_predictions(got[:5] + got[6:], plain_results[:5] + plain_results[6:])
        assert h.handle.parallelism["preprocess"] == 2
    finally:
        h.handle.shutdown()


def test_torchvision_decoder_stays_within_one_level_of_pil(model_dir: Path) -> None:
    module = load_handler_module()
    pil = module.MicroBatchingHandler()
    fast = module.MicroBatchingHandler()
    pil.initialize(make_context(model_dir, 8, {"handler": {"decoder": "pil"}}))
    fast.initialize(make_context(model_dir, 8, {"handler": {"decoder": "torchvision"}}))
    try:
        rows = jpeg_rows(8, size=(720, 720))
        a, b = pil.preprocess(rows), fast.preprocess(rows)
        # Documented tolerance: one uint8 level before normalization, i.e. 1/255/std.
        assert (a - b).abs().max().item() <= 1 / 255 / 0.224 + 1e-6
        rows[3] = {"body": rows[3]["body"][:5000]}
        context = make_context(model_dir, 8)
        got = fast.handle(rows, context)
        assert statuses(context, 8) == [200, 200, 200, 400, 200, 200, 200, 200]
        want = pil.handle(rows, make_context(model_dir, 8))
        for i in (0, 7):
            assert list(got[i]) == list(want[i])
            assert list(got[i].values()) == pytest.approx(list(want[i].values()), abs=1e-3)
    finally:
        pil.micro_batching.shutdown()
        fast.micro_batching.shutdown()


def test_hang_same_image_responses_of_different_lengths(
    handler: Any, model_dir: Path, alone: list[Alone]
) -> None:
    # ab saw bodies of different lengths for one image. Cause: oneDNN's kernels differ by
    # batch size, so micro-batches of 1-3 and of 4+ give last-place float differences.
    # Rows of one image at one place in micro-batches of one size must get byte-identical
    # bodies, and across sizes probabilities within 1e-6 of its answer alone. (The place
    # counts on torch 2.4, the official image's: its kernels give a row's last float places
    # by its position in the batch as well.) Four images twice over, their answers proven
    # distinct by `alone`: a row answered with another's would show.
    picks = [0, 1, 2, 3] * 2
    # (image, its micro-batch's size, its place there) -> bodies
    bodies: dict[tuple[int, int, int], set[str]] = {}
    for micro_batch_size in (1, 3, 4):  # 1 x 8, 3 + 3 + 2, 4 + 4
        with shaped(handler, micro_batch_size, (2, 1, 2)):
            got = handler.handle([ROWS[k] for k in picks], make_context(model_dir, 8))
        for i, (k, answer) in enumerate(zip(picks, got)):
            size = min(micro_batch_size, len(picks) - i // micro_batch_size * micro_batch_size)
            key = (k, size, i % micro_batch_size)
            bodies.setdefault(key, set()).add(json.dumps(answer, indent=2))  # as TorchServe
            assert list(answer) == list(alone[k].answer)  # same top-5 labels, same order
            assert list(answer.values()) == pytest.approx(list(alone[k].answer.values()), abs=1e-6)
    assert {size for _, size, _ in bodies} == {1, 2, 3, 4}
    # the scenario: images met again at their place (in micro-batches of 1 and of 4)
    assert len(bodies) < 3 * len(picks)
    assert all(len(same_size) == 1 for same_size in bodies.values()), bodies


def sideways_with_orientation_tag(upright: Image.Image) -> bytes:
    """As a phone stores a portrait photo: pixels turned sideways, EXIF orientation 6
    ("rotate 90 degrees clockwise to display")."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    upright.transpose(Image.Transpose.ROTATE_90).save(buf, "JPEG", quality=95, exif=exif)
    return buf.getvalue()


@pytest.mark.parametrize("decoder", ["pil", "torchvision", "pil-draft"])
def test_a_photo_stored_sideways_is_turned_upright(model_dir: Path, decoder: str) -> None:
    upright = Image.open(io.BytesIO(make_jpeg(77, size=(480, 640)))).convert("RGB")  # portrait
    buf = io.BytesIO()
    upright.save(buf, "JPEG", quality=95)
    rows = [{"body": buf.getvalue()}, {"body": sideways_with_orientation_tag(upright)}]
    module = load_handler_module()
    handlers = {}
    for exif in (True, False):
        h = module.MicroBatchingHandler()
        settings = {"decoder": decoder, "exif_orientation": exif}
        h.initialize(make_context(model_dir, 2, {"handler": settings}))
        handlers[exif] = h
    try:
        on, off = (handlers[e].preprocess(rows) for e in (True, False))
        # With the tag honoured the sideways file decodes like the upright one (JPEG noise
        # only); ignored, it is a different picture: the scenario really is sideways.
        assert (on[0] - on[1]).abs().mean().item() < 0.05
        assert (off[0] - off[1]).abs().mean().item() > 0.2
    finally:
        for h in handlers.values():
            h.micro_batching.shutdown()


def test_pil_draft_decodes_jpeg_close_to_pil_and_other_formats_exactly(model_dir: Path) -> None:
    module = load_handler_module()
    handlers = {}
    for decoder in ("pil", "pil-draft"):
        h = module.MicroBatchingHandler()
        h.initialize(make_context(model_dir, 3, {"handler": {"decoder": decoder}}))
        handlers[decoder] = h
    try:
        jpeg = jpeg_rows(1, size=(1920, 1080), first_seed=40)  # decoded at 1/4 scale
        exact, draft = (handlers[d].preprocess(jpeg) for d in ("pil", "pil-draft"))
        # Measured on the corpus (benchmarks/dev/decoder_accuracy.py): max 0.07, mean 0.01.
        assert 0 < (exact - draft).abs().max().item() <= 0.1
        assert (exact - draft).abs().mean().item() <= 0.02
        png = io.BytesIO()
        Image.open(io.BytesIO(jpeg[0]["body"])).save(png, "PNG")
        rows = [{"body": png.getvalue()}]
        assert torch.equal(handlers["pil"].preprocess(rows), handlers["pil-draft"].preprocess(rows))
        context = make_context(model_dir, 2)
        handlers["pil-draft"].handle(jpeg + [{"body": jpeg[0]["body"][:3000]}], context)
        assert statuses(context, 2) == [200, 400]
    finally:
        for h in handlers.values():
            h.micro_batching.shutdown()


def test_preprocess_and_postprocess_run_torch_on_one_thread_and_inference_on_the_default(
    handler: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped handler with its default intra_op_threads, through handle(): each stage's
    torch operations see the count its threads were given (ts_microbatch.core.intra_op)."""
    seen: dict[str, set[int]] = {}
    default = torch.get_num_threads()
    if default < 2:
        pytest.skip("torch uses one intra-op thread by default here: nothing to tell apart")
    for stage in ("preprocess", "inference", "postprocess"):
        method = getattr(handler, stage)

        def record(data: Any, _method: Any = method, _stage: str = stage) -> Any:
            seen.setdefault(_stage, set()).add(torch.get_num_threads())
            return _method(data)

        monkeypatch.setattr(handler, stage, record)
    context = make_context(model_dir, BATCH)
    handler.handle(jpeg_rows(BATCH), context)
    assert statuses(context, BATCH) == [200] * BATCH
    assert seen == {"preprocess": {1}, "inference": {default}, "postprocess": {1}}
    assert torch.get_num_threads() == default
