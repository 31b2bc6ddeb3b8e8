"""Each stage thread runs torch on the intra-op threads its stage is given, and nothing else
in the process changes: the main thread, a stage left alone, and every thread started later
keep the process's setting (``ts_microbatch.core.intra_op``)."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ts_microbatch import ConfigError, Pipeline
from ts_microbatch.core import intra_op

WAIT_S = 10.0  # bound on any wait; a correct pipeline answers in milliseconds


def in_new_thread(function: Callable[[], Any]) -> Any:
    """What ``function`` returns on a thread that never used torch before."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(function()))
    thread.start()
    thread.join(WAIT_S)
    return out[0]


@pytest.fixture
def default_threads() -> int:
    """The process's intra-op threads, as a new thread gets them; the tests below need a
    default above one, else a stage given one thread would look unchanged by chance."""
    default = in_new_thread(torch.get_num_threads)
    if default < 2:
        pytest.skip(f"torch uses {default} intra-op thread by default here: nothing to tell apart")
    return int(default)


def recording(seen: dict[str, set[int]], stage: str) -> Callable[[list[Any]], list[Any]]:
    def call(items: list[Any]) -> list[Any]:
        torch.ones(8).sum()  # a torch operation on this thread, as a real stage runs
        seen.setdefault(stage, set()).add(torch.get_num_threads())
        return items

    return call


def test_each_stage_thread_gets_its_intra_op_threads_and_nothing_else_changes(
    default_threads: int,
) -> None:
    seen: dict[str, set[int]] = {}
    main_before = torch.get_num_threads()
    stages = {name: recording(seen, name) for name in ("decode", "model", "encode")}
    with Pipeline(
        stages,
        micro_batch_size=2,
        parallelism={"decode": 2, "model": 1, "encode": 2},
        intra_op_threads={"decode": 1, "model": None},
    ) as pipeline:
        futures = pipeline.submit(list(range(12)))
        assert [f.result(WAIT_S) for f in futures] == list(range(12))
    assert seen == {"decode": {1}, "model": {default_threads}, "encode": {default_threads}}
    assert torch.get_num_threads() == main_before
    assert in_new_thread(torch.get_num_threads) == default_threads  # not process-wide


def test_a_stage_can_be_given_any_count(
    default_threads: int,
) -> None:
    seen: dict[str, set[int]] = {}
    with Pipeline({"only": recording(seen, "only")}, intra_op_threads={"only": 1}) as first:
        first.submit([1])[0].result(WAIT_S)
    with Pipeline(
        {"only": recording(seen, "again")}, intra_op_threads={"only": default_threads}
    ) as second:
        second.submit([1])[0].result(WAIT_S)
    assert seen == {"only": {1}, "again": {default_threads}}


@pytest.mark.parametrize(
    ("threads", "message"),
    [
        ({"decode": 1}, "micro_batching.intra_op_threads.decode: unknown stage; stages are only"),
        ({"only": 0}, "micro_batching.intra_op_threads.only: got 0, expected an integer >= 1"),
        ({"only": True}, "micro_batching.intra_op_threads.only: got True"),
    ],
)
def test_bad_intra_op_threads_fail_construction_naming_the_key(
    threads: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Pipeline({"only": lambda items: items}, intra_op_threads=threads)
    assert message in str(info.value)


def test_a_failure_to_set_them_is_logged_and_the_thread_serves_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def broken(threads: int) -> bool:
        calls.append(threads)
        raise OSError("no OpenMP here")

    monkeypatch.setattr(intra_op, "limit_intra_op_threads", broken)
    pipeline = Pipeline({"only": lambda items: items}, intra_op_threads={"only": 1})
    with caplog.at_level(logging.ERROR, logger="ts_microbatch.core.stages"), pipeline:
        assert [f.result(WAIT_S) for f in pipeline.submit([1, 2, 3])] == [1, 2, 3]
    assert calls == [1]  # the scenario: the setting was attempted, and it raised
    assert "preparing a only thread failed; it serves on" in caplog.text


def test_without_a_usable_openmp_runtime_it_warns_once_and_leaves_torch_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, default_threads: int
) -> None:
    monkeypatch.setattr(intra_op, "_setter", None)
    monkeypatch.setattr(intra_op, "_searched", False)
    monkeypatch.setattr(intra_op, "_warned", False)
    searched: list[int] = []
    monkeypatch.setattr(intra_op, "_find_setter", lambda torch, n: searched.append(n))
    with caplog.at_level(logging.WARNING, logger="ts_microbatch.core.intra_op"):
        got = [in_new_thread(lambda: intra_op.limit_intra_op_threads(1)) for _ in range(2)]
    assert searched == [1]  # searched once, found nothing
    assert got == [False, False]
    assert caplog.text.count("intra_op_threads: cannot give a stage thread 1") == 1
    assert in_new_thread(torch.get_num_threads) == default_threads


def test_a_process_without_torch_has_nothing_to_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    assert intra_op.limit_intra_op_threads(1) is True


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux: /proc/self/maps")
def test_the_runtime_torch_loaded_is_found_among_the_loaded_ones() -> None:
    torch.ones(1 << 16).sum()  # a parallel operation: the OpenMP runtime is in use
    names = [Path(p).name for p in intra_op._loaded_openmp_runtimes()]
    assert any(name.startswith(("libgomp", "libiomp5", "libomp")) for name in names), names


def _tasks() -> set[str]:
    return set(Path("/proc/self/task").iterdir()) if Path("/proc/self/task").exists() else set()


def _libgomp_loaded() -> bool:
    return any(Path(p).name.startswith("libgomp") for p in intra_op._loaded_openmp_runtimes())


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux: /proc/self/task")
def test_a_limited_thread_keeps_a_team_of_the_default_width_asleep(
    default_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one region at the default width before the limit leaves the thread's OpenMP team
    in the process for the thread's life: libgomp counts its threads, and so finds more
    threads of its own than cores and stops its idle threads spinning (the module's
    docstring); with the wait settings in the environment it is not done."""
    if not _libgomp_loaded():
        pytest.skip("the OpenMP runtime is not libgomp")
    for name in intra_op._WAIT_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    release = threading.Event()
    limited = threading.Event()

    def stage_thread() -> None:
        intra_op.limit_intra_op_threads(1)
        limited.set()
        release.wait(WAIT_S)

    def started_threads() -> int:
        before = _tasks()
        limited.clear()
        release.clear()
        thread = threading.Thread(target=stage_thread)
        thread.start()
        try:
            assert limited.wait(WAIT_S)
            return len(_tasks() - before) - 1  # less the stage thread itself
        finally:
            release.set()
            thread.join(WAIT_S)

    assert started_threads() == default_threads - 1
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")  # the user chose how teams wait
    assert started_threads() == 0
