"""The header reader (ts_microbatch/torchserve/images.py): a body's shape as the handlers
decode it, read from a bounded prefix whatever the body's size.

The handlers decode base64 text with ``base64.b64decode(text)``, TorchServe's
``VisionHandler`` and the detector example alike: line breaks and any other character
outside the alphabet are skipped. These tests send what encoders write (``base64`` and
MIME at 76 columns, PEM at 64, CRLF) and check the reader gives the shape of the raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import io
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import PIL
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image

from tests.torchserve.hostile_headers import (
    PNG_BOMB_CHUNKS_MAX,
    PNG_BOMBS,
    corpus,
    ico_holding_png,
    png,
    png_bomb,
    python_steps,
    structures,
)
from tests.torchserve.images import make_jpeg, padded_to, with_app_segments, wrapped
from ts_microbatch.torchserve.images import (
    HEADER_BYTES_MAX,
    OTHER_BYTES_MAX,
    TEXT_CHARS_MAX,
    image_shape,
)

PHOTO = make_jpeg(7, size=(640, 480))


def handler_shape(text: str) -> tuple[int, int] | None:
    """What the handlers make of ``text``: VisionHandler's ``base64.b64decode`` and
    ``Image.open``."""
    try:
        with Image.open(io.BytesIO(base64.b64decode(text))) as image:
            return image.size
    except Exception:
        return None


@pytest.fixture
def decoded() -> Iterator[list[tuple[int, int]]]:
    """(characters in, bytes out) of every base64 decode while the test runs: the reader
    and ``base64.b64decode`` both go through ``binascii.a2b_base64``."""
    calls: list[tuple[int, int]] = []
    real = binascii.a2b_base64

    def counting(data: Any, *args: Any, **kwargs: Any) -> bytes:
        out = real(data, *args, **kwargs)
        calls.append((len(data), len(out)))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(binascii, "a2b_base64", counting)
        yield calls


@pytest.mark.parametrize(
    ("columns", "newline"),
    [(76, "\n"), (64, "\n"), (76, "\r\n"), (64, "\r\n")],
    ids=["base64-76", "pem-64", "mime-76-crlf", "pem-64-crlf"],
)
@pytest.mark.parametrize("remainder", [0, 1, 2], ids=["no-padding", "pad-2", "pad-1"])
def test_defect_wrapped_base64_lost_its_shape(columns: int, newline: str, remainder: int) -> None:
    # Defect 4: the reader decoded with validate=True, which refuses the line breaks the
    # handler's b64decode skips; the shape became unknown and the photo was padded.
    photo = padded_to(PHOTO, remainder)
    text = wrapped(photo, columns, newline)
    assert handler_shape(text) == (640, 480)  # the scenario: the handler decodes it
    assert image_shape(text) == image_shape(photo) == (640, 480)
    assert image_shape({"data": text}) == image_shape({"body": text}) == (640, 480)


def test_a_data_uri_is_not_an_image_to_the_reader_as_to_the_handlers() -> None:
    # b64decode skips ':', ';' and ',' but decodes "data", "image/jpeg" and "base64" as data:
    # garbage in front of the JPEG, which PIL does not open. No more than the handlers.
    text = "data:image/jpeg;base64," + base64.b64encode(PHOTO).decode("ascii")
    assert handler_shape(text) is None
    assert image_shape(text) is None


def test_the_body_is_found_as_the_handlers_find_it() -> None:
    # VisionHandler reads ``row.get("data") or row.get("body")``: an empty data field
    # falls through to the body.
    text = base64.b64encode(PHOTO).decode("ascii")
    assert image_shape({"data": b"", "body": PHOTO}) == (640, 480)
    assert image_shape({"data": None, "body": text}) == (640, 480)
    assert image_shape({"data": [1, 2, 3]}) is None  # a list: VisionHandler's tensor path


def test_defect_a_non_image_base64_body_was_decoded_in_full(
    decoded: list[tuple[int, int]],
) -> None:
    # Defect 5: 36 MiB of base64 that is not an image was decoded whole (87 MiB allocated,
    # 330-460 ms on the handle thread) just to learn it has no shape.
    text = "QUJD" * (9 << 20)  # 36 MiB of text, "ABC" repeated
    assert image_shape(text) is None
    chars, out = sum(n for n, _ in decoded), sum(n for _, n in decoded)
    assert out <= HEADER_BYTES_MAX and chars <= TEXT_CHARS_MAX, (chars, out)


def test_defect_a_raw_body_was_copied_in_full_to_read_its_header() -> None:
    # TorchServe hands a body over as a bytearray, and io.BytesIO copies a bytearray: the
    # reader held a second copy of every body, 36 MiB for 36 MiB.
    body = bytearray(b"ABC" * (12 << 20))
    tracemalloc.start()
    try:
        assert image_shape(body) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 2 * HEADER_BYTES_MAX, peak


@pytest.mark.parametrize("encode", [bytes, lambda data: wrapped(data, 76)], ids=["raw", "b64"])
def test_a_jpeg_frame_header_behind_big_app_segments_is_read_within_the_cap(
    encode: Any, decoded: list[tuple[int, int]]
) -> None:
    photo = with_app_segments(PHOTO, 600 * 1024)  # SOF past 600 KiB: read, it is within
    assert image_shape(encode(photo)) == (640, 480)
    assert sum(n for _, n in decoded) <= HEADER_BYTES_MAX + 2  # whole groups of 3 bytes


@pytest.mark.parametrize("encode", [bytes, lambda data: wrapped(data, 76)], ids=["raw", "b64"])
def test_a_jpeg_frame_header_beyond_the_cap_leaves_the_shape_unknown(
    encode: Any, decoded: list[tuple[int, int]]
) -> None:
    photo = with_app_segments(PHOTO, HEADER_BYTES_MAX + 1024)
    assert handler_shape(wrapped(photo, 76)) == (640, 480)  # the handler still decodes it
    decoded.clear()
    assert image_shape(encode(photo)) is None
    assert sum(n for _, n in decoded) <= HEADER_BYTES_MAX + 2  # whole groups of 3 bytes


def test_a_small_image_decodes_only_its_header(decoded: list[tuple[int, int]]) -> None:
    big = make_jpeg(3, size=(2000, 1500))
    assert image_shape(wrapped(big, 76)) == (2000, 1500)
    assert sum(n for _, n in decoded) < len(big) // 4  # a few KiB of a photo of hundreds


def encoded(fmt: str, width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, height % 256, 90)).save(out, fmt)
    return out.getvalue()


@pytest.mark.generative
@given(
    fmt=st.sampled_from(["PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF"]),
    width=st.integers(1, 300),
    height=st.integers(1, 300),
    trailing=st.integers(0, 2),
    columns=st.integers(1, 120),
    newline=st.sampled_from(["\n", "\r\n", " ", "\t", "\r\n\r\n"]),
    unwrapped=st.booleans(),
)
@example(fmt="JPEG", width=640, height=480, trailing=0, columns=76, newline="\n", unwrapped=False)
def test_any_wrapping_of_an_image_gives_the_shape_of_its_bytes(
    fmt: str, width: int, height: int, trailing: int, columns: int, newline: str, unwrapped: bool
) -> None:
    data = encoded(fmt, width, height) + b"\0" * trailing
    text = base64.b64encode(data).decode("ascii") if unwrapped else wrapped(data, columns, newline)
    assert handler_shape(text) == (width, height)  # what the handlers decode
    assert image_shape(text) == image_shape(data) == image_shape(bytearray(data))
    assert image_shape(data) == (width, height)


# -- hostile headers (issue 40): bounded in time as well as in bytes -------------------

# Python steps (calls and lines, the reader's and PIL's) to read a JPEG or PNG header: at
# most STEPS_MAX markers or chunks, a few dozen steps each, and PIL's open of the frame.
# The defect stepped through PIL's JPEG reader once per byte: millions for 1 MiB.
HEADER_STEPS_MAX = 20_000
SOI_ZEROS = b"\xff\xd8\xff" + bytes(HEADER_BYTES_MAX - 3)  # as PIL accepts a JPEG


def pil_shape(body: bytes) -> tuple[int, int] | None:
    """What PIL reads from ``body`` given whole, as the handlers give it."""
    try:
        with Image.open(io.BytesIO(body)) as image:
            return image.size
    except Exception:
        return None


@pytest.mark.parametrize("encode", [bytes, lambda data: wrapped(data, 76)], ids=["raw", "b64"])
def test_defect_junk_after_a_jpeg_soi_was_read_a_byte_at_a_time(encode: Any) -> None:
    # Issue 40: a JPEG start-of-image marker then zeros up to the 1 MiB cap; PIL's JPEG
    # reader skipped the zeros one read(1) at a time through a Python file object: 9.5 s
    # to learn the shape is unknown, before the batch's timeout had started.
    body = encode(SOI_ZEROS)
    assert len(SOI_ZEROS) == HEADER_BYTES_MAX and SOI_ZEROS.startswith(b"\xff\xd8\xff")
    shape, steps = python_steps(lambda: image_shape(body), limit=HEADER_STEPS_MAX)
    assert shape is None, shape  # as before: no frame header, unknown
    assert steps <= HEADER_STEPS_MAX


def test_a_frame_header_behind_junk_is_found_as_pil_finds_it() -> None:
    # PIL skips junk between segments; so does the reader, in one memchr.
    photo = make_jpeg(5, size=(320, 240))
    body = photo[:3] + bytes(500_000) + photo[2:]  # SOI, 0xFF, junk, the segments
    assert pil_shape(body) == (320, 240)  # the scenario: PIL reads it
    shape, steps = python_steps(lambda: image_shape(body), limit=HEADER_STEPS_MAX)
    assert shape == (320, 240)


PILLOW_11_REFUSES = {"jpeg-length-one", "jpeg-sof-past-cap"}


def test_defect_an_icon_holding_a_huge_png_was_decoded_to_read_its_shape() -> None:
    # Issue 49: PIL's ICO plugin decodes the largest image to open an icon, so reading the
    # shape of an 11 KB .ico holding a 9400 x 9400 PNG of zeros took ~85 ms of CPU and
    # ~89 MiB per body, before any stage, where the reader promises about a millisecond.
    body = ico_holding_png(9400, 9400)
    assert len(body) < 16 * 1024
    assert pil_shape(body) == (9400, 9400)  # the scenario: PIL opens it (by decoding)
    tracemalloc.start()
    try:
        shape, steps = python_steps(lambda: image_shape(body), limit=HEADER_STEPS_MAX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shape is None  # unknown: its stage's decode answers, inside its deadline
    assert peak <= 2 * len(body), peak


def test_every_hostile_header_gets_the_shape_pil_reads() -> None:
    # The same answer as PIL on the whole body (the handlers' decode), at 64 KiB, where
    # PIL's own slowness is bearable: a shape where it reads one, unknown where it refuses.
    # ICO is never opened (PIL decodes an icon to open it): its shape is unknown here.
    bodies = [(name, body) for name, body in corpus(64 * 1024) if not name.startswith("ICO")]
    assert len(bodies) > 250  # every plugin's magic with each noise, and the structures
    differing = [(name, image_shape(body), pil_shape(body)) for name, body in bodies]
    if int(PIL.__version__.split(".")[0]) < 12:
        # Pillow 11 (the newest for Python 3.9, the official image's) refuses these two
        # JPEGs that Pillow 12 on reads: the reader answers as the newer PIL. A refusal
        # then fails that body at its decode (400), as with the reader's unknown.
        refused = [d for d in differing if d[0] in PILLOW_11_REFUSES]
        assert [(d[1], d[2]) for d in refused] == [((64, 48), None)] * 2
        differing = [d for d in differing if d[0] not in PILLOW_11_REFUSES]
    assert [d for d in differing if d[1] != d[2]] == []
    assert any(shape is not None for _, shape, _ in differing)  # some are images


# What PIL is handed for a PNG: the signature, IHDR cut to its 13 bytes, an empty IDAT, IEND.
PNG_HANDED_BYTES = 8 + 25 + 12 + 12


@pytest.fixture
def handed_to_pil(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """(formats, bytes) of every ``Image.open`` while the test runs."""
    opened: list[tuple[Any, int]] = []
    real = Image.open

    def spying(fp: Any, mode: str = "r", formats: Any = None) -> Any:
        opened.append((formats, len(fp.getbuffer())))
        return real(fp, mode, formats)

    monkeypatch.setattr(Image, "open", spying)
    return opened


def test_pil_parses_no_more_than_a_bounded_header(handed_to_pil: list[tuple[Any, int]]) -> None:
    # What PIL is handed, for the whole corpus at the cap: JPEG only the frame header the
    # walk found; PNG only its IHDR, once the walk reached its image data; WEBP the prefix
    # (libwebp parses it in C); anything else its first OTHER_BYTES_MAX bytes. Once per body.
    limit = {("JPEG",): 64, ("PNG",): PNG_HANDED_BYTES, ("WEBP",): HEADER_BYTES_MAX}
    for name, body in corpus(HEADER_BYTES_MAX):
        handed_to_pil.clear()
        image_shape(body)
        assert len(handed_to_pil) <= 1, name
        for formats, size in handed_to_pil:
            assert size <= limit.get(formats, OTHER_BYTES_MAX), (name, formats, size)


@pytest.mark.parametrize("kind", list(PNG_BOMBS), ids=lambda kind: kind.decode())
def test_defect_pil_inflated_every_ancillary_chunk_of_a_png(
    kind: bytes, handed_to_pil: list[tuple[Any, int]]
) -> None:
    # Review of issue 40: the walk counted a PNG's chunks and, at most STEPS_MAX of them,
    # handed PIL the whole buffer; PIL inflates each iCCP, zTXt and iTXt chunk up to 1 MiB
    # (no limit over the image for iCCP): 254 MiB of inflate for a body of 268 KB.
    body = png_bomb(kind, HEADER_BYTES_MAX)
    first = body.index(kind) + 4 + len(PNG_BOMBS[kind])  # the scenario: 254 chunks, each...
    assert body.count(kind) == PNG_BOMB_CHUNKS_MAX and len(body) < 300_000
    assert len(zlib.decompressobj().decompress(body[first:])) > 1_000_000  # ...~1 MiB
    assert image_shape(body) == (64, 48)
    assert handed_to_pil == [(("PNG",), PNG_HANDED_BYTES)]  # none of the chunks


def test_a_png_whose_ancillary_chunk_pil_refuses_gets_a_shape() -> None:
    # Deliberate: the ancillary chunks are not parsed, so a PNG whose iCCP PIL refuses
    # (compression method 1) gets its IHDR's shape; its decode in the stage fails it, alone.
    body = png((b"iCCP", b"icc\0\x01" + zlib.compress(b"profile")))
    assert pil_shape(body) is None  # the scenario: PIL refuses it
    assert image_shape(body) == (64, 48)


def test_a_png_with_a_second_ihdr_has_no_shape() -> None:
    # Deliberate: PIL takes the last IHDR of several; the reader, which hands PIL the first,
    # gives no shape rather than one the decode does not reach.
    second = (b"IHDR", bytes.fromhex("0000002000000020") + bytes([8, 2, 0, 0, 0]))
    body = png(second)
    assert pil_shape(body) == (32, 32)  # the scenario: PIL reads the second one
    assert image_shape(body) is None


def test_hostile_headers_take_a_bounded_number_of_python_steps() -> None:
    # Structural, not timed: JPEG and PNG headers, walked here, take at most
    # HEADER_STEPS_MAX Python steps whatever the body; any other format takes the same steps
    # for a body of 64 KiB and of 1 MiB, as PIL sees only its first OTHER_BYTES_MAX bytes
    # (or, WEBP, parses it in C). The rest is C over the bounded prefix.
    small = dict(structures(64 * 1024))
    for name, body in structures(HEADER_BYTES_MAX):
        image_shape(body)  # untraced first: a plugin's import is a one-off
        if body[:3] == b"\xff\xd8\xff" or body[:4] == b"\x89PNG":
            python_steps(lambda: image_shape(body), limit=HEADER_STEPS_MAX)  # noqa: B023
            continue
        _, steps = python_steps(lambda: image_shape(body), limit=10 * HEADER_STEPS_MAX)  # noqa: B023
        _, steps_small = python_steps(lambda: image_shape(small[name]), limit=steps + 1)  # noqa: B023
        assert steps == steps_small, (name, steps, steps_small)
