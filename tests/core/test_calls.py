"""StageCalls on their own: padding to an allowed size, cutting back, the output contract."""

from __future__ import annotations

from typing import Any

import pytest

from ts_microbatch import StageOutputError
from ts_microbatch.core.calls import StageCalls
from ts_microbatch.core.metrics import PipelineObserver


def test_padded_stages_see_an_allowed_size_and_the_caller_only_its_items() -> None:
    seen: list[list[Any]] = []

    def last(rows: list[Any]) -> list[Any]:
        seen.append(list(rows))
        return [r * 10 for r in rows]

    calls = StageCalls({"only": last}, allowed_sizes=[4, 2], padded_stages=["only"])
    assert calls.allowed == (2, 4) and calls.size(0, 3) == 4
    assert calls(0, [1, 2, 3], 3, calls.size(0, 3), PipelineObserver()) == [10, 20, 30]
    assert seen == [[1, 2, 3, 3]]  # padded by repeating the last item


def test_the_last_stage_must_return_one_output_per_row() -> None:
    calls = StageCalls({"a": lambda rows: rows, "b": lambda rows: rows[:-1]}, None, None)
    assert calls.size(1, 3) == 3  # no allowed sizes: no padding
    with pytest.raises(StageOutputError, match="stage b returned 2 outputs for 3 requests"):
        calls(1, [1, 2, 3], 3, 3, PipelineObserver())
