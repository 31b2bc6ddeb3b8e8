"""The micro-batching configuration: one schema for micro_batching.json and model-config.yaml.

Schema (every key optional)::

    micro_batch_size: 4              # integer >= 1, or "auto" (see ts_microbatch.autosize)
    min_micro_batch_size: 1          # bounds of "auto"
    max_micro_batch_size: 32
    parallelism:                     # threads per stage, integers >= 1
      preprocess: 2
      inference: 1
      postprocess: 2
    max_queued_micro_batches: 4      # micro-batches waiting between two stages, integer >= 1
    isolate_failures: true           # re-run a failed micro-batch in halves to find bad requests
    timeout_s: null                  # seconds a batch may take before its requests get 504
    join_timeout_s: 30               # how long shutdown waits for each stage's threads

Where both exist, ``micro_batching.json`` in the model directory is read first and the
``micro_batching:`` section of model-config.yaml is applied over it, key by key (and stage
by stage inside ``parallelism``): the YAML is TorchServe's own model config, so it wins.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ConfigError

logger = logging.getLogger(__name__)

STAGES: tuple[str, str, str] = ("preprocess", "inference", "postprocess")
CONFIG_FILE_NAME = "micro_batching.json"
YAML_SECTION = "micro_batching"


def _positive_int(value: Any, key: str) -> int:
    # bool is a subclass of int; `micro_batch_size: true` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: got {value!r}, expected an integer >= 1")
    return value


def _positive_seconds(value: Any, key: str, *, allow_none: bool) -> float | None:
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        allowed = "a number > 0 or null" if allow_none else "a number > 0"
        raise ConfigError(f"{key}: got {value!r}, expected {allowed}")
    return float(value)


def _check_keys(mapping: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise ConfigError(
            f"{prefix}.{unknown[0]}: unknown key; allowed keys are {', '.join(allowed)}"
        )


def _size_or_auto(value: Any, key: str) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'{key}: got {value!r}, expected an integer >= 1 or "auto"')
    return value


def _boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected true or false")
    return value


# One validator per scalar field, shared by direct construction and from_mapping so that
# both report the same message; from_mapping passes the key path of the file it read.
_FIELD_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "micro_batch_size": _size_or_auto,
    "min_micro_batch_size": _positive_int,
    "max_micro_batch_size": _positive_int,
    "max_queued_micro_batches": _positive_int,
    "isolate_failures": _boolean,
    "timeout_s": lambda v, k: _positive_seconds(v, k, allow_none=True),
    "join_timeout_s": lambda v, k: _positive_seconds(v, k, allow_none=False),
}


@dataclass(frozen=True)
class Parallelism:
    """Number of threads for each pipeline stage."""

    preprocess: int = 1
    inference: int = 1
    postprocess: int = 1

    def __post_init__(self) -> None:
        for stage in STAGES:
            _positive_int(getattr(self, stage), f"{YAML_SECTION}.parallelism.{stage}")

    @classmethod
    def from_mapping(
        cls,
        mapping: Any,
        prefix: str = f"{YAML_SECTION}.parallelism",
        base: Parallelism | None = None,
    ) -> Parallelism:
        """Builds a Parallelism from a mapping of stage name to thread count, over ``base``."""
        if not isinstance(mapping, Mapping):
            raise ConfigError(f"{prefix}: got {mapping!r}, expected a mapping of stage to threads")
        _check_keys(mapping, STAGES, prefix)
        values = (base or cls()).as_dict()
        for stage, threads in mapping.items():
            values[stage] = _positive_int(threads, f"{prefix}.{stage}")
        return cls(**values)

    def as_dict(self) -> dict[str, int]:
        return {stage: getattr(self, stage) for stage in STAGES}


@dataclass(frozen=True)
class MicroBatchingConfig:
    """Validated micro-batching settings; built by :meth:`from_mapping` or :func:`load_config`."""

    micro_batch_size: int | str = 1
    min_micro_batch_size: int = 1
    max_micro_batch_size: int = 32
    parallelism: Parallelism = field(default_factory=Parallelism)
    max_queued_micro_batches: int = 4
    isolate_failures: bool = True
    timeout_s: float | None = None
    join_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.parallelism, Parallelism):
            raise ConfigError(
                f"{YAML_SECTION}.parallelism: got {self.parallelism!r}, expected Parallelism"
            )
        for name, check in _FIELD_CHECKS.items():
            check(getattr(self, name), f"{YAML_SECTION}.{name}")
        if self.min_micro_batch_size > self.max_micro_batch_size:
            raise ConfigError(
                f"{YAML_SECTION}.min_micro_batch_size: got {self.min_micro_batch_size}, expected "
                f"at most max_micro_batch_size ({self.max_micro_batch_size})"
            )

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
            else:
                _FIELD_CHECKS[name](value, f"{prefix}.{name}")
            changes[name] = value
        return replace(base, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "micro_batch_size": self.micro_batch_size,
            "min_micro_batch_size": self.min_micro_batch_size,
            "max_micro_batch_size": self.max_micro_batch_size,
            "parallelism": self.parallelism.as_dict(),
            "max_queued_micro_batches": self.max_queued_micro_batches,
            "isolate_failures": self.isolate_failures,
            "timeout_s": self.timeout_s,
            "join_timeout_s": self.join_timeout_s,
        }


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
