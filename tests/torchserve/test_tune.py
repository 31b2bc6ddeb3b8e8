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
from ts_microbatch.tools import slo_confirm, slo_replace, tune
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
    server = FakeServer({"c1": 0.0, "c2": 0.0}, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
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
    server = FakeServer({"c1": 0.0, "c2": 1e9}, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
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
    server = FakeServer({"current": 1e9, "c1": 30.0, "c2": 30.0}, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
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


def test_confirm_out_deleted_the_store_and_servers_of_a_users_folder_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--confirm-out .` in a project folder: the confirm runs and the frontend's CPU run
    # removed ./store and ./servers when they were done.
    from ts_microbatch.tools.results import MARKER

    server = FakeServer({"c1": 1e9, "c2": 1e9}, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    project = tmp_path / "project"
    for name in ("store/mine.mar", "servers/notes.txt"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(f"the user's {name}")
    out = tmp_path / "model-config.yaml"
    argv = slo_argv(mar, out, tmp_path)
    argv[argv.index("--confirm-out") + 1] = str(project)
    with pytest.raises(SystemExit, match=f"--confirm-out {project}: the folder is not empty"):
        main(argv)
    assert server.served == {}  # refused before any server
    for name in ("store/mine.mar", "servers/notes.txt"):
        assert (project / name).read_text() == f"the user's {name}"
    assert not (project / MARKER).exists() and not out.exists()
    # A folder the tuner made is its own: confirmed into, its scratch folders removed.
    assert main(slo_argv(mar, out, tmp_path)) == 0
    assert sorted(server.served) == ["c1", "c2", "cpu", "current"]  # the servers ran
    assert sorted(p.name for p in (tmp_path / "confirm").iterdir()) == [MARKER]


def test_slo_tuner_merged_frontend_keys_into_a_micro_batching_json_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the exact default `micro_batching.json` went to model-config.yaml: with
    # `--out conf/micro_batching.json`, batchSize, maxBatchDelay, minWorkers and a nested
    # micro_batching were merged into the pipeline's JSON, which the package then refuses.
    server = FakeServer({"c1": 1e9, "c2": 1e9}, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    conf = tmp_path / "conf"
    conf.mkdir()
    users = json.dumps({"timeout_s": 9, "micro_batch_size": 2})
    for name in ("micro_batching.json", "tuned.JSON"):
        out = conf / name
        out.write_text(users)
        with pytest.raises(SystemExit, match=f"--out {out}: --slo-p99-ms tunes") as refused:
            main(slo_argv(mar, out, tmp_path))
        assert f"give --out {conf / 'model-config.yaml'}" in str(refused.value)
        assert out.read_text() == users  # untouched, before anything was measured
    assert server.served == {} and sorted(p.name for p in conf.iterdir()) == [
        "micro_batching.json", "tuned.JSON"
    ]  # fmt: skip
    # The model-config.yaml it names is written, the frontend's keys at its top level.
    assert main(slo_argv(mar, conf / "model-config.yaml", tmp_path)) == 0
    assert sorted(server.served) == ["c1", "c2", "cpu", "current"]  # it was tuned
    written = yaml.safe_load((conf / "model-config.yaml").read_text())
    assert {"batchSize", "maxBatchDelay", "micro_batching"} <= set(written)
    assert (conf / "micro_batching.json").read_text() == users


SAMPLE = str(Path(ROOT, "examples/text_classifier/sample.txt"))


def test_hang_tuner_lost_every_measurement_to_a_missing_output_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The incident: every configuration ran (75 s), then writing the winner crashed
    # because --out's folder did not exist, and nothing was written.
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "not" / "yet" / "model-config.yaml"
    argv = ["--mar", str(mar), "--input", SAMPLE, "--slo-p99-ms", "1000", "--repeats", "1"]
    argv += ["--micro-batch-sizes", "1,4", "--threads", "1", "--batch-sizes", "4"]
    argv += ["--windows", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["micro_batching"]["micro_batch_size"] in (1, 4)
    trials = [json.loads(line) for line in out.with_name("model-config.trials.jsonl").open()]
    assert [t["kind"] for t in trials] == ["stage-costs"] * 2 + ["modelled"] * 2 + ["best"]
    assert {t["settings"]["micro_batch_size"] for t in trials[:2]} == {1, 4}
    # A crash after the last measurement loses none of them.
    again = tmp_path / "again" / "model-config.yaml"

    def crash(*args: Any) -> None:
        raise RuntimeError("crashed at the end")

    monkeypatch.setattr(tune, "print_plan", crash)
    with pytest.raises(RuntimeError, match="crashed at the end"):
        main([*argv, "--out", str(again)])
    trials = [json.loads(line) for line in again.with_name("model-config.trials.jsonl").open()]
    assert [t["kind"] for t in trials] == ["stage-costs"] * 2 + ["modelled"] * 2
    assert all(t["batch_ms"]["4"] > 0 for t in trials[:2])
    assert not again.exists()


def test_confirm_on_a_corpus_sends_the_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A corpus goes through the package's own driver, as one --input does (a corpus of one),
    # to servers started from the user's config.properties.
    sent: list[Any] = []

    def confirm_corpus(*args: Any) -> None:
        sent.append(args[1].corpus)
        real_confirm(*args)

    real_confirm = slo_replace.confirm
    server = FakeServer({"c1": 1e9, "c2": 1e9}, 1000.0)
    monkeypatch.setattr(slo_confirm, "measure", server)
    monkeypatch.setattr(slo_replace, "confirm", confirm_corpus)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text('"a fine film"\n"a dull one"\n')
    argv = slo_argv(mar, tmp_path / "model-config.yaml", tmp_path)
    argv[argv.index("--input") : argv.index("--input") + 2] = ["--corpus", str(corpus)]
    argv += ["--ts-config", str(tmp_path / "config.properties")]
    assert main(argv) == 0
    assert [type(body).__name__ for body in sent] == ["Corpus"]
    assert server.base_configs == {tmp_path / "config.properties"}
    monkeypatch.setattr(tune, "java_problem", lambda: "java not found")
    with pytest.raises(SystemExit, match="--confirm needs TorchServe: java not found"):
        main(argv)


def test_confirm_keeps_each_run_as_it_comes_and_a_crash_loses_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = FakeServer({"c1": 1e9, "c2": 1e9}, 1000.0)

    def crash_on_the_second(server_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        assert (tmp_path / "confirm").is_dir()  # made before the first run
        if server_dir.name == "c2":
            raise RuntimeError("the last run crashed")
        return server(server_dir, *args, **kwargs)

    monkeypatch.setattr(slo_confirm, "measure", crash_on_the_second)
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "model-config.yaml"
    with pytest.raises(RuntimeError, match="the last run crashed"):
        main(slo_argv(mar, out, tmp_path))
    # The scenario: yours and c1 ran, c2 crashed.
    assert sorted(server.served) == ["c1", "cpu", "current"]
    assert [c["measured_per_s"] > 0 for c in confirmed_lines(out)] == [False, True]
    assert not out.exists()


def test_tuner_wrote_over_the_users_file_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "model-config.yaml"
    users = (
        "micro_batching:\n  timeout_s: 9\n  max_queued_micro_batches: 7\n  micro_batch_size: 2\n"
    )
    out.write_text(users)
    argv = ["--mar", str(mar), "--input", SAMPLE, "--slo-p99-ms", "1000", "--repeats", "1"]
    argv += ["--micro-batch-sizes", "4", "--threads", "1", "--batch-sizes", "4", "--windows", "1"]
    # Without --confirm nothing was measured against the user's file: it stays.
    assert main([*argv, "--out", str(out)]) == 0
    assert out.read_text() == users and "left as it is" in capsys.readouterr().out
    # Beaten on a server, it is merged into, every key the tuner does not set kept.
    monkeypatch.setattr(slo_confirm, "measure", FakeServer({"c1": 1e9}, 1000.0))
    monkeypatch.setattr(tune, "java_problem", lambda: None)
    confirming = ["--confirm", "1", "--confirm-out", str(tmp_path / "confirm")]
    assert main([*argv, *confirming, "--out", str(out)]) == 0
    written = yaml.safe_load(out.read_text())["micro_batching"]
    assert written["micro_batch_size"] == 4  # the scenario: the tuner wrote its choice
    assert (written["timeout_s"], written["max_queued_micro_batches"]) == (9, 7)
    assert (tmp_path / "model-config.yaml.bak").read_text() == users
    # A file it cannot parse is refused before anything is measured, and left as it was.
    out.write_text("micro_batching: [unclosed\n")
    with pytest.raises(SystemExit, match="cannot parse the existing file"):
        main([*argv, "--out", str(out)])
    assert out.read_text() == "micro_batching: [unclosed\n"
