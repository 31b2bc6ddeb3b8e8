"""Long tools keep what they measured (ts_microbatch.tools.results): output folders made
before the first run, each run appended to a .jsonl as it comes, so that a crash at the
end loses nothing. The benchmark and the tuner's --confirm here, with their servers
replaced by fakes; the tuner's in-process runs in tests/torchserve/test_tune.py."""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from ts_microbatch.tools import benchmark, confirm, measure
from ts_microbatch.tools.corpus import read_corpus
from ts_microbatch.tools.results import OutputError, ResultsLog, output_dir, output_file

LOAD = confirm.Load(
    batch_size=4, max_batch_delay_ms=10, concurrency=8, requests=16, warmup_requests=8
)


def test_output_paths_are_made_at_once_or_refused_naming_the_path(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b"
    assert output_dir(nested).is_dir()
    assert output_file(tmp_path / "c" / "d" / "best.json").parent.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputError, match=f"--out {blocker / 'x'}: cannot create it"):
        output_dir(blocker / "x", "--out")
    with pytest.raises(OutputError, match="is a directory"):
        output_file(nested)
    log = ResultsLog(tmp_path / "e" / "results.jsonl")
    log.append({"n": 1})
    log.append({"n": 2, "rate": float("nan")})
    lines = log.read()
    assert [line["n"] for line in lines] == [1, 2] and all("time" in line for line in lines)
    assert len(ResultsLog(log.path).read()) == 2  # reopening keeps what is there


def model_dir(path: Path) -> Path:
    (path / "MAR-INF").mkdir(parents=True)
    manifest = {"model": {"modelName": "m", "handler": "h.py"}}
    (path / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return path


def test_confirm_keeps_each_run_as_it_comes_and_a_crash_loses_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "not" / "yet" / "there"
    calls: list[tuple[str, Path | None]] = []

    def fake_measure(server_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        assert workdir.is_dir()  # made before the first run
        calls.append((server_dir.name, kwargs["base_config"]))
        if len(calls) == 4:
            raise RuntimeError("the last run crashed")
        return {"requests_per_s": 10.0 * len(calls), "p99_ms": 5.0, "errors": 0}

    monkeypatch.setattr(benchmark, "measure", fake_measure)
    configs = [{"micro_batch_size": 2}, {"micro_batch_size": 4}]
    user_config = tmp_path / "config.properties"
    (tmp_path / "body.bin").write_bytes(b"x")
    body = read_corpus(tmp_path / "body.bin")
    source = model_dir(tmp_path / "model")
    with pytest.raises(RuntimeError, match="the last run crashed"):
        confirm.measure_configs(source, body, configs, LOAD, 2, workdir, user_config, seed=7)
    kept = ResultsLog(workdir / "results.jsonl").read()
    # Each round serves every config once (in its shuffled order): round 1 whole, then
    # round 2's first run, each kept as it came.
    served = [name for name, _ in calls[:3]]
    assert {served[0], served[1]} == {"c1-r1", "c2-r1"} and served[2].endswith("-r2")
    assert [(f"{r['handler']}-r{r['repeat']}", r["requests_per_s"]) for r in kept] == [
        (served[0], 10.0),
        (served[1], 20.0),
        (served[2], 30.0),
    ]
    assert {config for _, config in calls} == {user_config}


def test_confirm_serves_from_the_users_config_whose_settings_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_server(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(measure, "TorchServe", fake_server)
    user_config = tmp_path / "config.properties"
    user_config.write_text("job_queue_size=5\nmax_request_size=1000\n")
    (tmp_path / "body.bin").write_bytes(b"x" * 10)
    body = read_corpus(tmp_path / "body.bin")
    source = model_dir(tmp_path / "model")
    with pytest.raises(Stop):
        confirm.measure_configs(source, body, [{}], LOAD, 1, tmp_path / "w", user_config)
    assert seen["base_config"] == user_config
    assert set(seen["properties"]) == {"default_response_timeout"}
    with pytest.raises(Stop):
        confirm.measure_configs(source, body, [{}], LOAD, 1, tmp_path / "w2")
    assert seen["base_config"] is None and seen["properties"]["job_queue_size"] == "1000"


def tiny_mar(path: Path) -> Path:
    manifest = {"model": {"modelName": "m", "handler": "h.py", "configFile": "model-config.yaml"}}
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("h.py", "class H: pass\n")
        mar.writestr("model-config.yaml", yaml.safe_dump({"batchSize": 4}))
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


RATES = {"plain-r1": 100.0, "ours-r1": 150.0, "plain-r2": 90.0, "ours-r2": 160.0}


def benchmark_args(tmp_path: Path, out: Path) -> argparse.Namespace:
    body = tmp_path / "body.txt"
    body.write_text("a fine film")
    argv = ["--mar", str(tiny_mar(tmp_path / "m.mar")), "--body", str(body), "--rounds", "2"]
    return benchmark.build_parser().parse_args([*argv, "--out", str(out)])


def fake_measure(out: Path, rates: dict[str, float]) -> Any:
    """Each run's throughput from ``rates`` by its server's name (``<variant>-r<round>``)."""

    def measure(server_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        assert out.is_dir()  # made before the first run
        rate = rates[server_dir.name]
        return {"requests_per_s": rate, "p99_ms": 100.0, "p50_ms": 50.0, "errors": 0}

    return measure


def test_the_benchmark_keeps_each_run_as_it_comes_and_a_crash_loses_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "runs" / "not" / "yet" / "there"
    monkeypatch.setattr(benchmark, "measure", fake_measure(out, RATES))

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the report crashed")

    monkeypatch.setattr(benchmark, "report", crash)
    with pytest.raises(RuntimeError, match="the report crashed"):
        benchmark.run(benchmark_args(tmp_path, out), None, tmp_path / "runs")
    kept = ResultsLog(out / "results.jsonl").read()
    assert sorted((r["repeat"], r["handler"], r["requests_per_s"]) for r in kept) == [
        (1, "ours", 150.0),
        (1, "plain", 100.0),
        (2, "ours", 160.0),
        (2, "plain", 90.0),
    ]


def test_the_benchmark_refuses_an_out_it_cannot_make_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(benchmark, "measure", fake_measure(blocker, {}))  # never called
    assert benchmark.run(benchmark_args(tmp_path, blocker / "out"), None, tmp_path) == 2
    assert f"--out {blocker / 'out'}: cannot create it" in capsys.readouterr().err
