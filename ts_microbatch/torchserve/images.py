"""An image request's width and height, read from its header without decoding it.

What ``shape_groups`` groups images by when the handler defines no ``item_shape``
(``ts_microbatch.core.shapes``). A shape read here is the size PIL reads from the same
bytes, as stored (an EXIF orientation is not applied; ``VisionHandler`` does not apply it
either, and a handler that turns photos upright defines ``item_shape``). A body with no
shape here (not an image, a header past the bounds below, a format read only from its
first bytes) has None: under ``shape_groups`` it is cut into a micro-batch of its own, and
the stage that decodes it answers as it answers alone.

A body's way through this module, top to bottom:

1. **The body's bytes** (``image_shape``), found as the handlers find them (TorchServe's
   ``VisionHandler``, the example detector): ``row.get("data") or row.get("body")``. Bytes
   or a bytearray are the image, its first ``HEADER_BYTES_MAX`` copied once (``_prefix``).
   A string is base64 text, decoded as ``base64.b64decode(text)`` decodes it (``_Base64``),
   skipping every character outside the alphabet (the line breaks, ``\\n`` or ``\\r\\n``,
   that the ``base64`` command, MIME and PEM encoders write): 64 KiB first, the rest of the
   cap only when the header needs it. A data URI is not special-cased, as the handlers do
   not: its ``data:image/jpeg;base64,`` decodes to bytes in front of the image, which PIL
   does not open. The padding at the end of the text is not checked (the reader never gets
   there): text whose padding is missing, which ``b64decode`` refuses, may get a shape here
   and its 400 from the stage.
2. **The format** (``_shape``), from the first bytes. JPEG and PNG are walked here, since
   their frame headers legitimately sit hundreds of KiB in, past metadata (``_jpeg_frame``,
   ``_png_header``: what each checks and skips is in its docstring), down to a few dozen
   bytes holding the frame header alone. WEBP is handed over as read (libwebp demuxes it in
   C). ICO is never opened (PIL decodes an icon's largest image to open it: ``_ICO_SIGNATURE``).
   Any other format is handed over as its first ``OTHER_BYTES_MAX`` bytes: its header
   sits at the start (BMP, GIF's screen, TGA; a TIFF whose directory lies past them, or a
   GIF whose first frame does, has no shape here).
3. **PIL confirms** (``_confirm``): the size it reads from those bytes with that format's
   plugin alone, and its decompression-bomb limit. PIL is the decoder the handlers run, and
   it refuses headers a size parser of our own would accept (12-bit frames, 2-layer frames,
   bombs): its verdict on the frame header is the one the stage will reach.

**Bounded in bytes and in time, before any stage runs** (issue 40). At most, each enforced
where its constant is used:

- the bytes of a body read into memory: ``HEADER_BYTES_MAX`` (``_prefix``, ``_Base64``);
- the base64 characters scanned for them: ``TEXT_CHARS_MAX`` (``_Base64.decode``);
- the JPEG markers and DQT tables, or PNG chunks, walked: ``STEPS_MAX`` (``_jpeg_frame``,
  ``_dqt_tables``, ``_png_header``), and the fill bytes before one JPEG marker:
  ``_FILL_BYTES_MAX`` (``_jpeg_marker``);
- the bytes PIL parses: a few dozen for a JPEG or PNG (the frame header alone), the bytes
  read for WEBP, ``OTHER_BYTES_MAX`` for any other format (``_shape``).

Time follows: a step of a walk is a C-speed ``find``, regular expression, slice or CRC over
the bounded buffer, and PIL parses a few dozen bytes of a JPEG or PNG. PIL cannot be given
the buffer as it is: its JPEG reader skips junk after a start-of-image marker one byte per
step (a JPEG SOI marker then 1 MiB of zeros: 9.5 s through the file object this module used
to give PIL, 0.5-0.9 s on a ``BytesIO``), its PNG reader takes a step per chunk (12 bytes
each) and inflates every iCCP, zTXt and iTXt chunk up to 1 MiB (254 such chunks of about
1 KiB: 254 MiB of inflate for a body of 268 KB), its line and token readers (PPM, XPM, EPS,
IM) a step per byte. The cost (benchmarks/dev/header_cpu.py, docs/failures.md): at most
about a millisecond of CPU per body on the generated corpus of hostile headers; before, up
to seconds.
"""

