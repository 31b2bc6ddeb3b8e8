"""The micro-batching configuration: one schema for micro_batching.json and model-config.yaml.

Schema (every key optional)::

    micro_batch_size: 4              # integer >= 1, or "auto" (see ts_microbatch.core.autosize)
    min_micro_batch_size: 1          # bounds of "auto"
    max_micro_batch_size: 32
    parallelism:                     # threads per stage, integers >= 1
      preprocess: 2
      inference: 1
      postprocess: 2
    intra_op_threads:                # torch intra-op threads of each stage's threads, set per
      preprocess: 1                  # thread (integers >= 1); null: the process's setting.
      inference: null                # Per-item work gets its parallelism from the stage's
      postprocess: 1                 # threads (ts_microbatch.core.intra_op says why)
    max_queued_micro_batches: 4      # micro-batches waiting between two stages, integer >= 1
    isolate_failures: true           # re-run a failed micro-batch in halves to find bad requests
    timeout_s: null                  # seconds a batch may take before its requests get 504;
                                     # null: 90% of the model's responseTimeout (TorchServe's
                                     # default 120 s), so handle() always answers first
    join_timeout_s: 30               # how long shutdown waits for each stage's threads
    allowed_micro_batch_sizes: null  # e.g. [1, 2, 4, 8]: the only sizes inference sees; a
                                     # micro-batch of another size is padded to the next
                                     # allowed size by repeating its last item, and the padded
                                     # outputs dropped (ts_microbatch.core._padding)
    pad: requests                    # where: "requests" repeats the last request before
                                     # preprocess and drops the padded answers after
                                     # postprocess (any handler); "tensors" pads preprocess's
                                     # output and cuts inference's (the handler declares both
                                     # batch-major; needs warmup, which checks a padded run)
    warmup:                          # run at load, before the worker is ready (null: none)
      sizes: null                    # default: every allowed size a micro-batch can be padded
                                     # to; without allowed sizes, the largest micro-batch
      iterations: 1                  # runs of each size
      sample: null                   # a file in the model directory (shipped in the .mar) whose
                                     # bytes are one request body; null: the handler's own
                                     # synthetic input (warmup_input())
    on_recompile: warn               # a compiled model that recompiles after warm-up: log a
                                     # warning, or "error" to log it as an error
    enabled: true                    # false: the handler runs as without micro-batching
                                     # (preprocess, inference, postprocess on the whole batch,
                                     # in its thread): a baseline to compare with
    order: arrival                   # "length": sort a batch's requests by length before the
                                     # cut, so micro-batches hold similar lengths (text)
    max_micro_batch_tokens: null     # a micro-batch holds items while items x padded length
                                     # stays within this (at least min_micro_batch_size items,
                                     # at most micro_batch_size)
    allowed_sequence_lengths: null   # e.g. [32, 64, 128, 256, 512]: a micro-batch's rows are
                                     # padded to the bucket over its longest (padded_length)
    max_tokens: null                 # the longest input accepted; longer: 413 for that request
                                     # before any stage (also the largest bucket)
    truncate: false                  # true: a longer input is counted at the limit and cut by
                                     # the handler instead of refused
                                     # (lengths: the handler's item_length, default body size;
                                     # ts_microbatch.core.lengths)
    shape_groups: null               # images of different sizes (ts_microbatch.core.shapes):
                                     # "exact" micro-batches of one width and height (each
                                     # image computed as alone by a model that pads a batch
                                     # to its largest); "orientation" landscape, portrait or
                                     # square; n (pixels) width and height rounded up to
                                     # multiples of n. Shapes: the handler's item_shape, by
                                     # default read from each image's header; an image of
                                     # unknown shape runs in a micro-batch of its own
    max_micro_batch_pixels: null     # a micro-batch holds images while rows x widest width
                                     # x tallest height stays within this
    metrics_interval_s: 1            # the pipeline's metric lines: one line per metric and
                                     # interval (a mean, or for counters a sum), so a busy
                                     # worker writes a few lines a second; 0: one line per
                                     # micro-batch and stage; at most 3600 (torchserve.metrics)
    freeze_gc: true                  # gc.freeze() once loaded and warmed: full collections
                                     # skip the model's objects (torchserve._gc says why)
    kserve: auto                     # which bodies are KServe requests (torchserve.kserve):
                                     # "auto" only a body of the strict single-input OIP v2
                                     # shape ({"inputs": [{"name", "shape", "datatype",
                                     # "data"}]}, exactly one input); true also
                                     # {"instances": ...} (v1) and any {"inputs": ...} (the KServe
                                     # bundle sets it); false none: every body is the handler's
    max_window_ms: 5                 # kept for compatibility, no effect: continuous
    max_latency_ms: null             # micro-batching, which read them, was removed (the
                                     # asynchronous worker runs each call's requests through
                                     # the pipeline as handle() does; docs/continuous.md).
                                     # Still checked (a number of ms >= 0; null or > 0);
                                     # set to anything else than these defaults, a warning
                                     # at load names the key

Where both exist, ``micro_batching.json`` in the model directory is read first and the
``micro_batching:`` section of model-config.yaml is applied over it, key by key (and stage
by stage inside ``parallelism`` and ``intra_op_threads``): the YAML is TorchServe's own
model config, so it wins.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# The ``as`` imports are re-exports: the adapter, the pipeline and tests import them from here.
from ._checks import _FIELD_CHECKS, MicroBatchSize, _check_keys, _sizes
from ._checks import ON_RECOMPILE as ON_RECOMPILE
from ._checks import STAGES as STAGES
from ._checks import YAML_SECTION as YAML_SECTION
from ._checks import _positive_int as _positive_int
from ._checks import check_micro_batch_size as check_micro_batch_size
from ._padding import padded_size
from ._sections import Parallelism as Parallelism
from ._sections import WarmupConfig as WarmupConfig
from .errors import ConfigError
from .intra_op import IntraOpThreads
from .lengths import LengthRule
from .shapes import ShapeRule

logger = logging.getLogger(__name__)

CONFIG_FILE_NAME = "micro_batching.json"
# Keys of continuous micro-batching (removed: docs/continuous.md says why), kept so the
# configs that set them still load; checked as before, read by nothing.
NO_EFFECT_KEYS: tuple[str, ...] = ("max_window_ms", "max_latency_ms")


@dataclass(frozen=True)
class MicroBatchingConfig:
    """Validated micro-batching settings; built by :meth:`from_mapping` or :func:`load_config`."""

    micro_batch_size: MicroBatchSize = 1
    min_micro_batch_size: int = 1
    max_micro_batch_size: int = 32
    parallelism: Parallelism = field(default_factory=Parallelism)
    intra_op_threads: IntraOpThreads = field(default_factory=IntraOpThreads)
    max_queued_micro_batches: int = 4
    isolate_failures: bool = True
    timeout_s: float | None = None
    join_timeout_s: float = 30.0
    allowed_micro_batch_sizes: tuple[int, ...] | None = None
    pad: str = "requests"
    warmup: WarmupConfig | None = None
    on_recompile: str = "warn"
    kserve: bool | str = "auto"  # "auto" | True | False: see ts_microbatch.torchserve.kserve
    metrics_interval_s: float = 1.0
    freeze_gc: bool = True
    enabled: bool = True
    order: str = "arrival"
    max_micro_batch_tokens: int | None = None
    allowed_sequence_lengths: tuple[int, ...] | None = None
    max_tokens: int | None = None
    truncate: bool = False
    shape_groups: str | int | None = None
    max_micro_batch_pixels: int | None = None
    max_window_ms: float = 5.0  # no effect (NO_EFFECT_KEYS)
    max_latency_ms: float | None = None  # no effect (NO_EFFECT_KEYS)

    def __post_init__(self) -> None:
        if not isinstance(self.parallelism, Parallelism):
            raise ConfigError(
                f"{YAML_SECTION}.parallelism: got {self.parallelism!r}, expected Parallelism"
            )
        if not isinstance(self.intra_op_threads, IntraOpThreads):
            raise ConfigError(
                f"{YAML_SECTION}.intra_op_threads: got {self.intra_op_threads!r}, "
                "expected IntraOpThreads"
            )
        if self.warmup is not None and not isinstance(self.warmup, WarmupConfig):
            raise ConfigError(f"{YAML_SECTION}.warmup: got {self.warmup!r}, expected WarmupConfig")
        for name, check in _FIELD_CHECKS.items():
            check(getattr(self, name), f"{YAML_SECTION}.{name}")
        # Sorted however the config was built: padding and warm-up pick the next size up.
        allowed = _sizes(self.allowed_micro_batch_sizes, "allowed_micro_batch_sizes")
        object.__setattr__(self, "allowed_micro_batch_sizes", allowed)
        buckets = _sizes(self.allowed_sequence_lengths, "allowed_sequence_lengths")
        object.__setattr__(self, "allowed_sequence_lengths", buckets)
        if self.min_micro_batch_size > self.max_micro_batch_size:
            raise ConfigError(
                f"{YAML_SECTION}.min_micro_batch_size: got {self.min_micro_batch_size}, expected "
                f"at most max_micro_batch_size ({self.max_micro_batch_size})"
            )
        self._check_allowed_sizes()
        self._check_lengths()

    def _check_lengths(self) -> None:
        buckets, limit = self.allowed_sequence_lengths, self.max_tokens
        if buckets is not None and limit is not None and limit > buckets[-1]:
            raise ConfigError(
                f"{YAML_SECTION}.max_tokens: got {limit}, expected at most the largest of "
                f"allowed_sequence_lengths ({buckets[-1]}), or {YAML_SECTION}."
                f"allowed_sequence_lengths: got {list(buckets)}, expected one >= max_tokens"
            )
        if self.truncate and buckets is None and limit is None:
            raise ConfigError(
                f"{YAML_SECTION}.truncate: got true without max_tokens or "
                "allowed_sequence_lengths: there is no length to truncate to"
            )
        if self.shape_rule(lambda item: None) is not None and self.length_rule(len) is not None:
            raise ConfigError(
                f"{YAML_SECTION}.shape_groups: set with a length setting (order: length, "
                "max_micro_batch_tokens, allowed_sequence_lengths or max_tokens): lengths are "
                "for text, shapes for images; set one"
            )

    def shape_rule(self, measure: Callable[[Any], Any]) -> ShapeRule | None:
        """How images are grouped and cut, with ``measure`` giving one item's (width,
        height); None when no shape setting is on."""
        if self.shape_groups is None and self.max_micro_batch_pixels is None:
            return None
        return ShapeRule(
            measure,
            self.shape_groups,
            self.max_micro_batch_pixels,
            self.min_micro_batch_size,
            self.allowed_micro_batch_sizes,
        )

    def length_rule(self, measure: Callable[[Any], int]) -> LengthRule | None:
        """How items are measured, refused, ordered and cut, with ``measure`` giving one
        item's length; None when no length setting is on (arrival order, fixed sizes)."""
        if (
            self.order == "arrival"
            and self.max_micro_batch_tokens is None
            and self.allowed_sequence_lengths is None
            and self.max_tokens is None
        ):
            return None
        return LengthRule(
            measure,
            self.order,
            self.max_micro_batch_tokens,
            self.allowed_sequence_lengths,
            self.max_tokens,
            self.truncate,
            self.min_micro_batch_size,
            self.allowed_micro_batch_sizes,
        )

    def _check_allowed_sizes(self) -> None:
        allowed = self.allowed_micro_batch_sizes
        key = f"{YAML_SECTION}.allowed_micro_batch_sizes"
        if allowed is not None and self.micro_batch_size == "auto":
            lo, hi = self.min_micro_batch_size, self.max_micro_batch_size
            if not any(lo <= n <= hi for n in allowed):
                raise ConfigError(
                    f"{key}: got {list(allowed)}, expected at least one size within "
                    f'min_micro_batch_size..max_micro_batch_size ({lo}..{hi}) for "auto"'
                )
        else:
            check_micro_batch_size(self.micro_batch_size, allowed)
        if allowed is not None and self.pad == "tensors" and self.warmup is None:
            raise ConfigError(
                f"{YAML_SECTION}.pad: got 'tensors' without warmup: padding tensors is checked "
                "at load against unpadded answers (a flat tensor whose length equals the "
                "micro-batch size would be padded wrongly); add warmup: {} or use pad: requests"
            )
        sizes = self.warmup.sizes if self.warmup is not None else None
        if allowed is not None and sizes is not None and not set(sizes) <= set(allowed):
            extra = sorted(set(sizes) - set(allowed))
            raise ConfigError(
                f"{YAML_SECTION}.warmup.sizes: got {list(sizes)}, but {extra} not in "
                f"allowed_micro_batch_sizes {list(allowed)}: inference never sees those sizes"
            )

    def keys_without_effect(self) -> list[str]:
        """The keys of ``NO_EFFECT_KEYS`` set to other than their default, in schema order."""
        default = MicroBatchingConfig()
        return [key for key in NO_EFFECT_KEYS if getattr(self, key) != getattr(default, key)]

    def largest_micro_batch(self) -> int:
        """The most requests one micro-batch can hold."""
        if isinstance(self.micro_batch_size, int):
            return self.micro_batch_size
        allowed = self.allowed_micro_batch_sizes
        if allowed is None:
            return self.max_micro_batch_size
        return max(n for n in allowed if n <= self.max_micro_batch_size)

    def padded_check_size(self, sizes: tuple[int, ...]) -> int | None:
        """A number of items that gets padded to one of ``sizes`` (sizes warm-up ran, so the
        check compiles nothing new), for warm-up to check padding with; None if none does."""
        allowed = self.allowed_micro_batch_sizes
        if allowed is None:
            return None
        for size in sorted(sizes, reverse=True):
            if size > 1 and size - 1 not in allowed and self.padded_size(size - 1) == size:
                return size - 1
        return None

    def padded_size(self, n: int) -> int:
        """The size inference sees for a micro-batch of ``n`` requests."""
        return padded_size(self.allowed_micro_batch_sizes, n)

    def warmup_sizes(self, length: int | None = None) -> tuple[int, ...]:
        """The sizes warm-up runs: the configured ones, else every size inference can see
        (with allowed sizes), else the largest micro-batch. With ``length`` (a bucket) and a
        fixed token budget, only the sizes a micro-batch of that length can be cut to."""
        if self.warmup is not None and self.warmup.sizes is not None:
            return self.warmup.sizes
        largest = self.largest_micro_batch()
        rule = self.length_rule(lambda item: 0)  # measures nothing: only its formulas
        if length is not None and rule is not None and self.micro_batch_size != "auto":
            largest = rule.most_items(length, largest)  # the cut's own formula
        if self.allowed_micro_batch_sizes is None:
            return (largest,)
        # A batch of one request is a micro-batch of one, whatever the size in force.
        ceiling, floor = self.padded_size(largest), self.padded_size(1)
        return tuple(n for n in self.allowed_micro_batch_sizes if floor <= n <= ceiling)

    @classmethod
    def from_mapping(
        cls, mapping: Any, base: MicroBatchingConfig | None = None, prefix: str = YAML_SECTION
    ) -> MicroBatchingConfig:
        """Validates ``mapping`` and applies it over ``base`` (the defaults when None).

        Raises:
            ConfigError: naming the first bad key, the value given and what is allowed.
        """
        base = base or cls()
        if mapping is None:
            return base
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"{prefix}: got {mapping!r}, expected a mapping")
        _check_keys(mapping, tuple(cls.__dataclass_fields__), prefix)
        changes: dict[str, Any] = {}
        for name, value in mapping.items():
            if name == "parallelism":
                value = Parallelism.from_mapping(value, f"{prefix}.parallelism", base.parallelism)
            elif name == "intra_op_threads":
                value = IntraOpThreads.from_mapping(
                    value, f"{prefix}.intra_op_threads", base.intra_op_threads
                )
            elif name == "warmup":
                value = WarmupConfig.from_mapping(value, f"{prefix}.warmup")
            elif name in ("allowed_micro_batch_sizes", "allowed_sequence_lengths"):
                value = _sizes(value, f"{prefix}.{name}")
            else:
                _FIELD_CHECKS[name](value, f"{prefix}.{name}")
            changes[name] = value
        return replace(base, **changes)

    def as_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, (Parallelism, IntraOpThreads, WarmupConfig)):
                value = value.as_dict()
            elif isinstance(value, tuple):
                value = list(value)
            values[name] = value
        return values


