"""MicroBatchingHandler against TorchServe's plain ImageClassifier on the same model and batch."""

from __future__ import annotations

import io
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from ts.torch_handler.image_classifier import ImageClassifier

from tests.handlers.conftest import (
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


@pytest.fixture(scope="module")
def plain_results(model_dir: Path) -> list[dict[str, float]]:
    handler = ImageClassifier()
    context = make_context(model_dir, BATCH)
    handler.initialize(context)
    results: list[dict[str, float]] = handler.handle(jpeg_rows(BATCH), context)
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
        assert list(g.values()) == pytest.approx(list(w.values()), abs=1e-4)


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


def test_two_batches_in_the_pipeline_at_once_each_get_their_own_predictions(
    handler: Any, model_dir: Path
) -> None:
    """Two batches in one pipeline at the same time, each with its own context.

    TorchServe workers are processes and never share a handler; inside one worker two
    batches overlap when a timed-out batch's micro-batches still run as the next arrives.
    The two batches hold different images, so rows mixed up between them would show."""
    rows = [jpeg_rows(4, first_seed=100), jpeg_rows(4, first_seed=200)]
    contexts = [make_context(model_dir, 4), make_context(model_dir, 4)]
    reference = [handler.handle(r, make_context(model_dir, 4)) for r in rows]
    results: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def call(i: int) -> None:
        barrier.wait(60)
        results[i] = handler.micro_batching.handle(rows[i], contexts[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for got, want, context in zip(results, reference, contexts):
        assert_same_predictions(got, want)
        assert statuses(context, 4) == [200] * 4


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


def test_hang_same_image_responses_of_different_lengths(handler: Any, model_dir: Path) -> None:
    # ab saw bodies of different lengths for one image. Cause: oneDNN's kernels differ by
    # batch size, so micro-batches of 1-3 and of 4+ give last-place float differences.
    # Within one micro-batch size the bodies must be byte-identical (anything else would
    # be rows mixed up, not numerics), and across sizes the probabilities within 1e-6.
    rows = jpeg_rows(1, first_seed=300) * 8
    bodies: dict[int, set[str]] = {}
    outputs: dict[int, list[dict[str, float]]] = {}
    size = handler.micro_batching.micro_batch_size
    try:
        for micro_batch_size in (1, 3, 4):
            handler.micro_batching.micro_batch_size = micro_batch_size
            outputs[micro_batch_size] = handler.handle(rows, make_context(model_dir, 8))
            bodies[micro_batch_size] = {
                json.dumps(o, indent=2)
                for o in outputs[micro_batch_size]  # as TorchServe
            }
    finally:
        handler.micro_batching.micro_batch_size = size
    assert len(bodies[1]) == len(bodies[4]) == 1
    assert len(bodies[3]) <= 2  # 3 + 3 + 2: two sizes in one batch
    for got in outputs[1] + outputs[3]:
        assert list(got) == list(outputs[4][0])  # same top-5 labels, same order
        assert list(got.values()) == pytest.approx(list(outputs[4][0].values()), abs=1e-6)


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
        # Measured on the corpus (benchmarks/decoder_accuracy.py): max 0.07, mean 0.01.
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