from __future__ import annotations

import binascii
import io
import re
import zlib
from collections.abc import Mapping
from typing import Any

# The most bytes of an image read for its header: past a JPEG's EXIF block (64 KiB), an ICC
# profile (a few KiB to ~600 KiB) and XMP in front of its frame header. Beyond it the shape
# is unknown, which costs batching, never an answer.
HEADER_BYTES_MAX = 1 << 20
# The most base64 characters scanned for those bytes: 4 per 3 bytes, plus line breaks (2
# per 64 characters at worst) and room for other characters b64decode skips.
TEXT_CHARS_MAX = 2 * HEADER_BYTES_MAX
# The most steps spent walking a header: JPEG markers and DQT tables, PNG chunks. A photo
# has about 10 to 40 (EXIF, MPF, XMP and its extensions, ICC fragments, tables); each costs
# a few microseconds.
STEPS_MAX = 256
# What PIL parses of a format not walked here: its line and token readers take a step per
# byte, about a microsecond each on a BytesIO.
OTHER_BYTES_MAX = 16 * 1024

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PIL's ICO plugin opens an icon by decoding its largest image (IcoImageFile._open calls
# load()): an 11 KB .ico holding a 9400 x 9400 PNG of zeros cost ~85 ms of CPU and ~89 MiB
# to open, per body, before any stage (issue 49). Its shape is unknown here, and its stage's
# decode, inside its request's deadline, answers as it answers alone.
_ICO_SIGNATURE = b"\0\0\1\0"


class _NeedMore(Exception):
    """The header runs past the bytes read so far, and the body has more."""


class _Refused(Exception):
    """What PIL would refuse, or a header past ``STEPS_MAX`` steps."""


# -- 1. the body's bytes -------------------------------------------------------------


def image_shape(item: Any) -> tuple[int, int] | None:
    """``item``'s (width, height) from its image header; None when its body is not an
    image PIL opens from its first ``HEADER_BYTES_MAX`` bytes within ``STEPS_MAX`` steps
    (the stage that decodes it reports what is wrong)."""
    body = item.get("data") or item.get("body") if isinstance(item, Mapping) else item
    if isinstance(body, str):
        return _text_shape(body)
    if isinstance(body, (bytes, bytearray)):
        return _shape(_prefix(body), final=True)
    return None  # a list or a tensor: the handlers' tensor path, no image header


def _prefix(body: bytes | bytearray) -> bytes:
    """The first ``HEADER_BYTES_MAX`` bytes of a raw body, copied once at most (TorchServe
    hands every body over as a bytearray; a 36 MiB body was once copied whole)."""
    if isinstance(body, bytes) and len(body) <= HEADER_BYTES_MAX:
        return body
    with memoryview(body) as view:
        return bytes(view[:HEADER_BYTES_MAX])


def _text_shape(text: str) -> tuple[int, int] | None:
    """Base64 ``text``'s shape: its first ``_FIRST_BYTES`` decoded, then, only when the
    header runs past them, up to ``HEADER_BYTES_MAX``."""
    decoder = _Base64(text)
    try:
        data = decoder.decode(_FIRST_BYTES)
        try:
            return _shape(data, final=decoder.done())
        except _NeedMore:
            return _shape(decoder.decode(HEADER_BYTES_MAX), final=True)
    except (ValueError, _NeedMore):  # text b64decode refuses
        return None


# Base64 text is decoded this far first: a photo's header is within it.
_FIRST_BYTES = 64 * 1024
# Characters decoded at least per step: text of skipped characters takes few steps.
_STEP_CHARS = 4096
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SKIPPED = bytes(sorted(set(range(256)) - set(_ALPHABET)))  # what b64decode skips ("=" too)


