"""A generated corpus of hostile image headers, for the header reader's tests and its CPU
benchmark (benchmarks/dev/header_cpu.py): what a client may send to make reading a shape
slow. Each body is built to a given length (the reader's cap, 1 MiB, by default) from a
seeded generator, so a run is reproducible.

- every PIL plugin's magic bytes (and a few header-shaped prefixes of plugins without
  magic: TGA, IM, IMT, SPIDER, PCD) followed by each kind of noise: zeros, 0xFF, random
  bytes, line breaks and spaces (what a line or token reader loops over), ASCII digits;
- JPEG structures PIL walks one step at a time: junk after the start-of-image marker (the
  defect of issue 40), fill bytes, escaped 0xFF00, runs of empty segments, truncated
  markers and lengths, a frame header declaring 65535 x 65535, DQT, Photoshop, EXIF and
  MPF payloads that PIL parses entry by entry;
- PNG, GIF, BMP, WEBP and TIFF headers with huge declared sizes, runs of tiny chunks or
  blocks, lengths past the end, directories of 65535 entries;
- PNG compression bombs: iCCP, zTXt and iTXt chunks of about 1 KiB, each inflating to
  just under the 1 MiB PIL allows a chunk, as many as the reader walks before the IDAT.
"""

from __future__ import annotations

import random
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

# Every registered PIL plugin's magic (Pillow 13: Image.ID), as its _accept checks it.
MAGICS: dict[str, bytes] = {
    "AVIF": b"\0\0\0\x1cftypavif",
    "BLP": b"BLP2",
    "BMP": b"BM",
    "DIB": struct.pack("<I", 40),
    "BUFR": b"BUFR",
    "CUR": b"\0\0\2\0",
    "PCX": b"\x0a\x05\x01\x08",
    "DCX": struct.pack("<I", 987654321),
    "DDS": b"DDS " + struct.pack("<I", 124),
    "EPS": b"%!PS-Adobe-3.0 EPSF-3.0\n",
    "EPS-binary": b"\xc5\xd0\xd3\xc6",
    "FITS": b"SIMPLE  =                    T",
    "FLI": b"\0\0\0\0\x11\xaf",
    "FTEX": b"FTEX",
    "GBR": struct.pack(">II", 28, 2),
    "GIF": b"GIF89a",
    "GRIB": b"GRIB\0\0\0\x01",
    "HDF5": b"\x89HDF\r\n\x1a\n",
    "PNG": b"\x89PNG\r\n\x1a\n",
    "JPEG2000": b"\xff\x4f\xff\x51",
    "JPEG2000-jp2": b"\0\0\0\x0cjP  \r\n\x87\n",
    "ICNS": b"icns",
    "ICO": b"\0\0\1\0",
    "IM": b"Image type: RGB image\r\n",
    "IMT": b"width 1\n",
    "IPTC": b"\x1c\x02",
    "JPEG": b"\xff\xd8\xff",
    "MCIDAS": b"\0\0\0\0\0\0\0\x04",
    "MPEG": b"\0\0\1\xb3",
    "TIFF-le": b"II\x2a\0",
    "TIFF-be": b"MM\0\x2a",
    "BigTIFF": b"II\x2b\0",
    "MSP": b"DanM",
    "PIXAR": b"\x80\xe8\0\0",
    "PPM": b"P6\n",
    "PFM": b"Pf\n",
    "PSD": b"8BPS\0\1",
    "QOI": b"qoif",
    "SGI": b"\x01\xda\x01\x01",
    "SUN": b"\x59\xa6\x6a\x95",
    "TGA": bytes([0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 64, 0, 24, 0]),
    "WEBP": b"RIFF\xff\xff\xff\x7fWEBPVP8X",
    "WMF": b"\xd7\xcd\xc6\x9a\0\0",
    "EMF": b"\x01\0\0\0" + b"\0" * 36 + b" EMF",
    "XBM": b"#define im_width 8\n",
    "XPM": b"/* XPM */\n",
    "XVTHUMB": b"P7 332\n",
    "PCD": b"\0" * 2048 + b"PCD_IPI",
    "SPIDER": struct.pack(">27f", *([1.0] * 27)),
}

