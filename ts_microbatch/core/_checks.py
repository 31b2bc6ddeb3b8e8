"""Checks of one configured value, wherever it is given: each returns the value typed or
raises ConfigError naming the key, the value and what is expected.

Kept apart from ``config`` (the schema, its rules across keys, reading the files) because
the stages, the stage calls and the pipeline check their arguments with the same functions
and the same messages, without needing the schema. ``_FIELD_CHECKS`` names the check of
each scalar key of the schema.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

from ._padding import PAD_MODES
from .errors import ConfigError
from .lengths import check_order
from .shapes import check_groups

# The section of model-config.yaml, and the first part of every key path in a message.
YAML_SECTION = "micro_batching"
ON_RECOMPILE = ("warn", "error")


def _positive_int(value: Any, key: str) -> int:
    # bool is a subclass of int; `micro_batch_size: true` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: got {value!r}, expected an integer >= 1")
    return value


def _number(value: Any, key: str, *, allow_none: bool, zero: bool, allowed: str) -> float | None:
    """A finite number > 0 (>= 0 with ``zero``), or null where allowed; ``allowed`` says
    which in the error."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)  # `timeout_s: true` is a mistake, not 1
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        raise ConfigError(f"{key}: got {value!r}, expected {allowed}" + (" or null" * allow_none))
    return float(value)


def _positive_seconds(value: Any, key: str, *, allow_none: bool) -> float | None:
    return _number(value, key, allow_none=allow_none, zero=False, allowed="a number > 0")


def _milliseconds(value: Any, key: str, *, allow_none: bool) -> float | None:
    """Milliseconds >= 0 (a window may be 0: never wait), or null where allowed."""
    allowed = "a number of milliseconds >= 0"
    return _number(value, key, allow_none=allow_none, zero=True, allowed=allowed)


MAX_METRICS_INTERVAL_S = 3600.0


def _seconds_or_zero(value: Any, key: str) -> float:
    """0, or seconds up to an hour (a metrics interval: lines held longer are lost at a kill)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_METRICS_INTERVAL_S
    ):
        raise ConfigError(
            f"{key}: got {value!r}, expected a number of seconds from 0 to "
            f"{MAX_METRICS_INTERVAL_S:g}"
        )
    return float(value)


def _check_keys(mapping: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise ConfigError(
            f"{prefix}.{unknown[0]}: unknown key; allowed keys are {', '.join(allowed)}"
        )


STAGES: tuple[str, str, str] = ("preprocess", "inference", "postprocess")


def _per_stage(
    mapping: Any,
    prefix: str,
    base: Mapping[str, Any],
    check: Callable[[Any, str], Any],
    expected: str,
) -> dict[str, Any]:
    """A per-stage section (``parallelism``, ``intra_op_threads``): ``base``'s values with
    each stage the mapping names replaced by its value, checked by ``check``."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{prefix}: got {mapping!r}, expected {expected}")
    _check_keys(mapping, STAGES, prefix)
    values = dict(base)
    for stage, value in mapping.items():
        values[stage] = check(value, f"{prefix}.{stage}")
    return values


# What micro_batch_size holds: requests per micro-batch, or "auto" (ts_microbatch.core.autosize).
MicroBatchSize = Union[int, Literal["auto"]]


def check_micro_batch_size(
    value: Any,
    allowed: Sequence[int] | None = None,
    key: str = f"{YAML_SECTION}.micro_batch_size",
) -> MicroBatchSize:
    """The one check of a micro-batch size, wherever one is given (the config, the
    ``MicroBatching`` setter, ``Pipeline``): "auto", or an integer >= 1 that is at most the
    largest of the ``allowed`` sizes (a micro-batch is padded up to an allowed size, never
    split); returned typed.

    Raises:
        ConfigError: naming ``key``, the value and what is expected.
    """
    if value == "auto":
        return "auto"
    # bool is a subclass of int; `micro_batch_size: true` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'{key}: got {value!r}, expected an integer >= 1 or "auto"')
    if allowed is not None and value > max(allowed):
        # Either setting may be the mistake: the message names both.
        raise ConfigError(
            f"{key}: got {value}, expected at most the largest allowed size ({max(allowed)}), or "
            f"{YAML_SECTION}.allowed_micro_batch_sizes: got {sorted(allowed)}, expected the "
            f"largest to be at least micro_batch_size ({value}): a micro-batch is padded up to "
            "an allowed size, never split"
        )
    return value


def _sizes(value: Any, key: str) -> tuple[int, ...] | None:
    """A list of distinct integers >= 1, returned sorted; None stays None."""
    if value is None:
        return None
    if (
        isinstance(value, (str, bytes, Mapping))
        or not isinstance(value, (list, tuple))
        or not value
    ):
        raise ConfigError(f"{key}: got {value!r}, expected a non-empty list of integers >= 1")
    for index, size in enumerate(value):
        _positive_int(size, f"{key}[{index}]")
    if len(set(value)) != len(value):
        raise ConfigError(f"{key}: got {list(value)!r}, expected distinct sizes")
    return tuple(sorted(value))


def _file_name(value: Any, key: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{key}: got {value!r}, expected a file name")
    return value


def _on_recompile(value: Any, key: str) -> str:
    if value not in ON_RECOMPILE:
        raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(ON_RECOMPILE)}")
    return str(value)


def _pad_mode(value: Any, key: str) -> str:
    if value not in PAD_MODES:
        raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(PAD_MODES)}")
    return str(value)


def _kserve(value: Any, key: str) -> bool | str:
    # Compared by type: 1 == True, and `kserve: 1` is a mistake, not true.
    if value != "auto" and not isinstance(value, bool):
        raise ConfigError(f'{key}: got {value!r}, expected "auto", true or false')
    return value if isinstance(value, bool) else "auto"


def _boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected true or false")
    return value


# One validator per scalar field, shared by direct construction and from_mapping so that
# both report the same message; from_mapping passes the key path of the file it read.
_FIELD_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "micro_batch_size": lambda v, k: check_micro_batch_size(v, None, k),
    "min_micro_batch_size": _positive_int,
    "max_micro_batch_size": _positive_int,
    "max_queued_micro_batches": _positive_int,
    "isolate_failures": _boolean,
    "freeze_gc": _boolean,
    "timeout_s": lambda v, k: _positive_seconds(v, k, allow_none=True),
    "join_timeout_s": lambda v, k: _positive_seconds(v, k, allow_none=False),
    "allowed_micro_batch_sizes": _sizes,
    "pad": _pad_mode,
    "on_recompile": _on_recompile,
    "kserve": _kserve,
    "metrics_interval_s": _seconds_or_zero,
    "enabled": _boolean,
    "order": check_order,
    "max_micro_batch_tokens": lambda v, k: None if v is None else _positive_int(v, k),
    "allowed_sequence_lengths": _sizes,
    "max_tokens": lambda v, k: None if v is None else _positive_int(v, k),
    "truncate": _boolean,
    "shape_groups": check_groups,
    "max_micro_batch_pixels": lambda v, k: None if v is None else _positive_int(v, k),
    "max_window_ms": lambda v, k: _milliseconds(v, k, allow_none=False),
    "max_latency_ms": lambda v, k: _number(
        v, k, allow_none=True, zero=False, allowed="a number of milliseconds > 0"
    ),
}