class _Base64:
    """Base64 text decoded as ``base64.b64decode`` decodes it, as far as it is asked: at
    most ``TEXT_CHARS_MAX`` characters are scanned, ``HEADER_BYTES_MAX`` bytes decoded."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._scanned = 0  # characters of the text consumed
        self._pending = b""  # alphabet characters short of a group of 4
        self._decoded = bytearray()

    def done(self) -> bool:
        """Whether the bytes decoded so far are all there is (up to the cap)."""
        limit = min(len(self._text), TEXT_CHARS_MAX)
        return self._scanned >= limit or len(self._decoded) >= HEADER_BYTES_MAX

    def decode(self, end: int) -> bytes:
        """The first ``end`` bytes (fewer when the text ends first)."""
        end = min(end, HEADER_BYTES_MAX)
        limit = min(len(self._text), TEXT_CHARS_MAX)
        while len(self._decoded) < end and self._scanned < limit:
            self._decode_step(end - len(self._decoded))
        return bytes(self._decoded[:end])

    def _decode_step(self, wanted_bytes: int) -> None:
        chars = max(_STEP_CHARS, wanted_bytes * 4 // 3 + 4)
        stop = min(self._scanned + chars, len(self._text), TEXT_CHARS_MAX)
        chunk = self._text[self._scanned : stop]
        self._scanned = stop
        if not chunk.isascii():  # b64decode refuses the whole text
            raise ValueError("base64 text with a character outside ASCII")
        # b64decode skips every character outside the alphabet. It also ends the data at a
        # complete padding, where "=" is skipped here: the two differ only past the padding,
        # after the image's last byte, which a header never needs.
        letters = self._pending + chunk.encode("ascii").translate(None, _SKIPPED)
        room = HEADER_BYTES_MAX - len(self._decoded)  # 4 characters decode to 3 bytes
        whole = min(len(letters) - len(letters) % 4, (room + 2) // 3 * 4)
        self._decoded += binascii.a2b_base64(letters[:whole])
        self._pending = letters[whole:]
        if stop == len(self._text) and 1 < len(self._pending) < 4:  # a last, unpadded group
            self._decoded += binascii.a2b_base64(self._pending + b"=" * (4 - len(self._pending)))
        del self._decoded[HEADER_BYTES_MAX:]


# -- 2. the format, 3. PIL confirms --------------------------------------------------


def _shape(data: bytes, *, final: bool) -> tuple[int, int] | None:
    """``data``'s shape; raises _NeedMore when the header runs past it and not ``final``."""
    try:
        if data.startswith(b"\xff\xd8\xff"):  # JPEG: walked to its frame header
            return _confirm(_jpeg_frame(data, final), "JPEG")
        if data.startswith(_PNG_SIGNATURE):  # PNG: walked to its IHDR
            return _confirm(_png_header(data, final), "PNG")
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":  # libwebp demuxes it in C
            if not final and len(data) < HEADER_BYTES_MAX:
                raise _NeedMore
            return _confirm(data, "WEBP")
        if data.startswith(_ICO_SIGNATURE):  # never opened: PIL decodes it to open it
            return None
        if not final and len(data) < OTHER_BYTES_MAX:  # any other: its first bytes
            raise _NeedMore
        return _confirm(data[:OTHER_BYTES_MAX], None)  # bound: PIL's step-per-byte readers
    except _Refused:
        return None


def _confirm(header: bytes, fmt: str | None) -> tuple[int, int] | None:
    """The size PIL reads from ``header`` (bytes whose parsing costs a bounded number of
    steps), with only the plugin ``fmt`` when given; None when PIL refuses it."""
    from PIL import Image  # the handler's dependency, loaded only when shapes are read

    try:
        with Image.open(io.BytesIO(header), formats=None if fmt is None else (fmt,)) as image:
            width, height = image.size
    except Exception:  # not an image, or a bomb (its stage answers 413)
        return None
    return (int(width), int(height))


