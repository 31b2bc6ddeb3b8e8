"""An image request's width and height, read from its header without decoding it.

What ``shape_groups`` groups images by when the handler defines no ``item_shape``
(``ts_microbatch.core.shapes``). The body is found and decoded as the handlers do it
(TorchServe's ``VisionHandler``, the example detector): ``row.get("data") or
row.get("body")``; bytes or a bytearray are the image; a string is base64 text, decoded as
``base64.b64decode(text)`` decodes it, skipping every character outside the alphabet (the
line breaks, ``\\n`` or ``\\r\\n``, that the ``base64`` command, MIME and PEM encoders write).
A data URI is not special-cased, as the handlers do not: its ``data:image/jpeg;base64,``
decodes to bytes in front of the image, which PIL does not open.

Only a bounded prefix is ever read: PIL opens an image lazily, reading its header only, from
a file that serves at most ``HEADER_BYTES_MAX`` bytes of the image and decodes base64 text
only as far as PIL reads (``_Base64Prefix``). A PNG's size is in its first 33 bytes; a
JPEG's frame header (SOF) comes after its APP segments (EXIF at most 64 KiB, an ICC profile,
XMP), and PIL reads up to the scan header. An image whose header is not within the cap, or
a body that is not an image, has no shape here (None): under ``shape_groups`` it is then cut
into a micro-batch of its own, and the stage that decodes it answers as it answers alone.
Measured on this project's machine (``binascii.a2b_base64`` counted): a body of 36 MiB of
base64 that is not an image had 27 MiB decoded before this bound (87 MiB allocated,
330-460 ms), 6 KiB after (0.1 ms); a JPEG whose frame header sits 1 MiB in, 1 MiB (~5 ms,
less than the stage's own ``b64decode`` of the same body).

The padding at the end of base64 text is not checked (the reader never gets there): text
whose padding is missing, which ``b64decode`` refuses, may get a shape here and its 400
from the stage. The shape is the stored one: an EXIF orientation tag is not applied
(``VisionHandler`` does not apply it either; a handler that turns photos upright defines
``item_shape``).
"""

from __future__ import annotations

import binascii
import io
from collections.abc import Mapping
from typing import IO, Any, cast

# The most bytes of an image read for its header: past a JPEG's EXIF block (64 KiB), an ICC
# profile (a few KiB to ~600 KiB) and XMP in front of its frame header. Beyond it the shape
# is unknown, which costs batching, never an answer.
HEADER_BYTES_MAX = 1 << 20
# The most base64 characters scanned for those bytes: 4 per 3 bytes, plus line breaks (2
# per 64 characters at worst) and room for other characters b64decode skips.
TEXT_CHARS_MAX = 2 * HEADER_BYTES_MAX
# Characters decoded at least per step: PIL reads a header in reads of a few bytes.
_STEP_CHARS = 4096
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SKIPPED = bytes(sorted(set(range(256)) - set(_ALPHABET)))  # what b64decode skips ("=" too)


def image_shape(item: Any) -> tuple[int, int] | None:
    """``item``'s (width, height) from its image header; None when its body is not an
    image PIL can open from its first ``HEADER_BYTES_MAX`` bytes (the stage that decodes it
    reports what is wrong)."""
    body = item.get("data") or item.get("body") if isinstance(item, Mapping) else item
    if isinstance(body, str):
        return _shape(_Base64Prefix(body))
    if isinstance(body, (bytes, bytearray)):
        return _shape(_BytesPrefix(body))
    return None  # a list or a tensor: the handlers' tensor path, no image header


def _shape(prefix: _Prefix) -> tuple[int, int] | None:
    from PIL import Image  # the handler's dependency, loaded only when shapes are read

    try:
        with prefix, Image.open(cast(IO[bytes], prefix)) as image:
            width, height = image.size
    except Exception:  # not an image, a header past the cap, text b64decode refuses
        return None
    return (int(width), int(height))


class _Prefix(io.RawIOBase):
    """The first ``HEADER_BYTES_MAX`` bytes of an image as a file PIL reads: reads past
    them find the end of the file."""

    def __init__(self) -> None:
        super().__init__()
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence == io.SEEK_END:
            offset += self._available(HEADER_BYTES_MAX)  # the end PIL may see: the cap's
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        self._position = offset
        return offset

    def readinto(self, buffer: Any) -> int:
        # Released before returning: RawIOBase.read shrinks its bytearray after this call.
        with memoryview(buffer) as view:
            end = self._available(self._position + len(view))
            count = max(0, end - self._position)
            view[:count] = self._bytes(self._position, count)
        self._position += count
        return count

    def _available(self, end: int) -> int:
        """How many bytes there are up to ``end`` (capped), making them readable."""
        raise NotImplementedError

    def _bytes(self, start: int, count: int) -> bytes | bytearray:
        raise NotImplementedError


class _BytesPrefix(_Prefix):
    """A raw body, read in place: ``io.BytesIO`` would copy a bytearray, and TorchServe
    hands every body over as one (a 36 MiB body was copied whole to read 600 bytes)."""

    def __init__(self, body: bytes | bytearray) -> None:
        super().__init__()
        self._body = body

    def _available(self, end: int) -> int:
        return min(end, len(self._body), HEADER_BYTES_MAX)

    def _bytes(self, start: int, count: int) -> bytes | bytearray:
        return self._body[start : start + count]


class _Base64Prefix(_Prefix):
    """Base64 text decoded as ``base64.b64decode`` decodes it, as far as it is read: at most
    ``TEXT_CHARS_MAX`` characters are scanned, ``HEADER_BYTES_MAX`` bytes decoded."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text
        self._scanned = 0  # characters of the text consumed
        self._pending = b""  # alphabet characters short of a group of 4
        self._decoded = bytearray()

    def _available(self, end: int) -> int:
        end = min(end, HEADER_BYTES_MAX)
        while len(self._decoded) < end and self._scanned < min(len(self._text), TEXT_CHARS_MAX):
            self._decode_step(end - len(self._decoded))
        return min(end, len(self._decoded))

    def _bytes(self, start: int, count: int) -> bytes | bytearray:
        return self._decoded[start : start + count]

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
