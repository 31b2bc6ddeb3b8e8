"""The latency-objective tuner's pieces, without a server: stage costs checked for order,
the CPU cap in the plan, the configurations confirmed, the confirm ladder, and merging into
the user's config file (ts_microbatch.tools.slo_plan, slo_confirm, merge)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from ts_microbatch import MicroBatchingConfig
from ts_microbatch.tools import curves
from ts_microbatch.tools.batching_model import Tail, service_curve, sustained
from ts_microbatch.tools.merge import MergeError, backup_path, write_merged
from ts_microbatch.tools.results import ResultsLog
from ts_microbatch.tools.slo_confirm import (
    confirm_slots,
    ladder,
    ladder_sender,
)
from ts_microbatch.tools.slo_plan import (
    Candidate,
    StageCosts,
    plan,
    stage_costs,
    worker_cpu_scale,
)


class FakeMicroBatching:
    """What stage_costs needs of a MicroBatching: ``configure``."""

    def __init__(self) -> None:
        self.configured: list[MicroBatchingConfig] = []

    def configure(self, config: MicroBatchingConfig) -> None:
        self.configured.append(config)


class FakeCorpus:
    def batches(self, n: int, count: int) -> list[list[int]]:
        return [[n] * n for _ in range(count)]


def scripted(costs_ms: dict[int, list[float]]) -> tuple[Any, list[int]]:
    """A measure that returns, per batch size, the next of its scripted milliseconds (CPU:
    the same); and the sizes measured, in order."""
    calls: list[int] = []

    def measure(
        mb: Any, context: Any, batches: list[list[int]]
    ) -> tuple[float, float, tuple[float, ...]]:
        n = len(batches[0])
        calls.append(n)
        ms = costs_ms[n].pop(0)
        return ms / 1000, ms / 1000, (ms / 1000,)

    return measure, calls


def combo(size: int) -> dict[str, Any]:
    threads = {"preprocess": 1, "inference": 1, "postprocess": 1}
    return {"micro_batch_size": size, "parallelism": threads}


def test_stage_costs_not_monotone_in_batch_size_went_unflagged_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The incident: at micro-batch 4 a batch of 8 measured 71.2 ms and one of 16 20.2 ms,
    # and nothing said so. Measured again, still so: flagged.
    measure, calls = scripted({1: [3.0], 4: [9.0], 8: [71.2, 70.0], 16: [20.2, 21.0]})
    record = ResultsLog(tmp_path / "trials.jsonl")
    costs = stage_costs(
        FakeMicroBatching(), None, FakeCorpus(), MicroBatchingConfig(), [combo(4)],
        [4, 8, 16], 2, record, measure=measure,
    )  # fmt: skip
    # The scenario: the pair out of order measured again (batches of one always measured).
    assert calls == [1, 4, 8, 16, 8, 16]
    assert costs[0].not_monotone == ((8, 16),)
    assert costs[0].batch_ms == {1: 3.0, 4: 9.0, 8: 70.0, 16: 21.0}
    printed = capsys.readouterr().out
    assert "warning: not monotone: a batch of 16 took 21.0 ms, one of 8 70.0 ms" in printed
    (line,) = record.read()
    assert line["not_monotone"] == [[8, 16]] and line["first_batch_ms"]["8"] == 71.2
    # The plan marks every configuration whose batches reach the pair, and only those.
    candidates = plan(costs, [4, 16], [1], 1000.0)
    assert {(c.batch_size, c.flagged) for c in candidates} == {(4, False), (16, True)}


def test_stage_costs_out_of_order_once_then_in_order_are_not_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measure, calls = scripted({1: [3.0], 4: [9.0], 8: [71.2, 15.0], 16: [20.2, 25.0]})
    costs = stage_costs(
        FakeMicroBatching(), None, FakeCorpus(), MicroBatchingConfig(), [combo(4)],
        [4, 8, 16], 2, ResultsLog(tmp_path / "trials.jsonl"), measure=measure,
    )  # fmt: skip
    assert calls == [1, 4, 8, 16, 8, 16]
    assert costs[0].not_monotone == ()
    assert costs[0].batch_ms == {1: 3.0, 4: 9.0, 8: 15.0, 16: 25.0}
    assert "warning" not in capsys.readouterr().out


def candidate(size: int, batch: int, window: int, held: float) -> Candidate:
    tail = Tail(held, 10.0, 1.0, 1.0, 8.0)
    settings = {**MicroBatchingConfig().as_dict(), **combo(size)}
    return Candidate(settings, batch, window, tail)


def test_confirm_slots_went_to_configs_differing_only_in_the_window_() -> None:
    # The incident: both slots went to micro-batch 4, batch 16, windows 1 and 2 ms.
    ranked = [
        candidate(4, 16, 1, 1166.0),
        candidate(4, 16, 2, 1150.0),
        candidate(4, 16, 5, 1100.0),
        candidate(2, 16, 1, 1000.0),
        candidate(4, 8, 1, 900.0),
    ]
    assert ranked[1].same_but_window(ranked[0])  # the scenario: rank 2 differs in the window
    chosen = confirm_slots(ranked, 2)
    assert chosen == [ranked[0], ranked[3]]
    assert confirm_slots(ranked, 3) == [ranked[0], ranked[3], ranked[4]]
    ranked[3].tail = None  # the model holds nothing with it: never confirmed
    assert confirm_slots(ranked, 2) == [ranked[0], ranked[4]]


def test_the_cpu_caps_what_the_model_holds() -> None:
    service = service_curve({1: 0.5, 16: 4.0})  # a small MLP: 4,000 req/s for the worker
    free = sustained(250, 16, 1, service)
    capped = sustained(250, 16, 1, service, max_rate_per_s=1000.0)
    assert free is not None and capped is not None
    assert free.rate_per_s > 1000 and free.bound != "cpu"
    assert capped.rate_per_s == pytest.approx(1000.0) and capped.bound == "cpu"
    # In the plan: 1.5 ms of frontend CPU and 0.5 of worker CPU a request on two cores.
    cost = StageCosts(combo(4) | {"extra": 1}, {1: 0.5, 16: 4.0}, {1: 0.5, 16: 8.0})
    (alone,) = plan([cost], [16], [1], 250.0)
    (with_cpu,) = plan([cost], [16], [1], 250.0, frontend_cpu_ms=1.5, cores=2)
    assert alone.held_per_s > 1000
    assert with_cpu.held_per_s == pytest.approx(1000.0) and with_cpu.tail is not None
    assert with_cpu.tail.bound == "cpu"
    (at_rate,) = plan([cost], [16], [1], 250.0, rate=1200.0, frontend_cpu_ms=1.5, cores=2)
    assert at_rate.tail is None  # the cores cannot answer 1,200 a second


def test_the_worker_cpu_a_real_server_spent_scales_the_in_process_cost_in_the_cap() -> None:
    # In-process 0.5 ms of worker CPU a request at batch 16 (8 ms a batch); a real worker
    # serving it spent 2.5 (TorchServe's decode and encode, a costlier mix): 5x.
    cost = StageCosts(combo(4), {1: 0.5, 16: 4.0}, {1: 0.5, 16: 8.0})
    (first,) = plan([cost], [16], [1], 250.0, frontend_cpu_ms=1.5, cores=2)
    scale = worker_cpu_scale([cost], first, 2.5)
    assert scale == pytest.approx(5.0)
    (scaled,) = plan([cost], [16], [1], 250.0, frontend_cpu_ms=1.5, cores=2, worker_cpu_scale=scale)
    assert scaled.held_per_s == pytest.approx(2000 / (1.5 + 2.5))  # 500, not 1,000
    assert scaled.tail is not None and scaled.tail.bound == "cpu"
    # Never below in-process, and 1.0 for a configuration it has no costs for.
    assert worker_cpu_scale([cost], first, 0.1) == 1.0
    other = StageCosts(combo(8), {1: 0.5}, {1: 0.5})
    assert worker_cpu_scale([other], first, 2.5) == 1.0


class FakeOpenLoop:
    """``run_open_loop`` for a server that holds the objective up to ``limit`` req/s."""

    def __init__(self, limit: float, slo_p99_ms: float) -> None:
        self.limit = limit
        self.slo_p99_ms = slo_p99_ms
        self.offered: list[float] = []

    def __call__(self, url: str, bodies: Any, rate: float, count: int, **kwargs: Any) -> Any:
        self.offered.append(rate)
        p99 = self.slo_p99_ms / 2 if rate <= self.limit else 3 * self.slo_p99_ms
        row = {
            "offered_per_s": rate, "realized_per_s": rate, "achieved_per_s": rate,
            "p99_ms": p99, "errors": 0, "timeouts": 0, "queue_growth_ms": 0.0, "requests": count,
            "p99_low_ms": p99, "p99_high_ms": p99, "late_sends": 0,
            "other_cpu_cores": math.nan, "busy": False,
        }  # fmt: skip

        class Result:
            sends: list[Any] = []
            elapsed_s = count / rate
            cpu_s = 0.0
            other_cpu_cores = math.nan

            def summary(self) -> dict[str, Any]:
                return row

            def latencies_ms(self) -> list[float]:
                return []

        return Result()


def test_confirm_sweep_started_above_what_the_server_held_(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The incident: predicted 1,166 req/s, the sweep started at 0.3x (350), the server held
    # 287: "held 0". The ladder reaches well below the prediction, and above it.
    rates = ladder(1166.0)
    assert rates[0] < 0.15 * 1166 and rates[-1] > 1166.0  # an eighth, to 1.4x
    assert all(b / a < 1.5 for a, b in zip(rates, rates[1:]))  # no gap a held rate hides in
    server = FakeOpenLoop(limit=1166.0 / 3, slo_p99_ms=25.0)  # 3x too optimistic
    monkeypatch.setattr(curves, "run_open_loop", server)
    monkeypatch.setattr(curves, "summarize", lambda every, elapsed, cpu: ({}, {}))

    class Corpus:
        order = [0]
        bodies = [type("Body", (), {"data": b"{}", "content_type": "application/json"})()]

        def sequence(self, n: int) -> list[int]:
            return [0] * n

    lines: list[str] = []
    # No meter: the fake answers at once, and the machine's other load is not the question.
    sender = ladder_sender(Corpus(), rates, 25.0, 32, lines.append, meter=None)  # type: ignore[arg-type]
    summary, _ = sender("http://127.0.0.1:1/predictions/m", None, 1, Path("."), "[confirm 1/1]")
    held = curves.sustained(summary["curve"], 25.0)
    assert 0.25 * 1166 <= held <= 1166 / 3  # found, within one step of the truth
    # It stopped after two rates in a row missed, with a line per rate offered.
    assert server.offered == [r for r in rates if r <= held] + [r for r in rates if r > held][:2]
    assert len(lines) == len(server.offered) and "missed" in lines[-1]


def test_merge_dropped_the_users_keys_and_kept_no_backup_(tmp_path: Path) -> None:
    # The incident: the tuner wrote model-config.yaml over the user's, and their
    # responseTimeout: 30 (timeout_s 27 s) went, silently (timeout_s 108 s).
    out = tmp_path / "model-config.yaml"
    original = (
        "# mine\nresponseTimeout: 30\nminWorkers: 2\ndeviceType: cpu\n"
        "micro_batching:\n  max_queued_micro_batches: 7\n  micro_batch_size: 2\n"
    )
    out.write_text(original)
    (tmp_path / "model-config.yaml.bak").write_text("an older backup\n")
    values = {"batchSize": 16, "maxBatchDelay": 2, "micro_batching": combo(4)}
    written, backup = write_merged(out, values, {"minWorkers": 1, "maxWorkers": 1}, "tuned")
    assert backup == tmp_path / "model-config.yaml.bak.1"
    assert backup.read_text() == original  # the user's file, comments and all
    assert (tmp_path / "model-config.yaml.bak").read_text() == "an older backup\n"
    loaded = yaml.safe_load(out.read_text())
    assert loaded == written
    assert (loaded["responseTimeout"], loaded["minWorkers"], loaded["deviceType"]) == (30, 2, "cpu")
    assert (loaded["batchSize"], loaded["maxBatchDelay"], loaded["maxWorkers"]) == (16, 2, 1)
    section = loaded["micro_batching"]
    assert section["max_queued_micro_batches"] == 7 and section["micro_batch_size"] == 4
    # Again: a new backup each time, none overwritten.
    _, again = write_merged(out, values)
    assert again == tmp_path / "model-config.yaml.bak.2" and backup.read_text() == original


def test_merge_refuses_a_file_it_cannot_parse(tmp_path: Path) -> None:
    out = tmp_path / "model-config.yaml"
    out.write_text("responseTimeout: 30\nmicro_batching: [unclosed\n")
    with pytest.raises(MergeError, match="cannot parse the existing file"):
        write_merged(out, {"batchSize": 4})
    assert out.read_text() == "responseTimeout: 30\nmicro_batching: [unclosed\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-config.yaml"]
    listed = tmp_path / "listed.yaml"
    listed.write_text("[1, 2]")
    with pytest.raises(MergeError, match="holds list, expected a mapping"):
        write_merged(listed, {"micro_batch_size": 4})
    assert listed.read_text() == "[1, 2]"


def test_merge_backup_spun_forever_on_a_dangling_bak_symlink_(tmp_path: Path) -> None:
    # exists() follows the link and says no; open(..., "xb") then refuses the name, and
    # _backup asked backup_path for the same name again, at full CPU, forever.
    out = tmp_path / "model-config.yaml"
    out.write_text("responseTimeout: 30\n")
    dangling = tmp_path / "model-config.yaml.bak"
    dangling.symlink_to(tmp_path / "gone")
    assert dangling.is_symlink() and not dangling.exists()  # the scenario
    assert backup_path(out) == tmp_path / "model-config.yaml.bak.1"
    _, backup = write_merged(out, {"batchSize": 4})
    assert backup == tmp_path / "model-config.yaml.bak.1"
    assert backup.read_text() == "responseTimeout: 30\n"
    assert dangling.is_symlink() and not dangling.exists()  # left as it was


def test_merge_replaced_a_symlinked_config_and_dropped_its_mode_(tmp_path: Path) -> None:
    # os.replace over the link put a regular file in its place, with the umask's mode: the
    # file the link names kept the old config, and a private 0600 config became readable.
    real = tmp_path / "shared" / "model-config.yaml"
    real.parent.mkdir()
    real.write_text("responseTimeout: 30\n")
    real.chmod(0o600)
    link = tmp_path / "model-config.yaml"
    link.symlink_to(real)
    written, backup = write_merged(link, {"batchSize": 4})
    assert written == {"responseTimeout": 30, "batchSize": 4}  # the scenario: a merge
    assert link.is_symlink() and link.resolve() == real
    assert yaml.safe_load(real.read_text()) == written
    assert real.stat().st_mode & 0o777 == 0o600
    assert backup == tmp_path / "model-config.yaml.bak"
    assert backup.read_text() == "responseTimeout: 30\n"
    assert not list(real.parent.glob(".*.tmp-*"))  # no scratch file left
    # A regular file keeps its mode too.
    plain = tmp_path / "plain.yaml"
    plain.write_text("responseTimeout: 30\n")
    plain.chmod(0o600)
    write_merged(plain, {"batchSize": 4})
    assert yaml.safe_load(plain.read_text())["batchSize"] == 4  # rewritten
    assert plain.stat().st_mode & 0o777 == 0o600