# -- 2a. JPEG ------------------------------------------------------------------------
# PIL's JpegImageFile._open steps over every byte that is not 0xFF (junk), over 0xFF 0xFF
# (a fill byte before a marker) and 0xFF 0x00 (an escaped 0xFF). Here junk is skipped by one
# bytes.find (memchr); a run of fill bytes by one search, at most _FILL_BYTES_MAX long.
_NOT_FILL = re.compile(rb"[^\xff]")
_FILL_BYTES_MAX = 1024
# PIL's marker table (JpegImagePlugin.MARKER): every byte from 0xC0 is a marker, those below
# are not ("no marker found"); these carry no length and no payload.
_JPEG_BARE = frozenset([0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)])
_JPEG_SOF = frozenset([*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC)])
_JPEG_SOF |= frozenset([*range(0xCD, 0xD0), 0xDE])
_JPEG_SOS, _JPEG_DQT = 0xDA, 0xDB


def _jpeg_frame(data: bytes, final: bool) -> bytes:
    """The JPEG that PIL reads the size of ``data`` from: start-of-image, the last frame
    header before the scan, an empty start-of-scan (PIL then confirms its size, mode and
    the decompression-bomb limit).

    PIL's marker walk replayed in at most ``STEPS_MAX`` steps, past EXIF, ICC and XMP
    segments: junk, fill bytes and escaped 0xFF00 skipped as PIL skips them, the same
    markers refused, a segment cut short by the end refused, and the checks PIL makes on
    the way (each frame header's bits and layers, DQT tables, short JFIF and Adobe
    segments, the ICC fragment index). The metadata PIL parses entry by entry (EXIF, MPF,
    Photoshop resources) is not parsed: a body whose metadata PIL refuses may get a shape,
    and its own decode then fails it, isolated as any item whose decode fails."""
    position, steps, frame, scanned = 2, 0, b"", False
    icc: list[bytes] = []
    while not scanned:
        steps += 1
        if steps > STEPS_MAX:
            raise _Refused  # bound: the time a header may take
        marker, position = _jpeg_marker(data, position)
        if marker < 0:  # the end: PIL stops here and keeps the frame header it has
            if not final:
                raise _NeedMore
            break
        if marker == 0 or marker in _JPEG_BARE:  # an escaped 0xFF, or no payload
            continue
        if marker < 0xC0:
            raise _Refused  # "no marker found"
        payload, position = _jpeg_payload(data, position, final)
        if marker in _JPEG_SOF:
            frame = _jpeg_sof(marker, payload, icc)
            icc = []
        elif marker == _JPEG_DQT:
            steps += _dqt_tables(payload)  # each table counts as a step
        elif marker == 0xE2 and payload.startswith(b"ICC_PROFILE\0"):
            icc.append(payload)
        elif _jpeg_version_short(marker, payload):
            raise _Refused  # PIL reads a version at offset 5
        scanned = marker == _JPEG_SOS
    if not frame:
        raise _Refused  # PIL found no size
    return b"\xff\xd8" + frame + b"\xff\xda\x00\x02"


def _jpeg_marker(data: bytes, position: int) -> tuple[int, int]:
    """The byte after the next 0xFF (and its fill bytes) from ``position``, and where the
    byte after it is; -1 at the end. Refused past _FILL_BYTES_MAX fill bytes."""
    start = data.find(b"\xff", position)
    if start < 0:
        return -1, len(data)
    found = _NOT_FILL.search(data, start, start + _FILL_BYTES_MAX)
    if found is None:
        if start + _FILL_BYTES_MAX < len(data):
            raise _Refused
        return -1, len(data)  # 0xFF to the end
    return data[found.start()], found.end()


def _jpeg_version_short(marker: int, payload: bytes) -> bool:
    """A JFIF (APP0) or Adobe (APP14) segment too short for the version PIL reads."""
    tagged = payload.startswith(b"JFIF") if marker == 0xE0 else payload.startswith(b"Adobe")
    return marker in (0xE0, 0xEE) and tagged and len(payload) < 7


def _jpeg_payload(data: bytes, position: int, final: bool) -> tuple[bytes, int]:
    """A segment's payload and where the next byte is; a segment the end cuts short is
    refused as PIL refuses it (its length unreadable, its payload a truncated read)."""
    if position + 2 > len(data):
        raise _NeedMore if not final else _Refused
    size = int.from_bytes(data[position : position + 2], "big") - 2
    start = position + 2
    if size <= 0:
        return b"", start  # PIL reads nothing and goes on
    if start + size > len(data):
        raise _NeedMore if not final else _Refused
    return data[start : start + size], start + size


