"""Long tools keep what they measured (ts_microbatch.tools.results): output folders made
before the first run, each run appended to a .jsonl as it comes, so that a crash at the
end loses nothing. The benchmark here, with its servers replaced by fakes; the tuner in
tests/torchserve/test_tune.py."""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from ts_microbatch.tools import benchmark, measure
from ts_microbatch.tools.results import OutputError, ResultsLog, output_dir, output_file


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


def test_a_server_starts_from_the_users_config_whose_settings_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(measure, "TorchServe", lambda **kwargs: seen.update(kwargs))
    user_config = tmp_path / "config.properties"
    user_config.write_text("job_queue_size=5\nmax_request_size=1000\n")
    measure.server_for(tmp_path / "store", tmp_path / "w", None, user_config)
    assert seen["base_config"] == user_config
    assert seen["properties"] == {}  # nothing of the tool's over the user's settings
    measure.server_for(tmp_path / "store", tmp_path / "w2", None)
    assert seen["base_config"] is None and seen["properties"]["job_queue_size"] == "1000"


def tiny_mar(path: Path) -> Path:
    manifest = {"model": {"modelName": "m", "handler": "h.py", "configFile": "model-config.yaml"}}
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("h.py", "class H: pass\n")
        mar.writestr("model-config.yaml", yaml.safe_dump({"batchSize": 4}))
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


RATES = {"plain-r1": 100.0, "ours-r1": 150.0, "plain-r2": 90.0, "ours-r2": 160.0}
RATES |= {"plain1-r1": 120.0, "plain1-r2": 110.0}


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
        (1, "plain1", 120.0),
        (2, "ours", 160.0),
        (2, "plain", 90.0),
        (2, "plain1", 110.0),
    ]


def test_the_benchmark_refuses_an_out_it_cannot_make_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(benchmark, "measure", fake_measure(blocker, {}))  # never called
    assert benchmark.run(benchmark_args(tmp_path, blocker / "out"), None, tmp_path) == 2
    assert f"--out {blocker / 'out'}: cannot create it" in capsys.readouterr().err
