"""The two nested sections of the schema that are records of their own: ``warmup`` and
``parallelism`` (``intra_op_threads`` lives beside its mechanism, in ``intra_op``).

Kept apart from ``config`` (the whole schema, its rules across keys, reading the files)
because each checks only its own keys; ``config`` re-exports both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._checks import (
    STAGES,
    YAML_SECTION,
    _check_keys,
    _file_name,
    _per_stage,
    _positive_int,
    _sizes,
)
from .errors import ConfigError


@dataclass(frozen=True)
class WarmupConfig:
    """What to run at load, before the worker is ready: ``iterations`` runs of each size."""

    sizes: tuple[int, ...] | None = None  # None: chosen from the micro-batching config
    iterations: int = 1
    sample: str | None = None  # a file in the model directory; None: the handler's input

    def __post_init__(self) -> None:
        prefix = f"{YAML_SECTION}.warmup"
        _sizes(self.sizes, f"{prefix}.sizes")
        _positive_int(self.iterations, f"{prefix}.iterations")
        _file_name(self.sample, f"{prefix}.sample")

    @classmethod
    def from_mapping(cls, mapping: Any, prefix: str) -> WarmupConfig | None:
        """Builds a WarmupConfig; ``{}`` means the defaults and None no warm-up."""
        if mapping is None:
            return None
        if not isinstance(mapping, Mapping):
            raise ConfigError(
                f"{prefix}: got {mapping!r}, expected a mapping (sizes, iterations, sample) or null"
            )
        _check_keys(mapping, tuple(cls.__dataclass_fields__), prefix)
        return cls(
            sizes=_sizes(mapping.get("sizes"), f"{prefix}.sizes"),
            iterations=_positive_int(mapping.get("iterations", 1), f"{prefix}.iterations"),
            sample=_file_name(mapping.get("sample"), f"{prefix}.sample"),
        )

    def as_dict(self) -> dict[str, Any]:
        sizes = list(self.sizes) if self.sizes is not None else None
        return {"sizes": sizes, "iterations": self.iterations, "sample": self.sample}


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
        values = (base or cls()).as_dict()
        expected = "a mapping of stage to threads"
        return cls(**_per_stage(mapping, prefix, values, _positive_int, expected))

    def as_dict(self) -> dict[str, int]:
        return {stage: getattr(self, stage) for stage in STAGES}