NOISES: dict[str, Callable[[random.Random, int], bytes]] = {
    "zeros": lambda rng, n: bytes(n),
    "ff": lambda rng, n: b"\xff" * n,
    "random": lambda rng, n: rng.randbytes(n),
    "lines": lambda rng, n: (b"\n " * (n // 2 + 1))[:n],
    "digits": lambda rng, n: b"9" * n,
}

SOI = b"\xff\xd8"


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">HH", marker, len(payload) + 2) + payload


def _sof(width: int, height: int, layers: int = 3, bits: int = 8) -> bytes:
    components = b"".join(bytes([i + 1, 0x11, 0]) for i in range(layers))
    return _segment(0xFFC0, struct.pack(">BHHB", bits, height, width, layers) + components)


def _repeat(unit: bytes, head: bytes, n: int) -> bytes:
    return (head + unit * ((n - len(head)) // len(unit) + 1))[:n]


def _tiff_ifd(entries: int, little: bool = True) -> bytes:
    order = "<" if little else ">"
    head = (b"II\x2a\0" if little else b"MM\0\x2a") + struct.pack(order + "I", 8)
    entry = struct.pack(order + "HHII", 0x0100, 4, 1, 64)  # ImageWidth, LONG, 1, 64
    return head + struct.pack(order + "H", entries) + entry * entries


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


_IHDR = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 48, 8, 2, 0, 0, 0))
# A deflate stream of about 1 KiB that inflates to just under PIL's MAX_TEXT_CHUNK (1 MiB).
_INFLATES = zlib.compress(bytes((1 << 20) - 1024), 9)
# Each bomb chunk's data before the deflate stream: iCCP a profile name and method 0; zTXt a
# keyword and method 0; iTXt a keyword, compressed, method 0, no language, no keyword.
PNG_BOMBS = {b"iCCP": b"icc\0\0", b"zTXt": b"k\0\0", b"iTXt": b"k\0\x01\0\0\0"}
# IHDR, the bomb chunks and IDAT: the 256 chunks (STEPS_MAX) the reader walks at most.
PNG_BOMB_CHUNKS_MAX = 254


def png(*chunks: tuple[bytes, bytes]) -> bytes:
    """A 64 x 48 RGB PNG: IHDR, the (type, data) ``chunks``, an empty IDAT, IEND."""
    end = _png_chunk(b"IDAT", b"") + _png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + _IHDR + b"".join(_png_chunk(*c) for c in chunks) + end


def png_bomb(kind: bytes, n: int) -> bytes:
    """``png`` of at most ``n`` bytes (about 268 KB at most) with as many ``kind`` chunks as
    fit, PNG_BOMB_CHUNKS_MAX at most."""
    data = PNG_BOMBS[kind] + _INFLATES
    count = min(PNG_BOMB_CHUNKS_MAX, (n - len(png())) // (12 + len(data)))
    return png(*[(kind, data)] * count)


def _exif_ifd(entries: int) -> bytes:
    entry = struct.pack("<HHII", 0x010E, 2, 4, 0x41414141)  # ImageDescription, ASCII "AAAA"
    return b"Exif\0\0II\x2a\0" + struct.pack("<IH", 8, entries) + entry * entries


def structures(n: int) -> Iterator[tuple[str, bytes]]:
    """Hostile structures of ``n`` bytes (most are built to the length; some are short on
    purpose: a truncated marker or length)."""
    yield "jpeg-soi-zeros", SOI + b"\xff" + bytes(n - 3)  # issue 40
    yield "jpeg-soi-ff-ff-zeros", SOI + b"\xff\xff" + bytes(n - 4)
    yield "jpeg-fill-ff", SOI + b"\xff" * (n - 2)
    yield "jpeg-escaped-ff00", _repeat(b"\xff\x00", SOI, n)
    scan = _segment(0xFFDA, bytes(10))
    yield "jpeg-junk-then-sof", SOI + b"\xff" + bytes(n - 65) + _sof(64, 48) + scan
    yield "jpeg-empty-com-run", _repeat(b"\xff\xfe\x00\x02", SOI, n)
    yield "jpeg-empty-app-run", _repeat(b"\xff\xe5\x00\x02", SOI, n)
    yield "jpeg-rst-run", _repeat(b"\xff\xd0", SOI, n)
    yield "jpeg-dri-run", _repeat(_segment(0xFFDD, b"\0\0"), SOI, n)
    yield "jpeg-sof-run", _repeat(_sof(64, 48), SOI, n)
    table = bytes(65)  # one 8-bit table: PIL builds a 64-entry list for each
    dqt = _segment(0xFFDB, table * (65533 // 65))
    yield "jpeg-dqt-tables", _repeat(dqt, SOI, n)
    resource = b"8BIM\x03\xec\0\0" + struct.pack(">I", 0)
    photoshop = _segment(0xFFED, b"Photoshop 3.0\0" + resource * ((65533 - 14) // 12))
    yield "jpeg-photoshop-resources", _repeat(photoshop, SOI, n)
    exif = _segment(0xFFE1, _exif_ifd((65533 - 16) // 12))
    yield "jpeg-exif-entries", SOI + exif + _sof(64, 48) + _segment(0xFFDA, bytes(10))
    mpf_entries = (65533 - 16) // 12
    mpf = b"MPF\0II\x2a\0" + struct.pack("<IH", 8, mpf_entries)
    mpf += struct.pack("<HHII", 0xB001, 4, 1, 2) * mpf_entries
    yield (
        "jpeg-mpf-entries",
        SOI + _segment(0xFFE2, mpf) + _sof(64, 48) + _segment(0xFFDA, bytes(10)),
    )
    yield "jpeg-sof-huge", SOI + _sof(65535, 65535) + _segment(0xFFDA, bytes(10))
    yield "jpeg-sof-zero-width", SOI + _sof(0, 48) + _segment(0xFFDA, bytes(10))
    yield "jpeg-sof-12-bit", SOI + _sof(64, 48, bits=12) + _segment(0xFFDA, bytes(10))
    yield "jpeg-sof-2-layers", SOI + _sof(64, 48, layers=2) + _segment(0xFFDA, bytes(10))
    yield "jpeg-sof-short", SOI + _segment(0xFFC0, b"\x08\0")
    yield "jpeg-truncated-marker", SOI + b"\xff"
    yield "jpeg-truncated-length", SOI + b"\xff\xe0\x00"
    yield "jpeg-length-past-end", SOI + b"\xff\xe0\xff\xff" + bytes(100)
    yield "jpeg-length-one", SOI + b"\xff\xe0\x00\x01" + _sof(64, 48)
    yield "jfif-short", SOI + _segment(0xFFE0, b"JFIF\0") + _sof(64, 48)
    yield "adobe-short", SOI + _segment(0xFFEE, b"Adobe") + _sof(64, 48)
    yield "jpeg-sof-past-cap", SOI + b"\xff" + bytes(n) + _sof(64, 48)
    yield (
        "png-huge-ihdr",
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 0x7FFFFFFF, 0x7FFFFFFF, 8, 2, 0, 0, 0)),
    )
    tiny = _png_chunk(b"teST", b"")
    yield "png-tiny-chunk-run", _repeat(tiny, b"\x89PNG\r\n\x1a\n" + _IHDR, n)
    yield (
        "png-text-chunk-run",
        _repeat(_png_chunk(b"tEXt", b"k\0v"), b"\x89PNG\r\n\x1a\n" + _IHDR, n),
    )
    yield "png-length-past-end", b"\x89PNG\r\n\x1a\n" + _IHDR + b"\xff\xff\xff\xf0teST" + bytes(64)
    for kind in PNG_BOMBS:
        yield f"png-{kind.decode()}-bomb", png_bomb(kind, n)
    yield "png-bad-crc", b"\x89PNG\r\n\x1a\n" + _IHDR[:-4] + b"\0\0\0\0" + bytes(n - 33)
    gif = b"GIF89a" + struct.pack("<HHBBB", 64, 48, 0, 0, 0)
    yield "gif-extension-subblocks", _repeat(b"\x01\x00", gif + b"\x21\xfe", n)
    yield "gif-extension-run", _repeat(b"\x21\xfe\x00", gif, n)
    yield "gif-huge", gif[:6] + struct.pack("<HH", 65535, 65535) + bytes(n - 10)
    bmp = b"BM" + struct.pack("<IHHI", n, 0, 0, 54)
    yield "bmp-huge", bmp + struct.pack("<IiiHH", 40, 0x7FFFFFFF, 0x7FFFFFFF, 1, 24) + bytes(n - 32)
    yield "bmp-header-size-huge", bmp + struct.pack("<I", 0xFFFFFFF0) + bytes(n - 18)
    yield "webp-riff-noise", b"RIFF" + struct.pack("<I", n) + b"WEBPVP8 " + bytes(n - 16)
    yield "tiff-ifd-65535", _tiff_ifd(65535)[:n]
    yield (
        "tiff-ifd-loop",
        b"II\x2a\0"
        + struct.pack("<IH", 8, 1)
        + struct.pack("<HHII", 0x0100, 4, 1, 64)
        + struct.pack("<I", 8)
        + bytes(n - 26),
    )
    yield "tiff-ifd-past-end", b"MM\0\x2a" + struct.pack(">I", 0xFFFFFFF0) + bytes(n - 8)
    yield "ico-many-entries", b"\0\0\1\0\xff\xff" + b"\x40\x40\0\0\1\0\x20\0" + bytes(n - 14)
    yield "eps-one-line", b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: " + b"9" * (n - 39)
    yield "ppm-comment", _repeat(b"#" + b"x" * 60 + b"\n", b"P6\n", n)


def ico_holding_png(width: int, height: int) -> bytes:
    """An .ico whose one entry is a PNG of ``width`` x ``height`` at 1 bit, its IDAT the
    zlib of all-zero rows (issue 49: 11 KB at 9400 x 9400, which PIL decodes to open)."""
    raw = zlib.compress(bytes(1 + (width + 7) // 8) * height, 9)
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    chunks = ((b"IHDR", ihdr), (b"IDAT", raw), (b"IEND", b""))
    image = b"\x89PNG\r\n\x1a\n" + b"".join(_png_chunk(*chunk) for chunk in chunks)
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 1, len(image), 6 + 16)
    return struct.pack("<HHH", 0, 1, 1) + entry + image


def corpus(n: int = 1 << 20, seed: int = 40) -> Iterator[tuple[str, bytes]]:
    """(name, body) of every hostile body, each ``n`` bytes or fewer."""
    rng = random.Random(seed)
    for plugin, magic in MAGICS.items():
        for noise, make in NOISES.items():
            yield f"{plugin}+{noise}", magic + make(rng, max(0, n - len(magic)))
    yield from structures(n)


class StepsExceeded(BaseException):
    """More Python steps than allowed: a BaseException, so no ``except Exception`` in the
    code under test swallows it."""


def python_steps(call: Callable[[], T], limit: int) -> tuple[T, int]:
    """``call()``'s result and how many Python steps it took on this thread (function
    calls and lines, in every module: the reader's and PIL's). Work done in C (memchr, a
    regular expression, a2b_base64, zlib) is not a step; its input is the bounded prefix.
    Raises StepsExceeded past ``limit``, so a reader that steps per byte fails at once."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        if count > limit:
            raise StepsExceeded(f"over {limit} Python steps")
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        result = call()
    finally:
        sys.settrace(previous)
    return result, count