def read_json_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads a micro_batching.json file, raising ConfigError with the position of a syntax error."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{os.fspath(path)}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            " (trailing commas are not allowed in JSON)"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"{os.fspath(path)}: cannot read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{os.fspath(path)}: got {type(data).__name__}, expected a JSON object")
    return data


def load_config(
    model_dir: str | os.PathLike[str] | None,
    model_yaml_config: Mapping[str, Any] | None = None,
    base: MicroBatchingConfig | None = None,
) -> MicroBatchingConfig:
    """Loads the config a model ships: micro_batching.json, then model-config.yaml over it.

    Args:
        model_dir: the model directory (``context.system_properties["model_dir"]``); None to skip.
        model_yaml_config: the parsed model-config.yaml (``context.model_yaml_config``).
        base: the settings to start from; the defaults when None.

    Raises:
        ConfigError: naming the file or section, the key, the value and what is allowed.
    """
    config = base or MicroBatchingConfig()
    if model_dir is not None:
        path = os.path.join(os.fspath(model_dir), CONFIG_FILE_NAME)
        if os.path.isfile(path):
            config = MicroBatchingConfig.from_mapping(
                read_json_config(path), config, prefix=f"{CONFIG_FILE_NAME}: {YAML_SECTION}"
            )
            logger.info("Read micro-batching config from %s", path)
    section = (model_yaml_config or {}).get(YAML_SECTION)
    if section is not None:
        config = MicroBatchingConfig.from_mapping(
            section, config, prefix=f"model-config.yaml: {YAML_SECTION}"
        )
    return config
