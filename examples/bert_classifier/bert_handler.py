"""A BERT sequence classifier with micro-batching: text in, a label and its scores out.

``initialize`` loads the tokenizer and the model with ``from_pretrained(model_dir)`` (the
.mar's root holds what ``save_pretrained`` wrote) and ends with ``start_micro_batching``:
``BaseHandler.initialize`` wants a serialized .pt/.pth file, which such a model has not.
So it also reads TorchServe's ``pt2: {compile: {enable: true, ...}}`` section itself
(``BaseHandler.initialize`` is where TorchServe would): without that a compiled config
served the eager model, silently.

Each row is one text: a plain ``/predictions`` body (raw UTF-8, or JSON ``{"text": ...}``),
a KServe v1 instance (a string, or ``{"text": ...}``) or a v2 BYTES element. Between the
stages passes a dict of tensors (``input_ids``, ``attention_mask``, ``token_type_ids``)
padded to the longest row of the micro-batch, or to the length the pipeline chose for it;
``attention_mask`` keeps padding from changing any row's answer. An empty text, a body
that is not UTF-8 or JSON of another shape gets its own 400; a text over the token limit
its own 413, unless the config says ``truncate: true``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import InvalidInputError, MicroBatchingMixin, PayloadTooLargeError

logger = logging.getLogger(__name__)

# Where item_length leaves a row's token ids for preprocess (a key of the row's dict).
TOKEN_IDS = "_ts_microbatch_token_ids"


class BertClassifierHandler(MicroBatchingMixin, BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        properties = context.system_properties
        model_dir = properties["model_dir"]
        gpu_id = properties.get("gpu_id")
        use_cuda = torch.cuda.is_available() and gpu_id is not None
        self.device = torch.device(f"cuda:{gpu_id}" if use_cuda else "cpu")
        self.manifest = context.manifest
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir)
        model = model.to(self.device).eval()
        config = model.config
        # Compiled before start_micro_batching, which then applies the compiled-model rules.
        self.model = compiled(model, getattr(context, "model_yaml_config", None))
        self.labels = [config.id2label[i] for i in range(config.num_labels)]
        # Positions past the model's table cannot be embedded: the hard limit.
        self.model_max_tokens = min(self.tokenizer.model_max_length, config.max_position_embeddings)
        self.start_micro_batching(context)  # validates the config, starts the stages
        self._token_ids(["."])  # sets the tokenizer's truncation before any stage thread
        self.initialized = True

    # -- lengths -------------------------------------------------------------------

    def limits(self) -> tuple[bool, int]:
        """Whether longer inputs are truncated (else refused), and the longest input
        accepted: the config's ``max_tokens`` and largest ``allowed_sequence_lengths``
        within the model's own limit (the pipeline pads every row to a bucket, so a row
        longer than the largest cannot be served). Read once per config (``item_length``
        runs for every request, before any stage)."""
        config = self.micro_batching.base_config if self.micro_batching else None
        if config is None or getattr(self, "_limits_of", None) is not config:
            buckets = getattr(config, "allowed_sequence_lengths", None) or ()
            configured = [getattr(config, "max_tokens", None), *buckets[-1:]]
            limit = min([n for n in configured if n is not None] + [self.model_max_tokens])
            self._limits = (bool(getattr(config, "truncate", False)), limit)
            self._limits_of = config
        return self._limits

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        truncate, limit = self.limits()
        # Always truncating, at the limit or one past it (a row that long is refused):
        # the tokenizer's settings then never change between calls, which matters because
        # a fast tokenizer changed by one thread while another encodes raises "Already
        # borrowed"; and a huge body is not turned into a huge list of ids.
        encoded = self.tokenizer(
            texts, truncation=True, max_length=limit if truncate else limit + 1
        )
        return encoded["input_ids"]  # type: ignore[no-any-return]

    def item_length(self, item: Any) -> int:
        """The token count of one row as preprocess receives it, [CLS] and [SEP] included:
        after truncation when the config truncates, else at most one past the limit (the
        row is refused: 413). The ids are kept in the row for preprocess: a text is
        tokenized once, not once to be measured and again to be padded."""
        ids = self._token_ids([read_text(item)])[0]
        if isinstance(item, dict):
            item[TOKEN_IDS] = ids
        return len(ids)

    def _ids_of(self, data: list[Any]) -> list[list[int]]:
        """Each row's token ids: measured already (``item_length``), else tokenized now."""
        ids: list[Any] = [row.get(TOKEN_IDS) if isinstance(row, dict) else None for row in data]
        missing = [i for i, row_ids in enumerate(ids) if row_ids is None]
        if missing:
            for i, row_ids in zip(missing, self._token_ids([read_text(data[i]) for i in missing])):
                ids[i] = row_ids
        return ids

    def warmup_input(self, length: int | None = None) -> Any:
        """A request body of about ``length`` tokens (32 words when None), from texts.py."""
        from texts import make_text  # shipped beside the handler in the .mar

        if length is None:
            return {"body": bytearray(make_text(0, 32).encode())}
        words = max(1, length - 2)
        while True:
            text = make_text(0, words)
            count = len(self._token_ids([text])[0])
            if count <= length or words == 1:
                return {"body": bytearray(text.encode())}
            words = max(1, min(words - 1, words * length // count))

    # -- stages --------------------------------------------------------------------

    def preprocess(self, data: list[Any]) -> dict[str, torch.Tensor]:
        ids = self._ids_of(data)
        _, limit = self.limits()
        if any(len(row_ids) > limit for row_ids in ids):
            raise PayloadTooLargeError(
                f"the text is over the limit of {limit} tokens; send a shorter text (or "
                "set micro_batching.truncate: true)"
            )
        info = self.micro_batching.current_micro_batch() if self.micro_batching else None
        padded_length = getattr(info, "padded_length", None)
        width = padded_length if padded_length is not None else max(map(len, ids))
        return pad(ids, width, self.tokenizer.pad_token_id, self.device)

    def inference(self, data: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(**data).logits  # type: ignore[no-any-return]

    def postprocess(self, data: torch.Tensor) -> list[dict[str, Any]]:
        scores = torch.softmax(data.float(), dim=-1).tolist()
        return [
            {"label": self.labels[max(range(len(row)), key=row.__getitem__)], "scores": row}
            for row in scores
        ]


def compiled(model: Any, model_yaml_config: Mapping[str, Any] | None) -> Any:
    """``model`` under ``torch.compile`` when model-config.yaml's ``pt2:`` section says
    ``compile: {enable: true, <torch.compile arguments>}``, as ``BaseHandler.initialize``
    reads it; else ``model``.

    Raises:
        ValueError: a ``pt2:`` section of another form (a backend name, ``export``), which
            this handler does not run: refused at registration rather than served eagerly.
    """
    pt2 = (model_yaml_config or {}).get("pt2")
    if pt2 is None:
        return model
    options = pt2.get("compile") if isinstance(pt2, Mapping) else None
    if not isinstance(options, Mapping) or set(pt2) != {"compile"}:
        raise ValueError(
            f"pt2: got {pt2!r}, expected {{compile: {{enable: true, backend: ..., ...}}}}: the "
            "only form of TorchServe's pt2 section this handler runs"
        )
    if not options.get("enable"):
        return model
    kwargs = {key: value for key, value in options.items() if key != "enable"}
    logger.info("pt2: torch.compile(model, %s)", kwargs)
    return torch.compile(model, **kwargs)


def pad(ids: list[list[int]], width: int, pad_id: int, device: Any) -> dict[str, torch.Tensor]:
    """The model's inputs for rows of token ids, each padded on the right to ``width``."""
    if any(len(row) > width for row in ids):
        raise ValueError(f"a row of {max(map(len, ids))} tokens cannot be padded to {width}")
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention_mask.to(device),
        "token_type_ids": torch.zeros_like(input_ids).to(device),
    }


def read_text(row: Any) -> str:
    """The text of one row: a plain body (bytes, str, or the dict TorchServe parsed from
    JSON), a KServe v1 instance or a v2 BYTES element.

    Raises:
        InvalidInputError: not UTF-8, JSON that is not ``{"text": "<non-empty>"}``, or empty.
    """
    body = row
    if isinstance(row, dict) and ("data" in row or "body" in row):
        body = row["data"] if row.get("data") is not None else row.get("body")
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"the request body is not UTF-8 text ({exc})") from exc
    if isinstance(body, str) and body.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):  # else text that opens with a brace
            body = json.loads(body)
    if isinstance(body, dict):
        text = body.get("text")
        if not isinstance(text, str):
            raise InvalidInputError(
                'a JSON body must be an object {"text": "..."} with the text as a string; '
                f"got keys {sorted(map(str, body))[:5]}"
            )
        body = text
    if not isinstance(body, str):
        raise InvalidInputError(
            f'send the text as the body, or JSON {{"text": "..."}}; got {type(body).__name__}'
        )
    if not body.strip():
        raise InvalidInputError("the text is empty")
    return body
