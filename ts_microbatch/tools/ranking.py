"""The tuner's records and tables: each combination measured in-process (``Trial``), the
best few as a real TorchServe measured them (``Confirmed``), ranked and printed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.config import MicroBatchingConfig


@dataclass(frozen=True)
class Trial:
    """One measured combination."""

    micro_batch_size: int
    parallelism: dict[str, int]
    requests_per_s: float
    batch_ms: float
    max_micro_batch_tokens: int | None = None

    def as_config(self, base: MicroBatchingConfig) -> dict[str, Any]:
        settings = base.as_dict()
        settings.update(
            micro_batch_size=self.micro_batch_size,
            parallelism=self.parallelism,
            max_micro_batch_tokens=self.max_micro_batch_tokens,
        )
        return settings


@dataclass(frozen=True)
class Confirmed:
    """A config as measured on a real TorchServe; ``trial`` is None for ``"auto"``, which
    has no in-process measurement."""

    trial: Trial | None
    config: dict[str, Any]
    requests_per_s: float
    p99_ms: float
    errors: int


def threads_of(parallelism: dict[str, int]) -> str:
    return f"{parallelism['preprocess']}/{parallelism['inference']}/{parallelism['postprocess']}"


def print_ranking(ranked: list[Trial]) -> None:
    print(
        "\nrank | micro_batch_size | max_micro_batch_tokens | threads pre/inf/post |"
        " requests/s | ms per batch"
    )
    for rank, t in enumerate(ranked, start=1):
        print(
            f"{rank:4} | {t.micro_batch_size:16} | {t.max_micro_batch_tokens!s:>22} |"
            f" {threads_of(t.parallelism):>20} | {t.requests_per_s:10.1f} | {t.batch_ms:.1f}"
        )


def print_confirmed(confirmed: list[Confirmed], ranked: list[Trial]) -> None:
    print(
        "\nOn TorchServe:\nrank | in-process rank | micro_batch_size | threads pre/inf/post |"
        " requests/s | p99 ms | errors"
    )
    for rank, c in enumerate(confirmed, start=1):
        in_process = "-" if c.trial is None else str(ranked.index(c.trial) + 1)
        parallelism = c.config["parallelism"]
        print(
            f"{rank:4} | {in_process:>15} | {c.config['micro_batch_size']!s:>16} |"
            f" {threads_of(parallelism):>20} | {c.requests_per_s:10.1f} |"
            f" {c.p99_ms:6.0f} | {c.errors}"
        )
