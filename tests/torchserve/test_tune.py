"""The tuner on a real .mar (the text example): stage costs in-process, its servers faked
(tests/torchserve/test_slo_tune.py: the same without confirming)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT, load_module
from ts_microbatch import load_config
from ts_microbatch.tools import slo_confirm, tune
from ts_microbatch.tools.bundle import run_archiver
from ts_microbatch.tools.tune import main

text_build = load_module("examples/text_classifier/build_mar.py", "ts_microbatch_text_build_mar")


def test_tuner_refuses_a_handler_without_micro_batching(tmp_path: Path) -> None:
    handler = tmp_path / "plain_handler.py"
    handler.write_text(
        "from ts.torch_handler.base_handler import BaseHandler\n\n"
        "class Plain(BaseHandler):\n    def initialize(self, context):\n"
        "        self.initialized = True\n"
    )
    work = tmp_path / "store"
    work.mkdir()
    run_archiver(
        [
            "--model-name",
            "plain",
            "--version",
            "1",
            "--handler",
            str(handler),
            "--export-path",
            str(work),
            "--archive-format",
            "no-archive",
        ]
    )
    with pytest.raises(SystemExit, match="does not use ts_microbatch"):
        main(["--mar", str(work / "plain"), "--input", str(handler), "--slo-p99-ms", "100"])


def test_benchmark_serves_a_mar_with_each_micro_batching_config(tmp_path: Path) -> None:
    bench_ab = load_module("benchmarks/benchmark-ab.py", "ts_microbatch_benchmark_ab")
    packaging = load_module("benchmarks/bench_packaging.py", "bench_packaging")
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    config_path = tmp_path / "bench.json"
    settings = {"micro_batch_size": 3, "parallelism": {"preprocess": 2}, "timeout_s": 9}
    config_path.write_text(
        json.dumps(
            {
                "scenarios": ["mar"],
                "mar": str(mar),
                "input": "x",
                "micro_batching": [settings],
                "batch_size": 12,
            }
        )
    )
    config = bench_ab.bench_lib.load_config(config_path)
    point = bench_ab.bench_lib.sweep_points(config)[0]
    assert bench_ab.handlers_for("mar", point, config) == ["mar"]
    store = tmp_path / "store"
    packaging.package(store, tmp_path / "bench-work", "m1", "mar", "mar", config, point, None)
    model = store / "m1"
    manifest = json.loads((model / "MAR-INF" / "MANIFEST.json").read_text())
    assert manifest["model"]["modelName"] == "m1"
    yaml_config = packaging.yaml.safe_load((model / manifest["model"]["configFile"]).read_text())
    assert yaml_config["batchSize"] == 12 and yaml_config["micro_batching"] == settings
    # What the handler will load: the point's settings, whichever file it reads.
    loaded = load_config(model, yaml_config)
    assert (loaded.micro_batch_size, loaded.parallelism.preprocess, loaded.timeout_s) == (3, 2, 9)
    assert json.loads((model / "micro_batching.json").read_text()) == settings


class FakeServer:
    """``slo_confirm.measure`` for servers that hold the objective up to ``limits[name]``
    req/s (0, or a name not given: nothing held; ``current`` is the user's configuration):
    each rate of the confirm's ladder answered within the objective up to the limit, far
    over it past, on 400 answers with intervals that part; the frontend's CPU run reports
    2 ms a request."""

    def __init__(self, limits: dict[str, float], slo_p99_ms: float) -> None:
        self.limits = limits
        self.slo_p99_ms = slo_p99_ms
        self.served: dict[str, dict[str, Any]] = {}  # name -> point and rates offered
        self.base_configs: set[Path | None] = set()

    def __call__(
        self, server_dir: Path, store: Path, model: str, config: Any, point: dict[str, Any],
        label: str, *args: Any, **kwargs: Any,
    ) -> dict[str, Any]:  # fmt: skip
        assert (store / f"{model}.mar").is_file()  # repackaged with its settings
        self.base_configs.add(kwargs["base_config"])
        if model == "cpu":
            self.served[model] = {"point": point}
            return {"frontend_cpu_ms_per_request": 2.0, "complete_requests": point["requests"]}
        sender = args[1]
        rates = list(sender.rates)
        limit = self.limits.get(model, 0.0)
        curve = []
        for rate in rates:
            p99 = self.slo_p99_ms / 2 if rate <= limit else 5 * self.slo_p99_ms
            curve.append({
                "offered_per_s": rate, "realized_per_s": rate, "achieved_per_s": rate,
                "requests": 400, "answers": 400, "errors": 0, "timeouts": 0,
                "queue_growth_ms": 0.0, "busy": False,
                "p99_ms": p99, "p99_low_ms": 0.9 * p99, "p99_high_ms": 1.1 * p99,
            })  # fmt: skip
        self.served[model] = {"point": point, "rates": rates}
        return {"curve": curve, "frontend_cpu_ms_per_request": 2.5}


def faked_confirm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, held: dict[str, float]
) -> tuple[FakeServer, Path]:
    """What each confirming test starts with: the confirm's servers faked (each served model
    holding its rate in ``held``), Java taken as present, the text example's .mar built."""
    server = FakeServer(held, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    return server, text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")


def slo_argv(mar: Path, out: Path, tmp_path: Path) -> list[str]:
    sample = str(Path(ROOT, "examples/text_classifier/sample.txt"))
    return [
        "--mar", str(mar), "--input", sample, "--slo-p99-ms", "1000", "--repeats", "1",
        "--micro-batch-sizes", "1,4", "--threads", "1", "--batch-sizes", "1,4",
        "--windows", "1,2", "--confirm", "2", "--out", str(out),
        "--confirm-out", str(tmp_path / "confirm"),
    ]  # fmt: skip


USERS_CONFIG = "# mine\nresponseTimeout: 30\nminWorkers: 1\nmaxWorkers: 1\n"


def confirmed_lines(out: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.with_name(f"{out.stem}.trials.jsonl").open()]
    return [line for line in lines if line["kind"] == "confirmed"]


def test_slo_tuner_wrote_its_rank_1_although_every_confirm_held_nothing_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The incident: predicted 1,166 req/s, both confirms held nothing, rank 1 written over
    # the user's model-config.yaml.
    server, mar = faked_confirm(monkeypatch, tmp_path, {"c1": 0.0, "c2": 0.0})
    out = tmp_path / "model-config.yaml"
    out.write_text(USERS_CONFIG)
    assert main(slo_argv(mar, out, tmp_path)) == 1
    # The scenario: both were confirmed, and the user's configuration beside them.
    assert sorted(server.served) == ["c1", "c2", "cpu", "current"]
    current, *confirmed = confirmed_lines(out)
    assert [c["measured_per_s"] for c in [current, *confirmed]] == [0.0, 0.0, 0.0]
    # Confirm slots went to configurations that differ in more than the window.
    first, second = confirmed
    assert (first["batchSize"], first["micro_batching"]) != (
        second["batchSize"], second["micro_batching"]
    )  # fmt: skip
    # One ladder for all, from an eighth of the best prediction to above it.
    best = max(c["predicted_per_s"] for c in confirmed)
    rates = server.served["c1"]["rates"]
    assert rates[0] <= max(1.0, 0.15 * best) and rates[-1] > best
    assert server.served["c2"]["rates"] == rates == server.served["current"]["rates"]
    assert out.read_text() == USERS_CONFIG  # untouched
    assert not list(tmp_path.glob("model-config.yaml.bak*"))
    printed = capsys.readouterr().out
    assert "Nothing written to" in printed
    assert "for any of the 3 configurations confirmed, yours included" in printed
    table = printed.split("On TorchServe")[1]
    assert all(f"| {c['predicted_per_s']:.0f} | 0 |" in table for c in confirmed)
    assert "the frontend's CPU 2.00 ms a request" in printed  # the calibration was used


def test_slo_tuner_writes_the_best_confirmed_when_rank_1_was_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ts_microbatch.torchserve.timeouts import default_timeout_s

    # Rank 1 holds nothing, rank 2 all, the user's configuration nothing.
    server, mar = faked_confirm(monkeypatch, tmp_path, {"c1": 0.0, "c2": 1e9})
    out = tmp_path / "model-config.yaml"
    out.write_text(USERS_CONFIG)
    assert main(slo_argv(mar, out, tmp_path)) == 0
    _, first, second = confirmed_lines(out)
    assert first["measured_per_s"] == 0 and second["measured_per_s"] > 0  # the scenario
    written = yaml.safe_load(out.read_text())
    assert (written["batchSize"], written["maxBatchDelay"]) == (
        second["batchSize"], second["maxBatchDelay"]
    )  # fmt: skip
    tuned = second["micro_batching"]
    assert written["micro_batching"]["micro_batch_size"] == tuned["micro_batch_size"]
    assert written["micro_batching"]["parallelism"] == tuned["parallelism"]
    # The user's keys kept, their file backed up first.
    assert written["responseTimeout"] == 30 and default_timeout_s(written) == 27.0
    assert (tmp_path / "model-config.yaml.bak").read_text() == USERS_CONFIG
    assert "Replacing your configuration" in capsys.readouterr().out


def test_the_tuner_replaced_a_configuration_that_beat_every_candidate_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The incident: the tuner wrote its pick over the user's micro_batch_size "auto" without
    # ever serving "auto". Theirs now runs the same ladder, and here holds every rate.
    users = "batchSize: 8\nmaxBatchDelay: 3\nmicro_batching:\n  micro_batch_size: auto\n"
    server, mar = faked_confirm(monkeypatch, tmp_path, {"current": 1e9, "c1": 30.0, "c2": 30.0})
    out = tmp_path / "model-config.yaml"
    out.write_text(users)
    assert main(slo_argv(mar, out, tmp_path)) == 0
    lines = [json.loads(line) for line in out.with_name("model-config.trials.jsonl").open()]
    current = confirmed_lines(out)[0]
    # The scenario: their configuration as their file and the .mar say, on the same ladder.
    assert (current["batchSize"], current["maxBatchDelay"]) == (8, 3)
    assert current["micro_batching"]["micro_batch_size"] == "auto"
    assert server.served["current"]["rates"] == server.served["c1"]["rates"]
    assert server.served["current"]["rates"] == server.served["c2"]["rates"]
    assert out.read_text() == users and not list(tmp_path.glob("model-config.yaml.bak*"))
    assert [line["kind"] for line in lines][-1] == "kept"
    printed = capsys.readouterr().out
    assert f"{out} left as it is: your configuration held" in printed
    # A candidate that beat it with intervals that part replaces it, the margin said.
    server.limits.update({"current": 30.0, "c1": 1e9})
    assert main(slo_argv(mar, out, tmp_path)) == 0
    written = yaml.safe_load(out.read_text())
    assert written["micro_batching"]["micro_batch_size"] != "auto"
    printed = capsys.readouterr().out
    held = confirmed_lines(out)[-2]["measured_per_s"]  # c1, this run
    assert "Replacing your configuration" in printed and "the intervals part at" in printed
    assert "for your configuration" in printed and "x)" in printed
    assert out.read_text().startswith(f"# ts-microbatch-tune --slo-p99-ms 1000 (held {held:g}")