def _jpeg_sof(marker: int, payload: bytes, icc: list[bytes]) -> bytes:
    """A frame header as PIL's SOF handler checks it, cut to its components (PIL loops
    over every 3 bytes after them); refused when PIL raises on it."""
    if len(payload) < 6 or payload[0] != 8 or payload[5] not in (1, 3, 4):
        raise _Refused  # short, not 8-bit, or a layer count PIL has no mode for
    if icc and len(min(icc)) < 14:
        raise _Refused  # PIL reads the fragment count of the first fragment, sorted
    kept = payload[: 6 + 3 * payload[5]]
    return bytes([0xFF, marker]) + (len(kept) + 2).to_bytes(2, "big") + kept


def _dqt_tables(payload: bytes) -> int:
    """How many quantization tables ``payload`` holds; refused when the last is cut
    short, as PIL refuses it ("bad quantization table marker")."""
    offset, tables = 0, 0
    while offset < len(payload):
        offset += 65 if payload[offset] < 16 else 129  # 8-bit or 16-bit entries
        tables += 1
        if offset > len(payload) or tables > STEPS_MAX:
            raise _Refused
    return tables


# -- 2b. PNG -------------------------------------------------------------------------

_PNG_KIND = re.compile(rb"\w{4}")  # PIL's is_cid: any other chunk type is refused
# The end of the PNG handed to PIL: an empty IDAT, where PIL stops, and IEND.
_PNG_END = b"".join(bytes(4) + k + zlib.crc32(k).to_bytes(4, "big") for k in (b"IDAT", b"IEND"))


def _png_header(data: bytes, final: bool) -> bytes:
    """The PNG that PIL reads the size of ``data`` from: the signature, the first chunk
    (IHDR) cut to the 13 bytes PIL reads, an empty IDAT (PIL then confirms its size, mode
    and the decompression-bomb limit).

    PIL's chunk walk replayed up to the first IDAT or IEND in at most ``STEPS_MAX`` steps,
    with the checks PIL makes on each chunk (a type of 4 word characters, its data and CRC
    within the body, the CRC right). PIL never sees the ancillary chunks it parses (iCCP,
    zTXt and iTXt inflated up to 1 MiB each, tRNS, gAMA, APNG's frames): a PNG whose
    ancillary chunk PIL refuses (an unknown compression method, a profile or text over
    1 MiB, over 64 MiB of text in all, a short gAMA) may get a shape, and its own decode
    then fails it, isolated as any item whose decode fails. IHDR must be the first chunk
    and the only one, as the PNG specification says (PIL also accepts one later, and takes
    the last of several): otherwise no shape."""
    position, ihdr = 8, b""
    for _ in range(STEPS_MAX):  # bound: the time a header may take
        if position + 8 > len(data):
            break
        kind = data[position + 4 : position + 8]
        if not _PNG_KIND.fullmatch(kind):
            raise _Refused  # "broken PNG file"
        if (kind == b"IHDR") != (position == 8):
            raise _Refused  # IHDR not first, or again (PIL would take the last)
        if kind in (b"IDAT", b"IEND"):  # PIL stops here, before the data and its CRC
            return _PNG_SIGNATURE + ihdr + _PNG_END
        end = position + 8 + int.from_bytes(data[position : position + 4], "big")
        if end + 4 > len(data):
            break  # PIL refuses a chunk the end cuts short
        if zlib.crc32(data[position + 4 : end]) != int.from_bytes(data[end : end + 4], "big"):
            raise _Refused  # "bad header checksum"
        if kind == b"IHDR":
            if end - position < 8 + 13:
                raise _Refused  # "Truncated IHDR chunk"
            kept = b"IHDR" + data[position + 8 : position + 21]
            ihdr = (13).to_bytes(4, "big") + kept + zlib.crc32(kept).to_bytes(4, "big")
        position = end + 4
    else:
        raise _Refused  # STEPS_MAX chunks before IDAT
    if not final:
        raise _NeedMore
    raise _Refused
