"""MicroBatchingHandler: TorchServe's ImageClassifier with micro-batching and per-request errors.

Settings, all optional, in the ``handler:`` section of model-config.yaml::

    handler:
      max_image_pixels: 89478485   # width*height above this is answered with 413
      decoder: pil                 # pil: ImageClassifier's own path, bit for bit
                                   # torchvision: libjpeg-turbo decode and uint8 resize, about
                                   # half the CPU per JPEG; each pixel within 1/255 of pil's
                                   # (other formats still go through pil)
                                   # pil-draft: libjpeg decodes the JPEG at 1/2, 1/4 or 1/8
                                   # scale in the DCT domain (PIL's draft), the smallest whose
                                   # short side is still >= 256, then the uint8 resize path:
                                   # for camera photos several times less CPU than pil; not
                                   # exact (benchmarks/dev/decoder_accuracy.py measures how close)
      exif_orientation: true       # turn photos upright as their EXIF orientation tag says
                                   # (phones store them sideways); no-op without the tag, so
                                   # pil stays bit-exact with ImageClassifier for such images

The micro-batching settings come from micro_batching.json and the ``micro_batching:``
section (see ts_microbatch.core.config). A request whose body is empty, is not an image or is
over the pixel limit gets its own 400 or 413; the rest of its batch is answered normally.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import math
import struct
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as TF
from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import ConfigError, InvalidInputError, MicroBatchingMixin, PayloadTooLargeError

logger = logging.getLogger(__name__)

DEFAULT_MAX_IMAGE_PIXELS = 89_478_485  # PIL's own default limit
DECODERS = ("pil", "torchvision", "pil-draft")
RESIZE_TO = 256  # ImageClassifier: Resize(256) then CenterCrop(224)
CROP_TO = 224
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
# What PIL raises for bytes that are not a decodable image (UnidentifiedImageError is an
# OSError; some plugins raise SyntaxError or struct.error on malformed headers).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, struct.error)


def _request_body(row: Any) -> Any:
    body = row.get("data") or row.get("body") if isinstance(row, dict) else row
    if isinstance(body, str):
        try:
            body = base64.b64decode(body, validate=True)
        except binascii.Error as exc:
            raise InvalidInputError("the request body is text but not base64 image data") from exc
    if body is None or (isinstance(body, (bytes, bytearray)) and len(body) == 0):
        raise InvalidInputError("the request body is empty; send an image")
    return body


class MicroBatchingHandler(MicroBatchingMixin, ImageClassifier):  # type: ignore[misc]
    """ImageClassifier whose batches run as a pipeline of micro-batches."""

    max_image_pixels = DEFAULT_MAX_IMAGE_PIXELS
    decoder = "pil"
    exif_orientation = True

    def initialize(self, context: Any) -> None:
        settings = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        self.max_image_pixels = self._read_max_pixels(settings)
        decoder = settings.get("decoder", "pil")
        if decoder not in DECODERS:
            raise ConfigError(
                f"handler.decoder: got {decoder!r}, expected one of {', '.join(DECODERS)}"
            )
        self.decoder = decoder
        exif = settings.get("exif_orientation", True)
        if not isinstance(exif, bool):
            raise ConfigError(f"handler.exif_orientation: got {exif!r}, expected true or false")
        self.exif_orientation = exif
        super().initialize(context)

    def warmup_input(self) -> dict[str, bytearray]:
        """A request for ``micro_batching.warmup`` when no sample file is named: a 640x480
        JPEG of noise, so warm-up runs the same decode path as a request."""
        pixels = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        return {"body": bytearray(out.getvalue())}

    @staticmethod
    def _read_max_pixels(settings: dict[str, Any]) -> int:
        value = settings.get("max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"handler.max_image_pixels: got {value!r}, expected an integer >= 1")
        return value

    def open_image(self, body: bytes | bytearray) -> Image.Image:
        """Reads an image's header (no pixels yet) and enforces the pixel limit."""
        try:
            image = Image.open(io.BytesIO(body))
        except Image.DecompressionBombError as exc:  # over twice PIL's own global limit
            raise PayloadTooLargeError(f"image rejected as a decompression bomb ({exc})") from exc
        except _DECODE_ERRORS as exc:  # not an image, or a header PIL cannot parse
            raise InvalidInputError(f"the request body is not a readable image ({exc})") from exc
        width, height = image.size
        if width * height > self.max_image_pixels:
            raise PayloadTooLargeError(
                f"image of {width}x{height} = {width * height} pixels is over the limit of "
                f"{self.max_image_pixels} pixels (handler.max_image_pixels)"
            )
        return image

    def decode_image(self, body: bytes | bytearray) -> Image.Image:
        """Decodes an image with PIL after checking its size from the header."""
        return self._load_upright_rgb(self.open_image(body))

    def _load_upright_rgb(self, image: Image.Image) -> Image.Image:
        """Decodes the pixels of an opened image, turned upright, in RGB."""
        try:
            image.load()
        except _DECODE_ERRORS as exc:  # truncated or corrupt pixel data
            raise InvalidInputError(f"the image data is corrupt ({exc})") from exc
        if self.exif_orientation:
            image = ImageOps.exif_transpose(image)
        return image.convert("RGB") if image.mode != "RGB" else image

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        images = []
        for row in data:
            body = _request_body(row)
            if isinstance(body, (bytes, bytearray)):
                images.append(self.process_bytes(body))
            else:  # a JSON list of pixel values, as ImageClassifier accepts
                try:
                    images.append(torch.FloatTensor(body))
                except (TypeError, ValueError) as exc:
                    raise InvalidInputError(
                        f"the request body is not an image tensor ({exc})"
                    ) from exc
        return torch.stack(images).to(self.device)

    def process_bytes(self, body: bytes | bytearray) -> torch.Tensor:
        """Image bytes to the normalized 3x224x224 tensor ImageClassifier feeds the model."""
        if self.decoder == "torchvision" and self.open_image(body).format == "JPEG":
            return self._process_jpeg_tensor(body, self.exif_orientation)
        if self.decoder == "pil-draft":
            image = self.open_image(body)
            if image.format == "JPEG":
                return _resize_crop_normalize(self._decode_draft(image))
        return self.image_processing(self.decode_image(body))  # type: ignore[no-any-return]

    def _decode_draft(self, image: Image.Image) -> torch.Tensor:
        """Decodes a JPEG at the largest DCT scale-down (1/2, 1/4, 1/8) that keeps its short
        side at least RESIZE_TO, upright, as a uint8 3xHxW tensor."""
        width, height = image.size
        scale = RESIZE_TO / min(width, height)
        if scale < 1:
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        rgb = self._load_upright_rgb(image)
        return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)

    @staticmethod
    def _process_jpeg_tensor(body: bytes | bytearray, exif_orientation: bool) -> torch.Tensor:
        # libjpeg-turbo decode, then the uint8 resize path.
        try:
            pixels = decode_jpeg(
                torch.frombuffer(bytearray(body), dtype=torch.uint8),
                mode=ImageReadMode.RGB,
                apply_exif_orientation=exif_orientation,
            )
        except RuntimeError as exc:
            raise InvalidInputError(f"the JPEG data is corrupt ({exc})") from exc
        return _resize_crop_normalize(pixels)


def _resize_crop_normalize(pixels: torch.Tensor) -> torch.Tensor:
    # Resize and crop on uint8 before converting to float: four times less memory traffic
    # than PIL's ToTensor-then-normalize order.
    pixels = TF.center_crop(TF.resize(pixels, RESIZE_TO, antialias=True), CROP_TO)
    return TF.normalize(TF.to_dtype(pixels, torch.float32, scale=True), IMAGENET_MEAN, IMAGENET_STD)
