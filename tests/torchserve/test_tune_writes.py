"""The tuner on a real .mar, continued (tests/torchserve/test_tune.py; a file of its own
so the suite's processes share the minutes): what it writes and where, and a corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT
from tests.torchserve.test_tune import (
    FakeServer,
    confirmed_lines,
    faked_confirm,
    slo_argv,
    text_build,
)
from ts_microbatch.tools import slo_confirm, slo_replace, tune
from ts_microbatch.tools.tune import main


def test_confirm_out_deleted_the_store_and_servers_of_a_users_folder_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--confirm-out .` in a project folder: the confirm runs and the frontend's CPU run
    # removed ./store and ./servers when they were done.
    from ts_microbatch.tools.results import MARKER

    server, mar = faked_confirm(monkeypatch, tmp_path, {"c1": 1e9, "c2": 1e9})
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
    server, mar = faked_confirm(monkeypatch, tmp_path, {"c1": 1e9, "c2": 1e9})
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
