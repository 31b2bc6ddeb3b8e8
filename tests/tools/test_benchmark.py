"""ts-microbatch-benchmark, a user's own .mar (ts_microbatch.tools.benchmark, also
benchmark-ab.py --mar) and body names: the arguments, the variants and their repackaged
settings, the rows' grouping and ratios, and that a user's body is named after its file.
No TorchServe here, no timings."""

from __future__ import annotations

import argparse
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import load_module
from ts_microbatch.tools import METRICS_YAML, benchmark, runs
from ts_microbatch.tools.corpus import read_corpus
from ts_microbatch.tools.mar import override_mar, read_entries, settings_of
from ts_microbatch.tools.measure import server_for, settled_scrape
from ts_microbatch.tools.server import read_properties

bench = load_module("benchmarks/bench_lib.py", "bench_lib")
text_study = load_module("benchmarks/text_lengths.py", "text_lengths")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    benchmark.add_arguments(p)
    return p


def tiny_mar(path: Path) -> Path:
    manifest = {"model": {"modelName": "m", "handler": "h.py", "configFile": "model-config.yaml"}}
    model_yaml = {"batchSize": 8, "micro_batching": {"micro_batch_size": 2}}
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("h.py", "class H: pass\n")
        mar.writestr("model-config.yaml", yaml.safe_dump(model_yaml))
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


def test_variants_are_the_baseline_the_mar_as_packaged_and_named_overrides(
    tmp_path: Path,
) -> None:
    args = parser().parse_args(
        [
            "--mar",
            "m.mar",
            "--corpus",
            "texts.jsonl",
            "--variant",
            'arrival={"order": "arrival"}',
            "--variant",
            'mbs8={"micro_batch_size": 8, "parallelism": {"preprocess": 2}}',
        ]
    )
    assert benchmark.variants_of(args) == [
        ("plain", {"enabled": False}),
        ("plain1", {"enabled": False}),
        ("ours", None),
        ("arrival", {"order": "arrival"}),
        ("mbs8", {"micro_batch_size": 8, "parallelism": {"preprocess": 2}}),
    ]
    args.no_baseline = True
    assert [n for n, _ in benchmark.variants_of(args)][0] == "ours"
    for bad in ("plain={}", "plain1={}", "x", "x=[1]", "x={not json", "a b={}"):
        with pytest.raises(argparse.ArgumentTypeError):
            benchmark.parse_variant(bad)
    with pytest.raises(SystemExit):
        parser().parse_args(["--mar", "m.mar", "--corpus", "a", "--body", "b"])


def test_each_variant_is_the_same_mar_with_its_override_and_the_same_frontend(
    tmp_path: Path,
) -> None:
    mar = tiny_mar(tmp_path / "m.mar")
    args = parser().parse_args(["--mar", str(mar), "--body", "x.txt", "--max-batch-delay", "0"])
    frontend = benchmark.frontend_of(args, mar)
    assert frontend == {"batchSize": 8, "maxBatchDelay": 0}  # the .mar's, then the flag
    args = parser().parse_args(["--mar", str(mar), "--body", "x.txt", "--batch-size", "32"])
    assert benchmark.frontend_of(args, mar) == {"batchSize": 32, "maxBatchDelay": 50}
    effective = {}
    for name, override in benchmark.variants_of(
        parser().parse_args(["--mar", str(mar), "--variant", 'mbs8={"micro_batch_size": 8}'])
    ):
        effective[name] = override_mar(mar, tmp_path / f"{name}.mar", override, frontend)
    assert effective == {
        "plain": {"micro_batch_size": 2, "enabled": False},
        "plain1": {"micro_batch_size": 2, "enabled": False},
        "ours": {"micro_batch_size": 2},
        "mbs8": {"micro_batch_size": 8},
    }
    for name in effective:
        written = settings_of(read_entries(tmp_path / f"{name}.mar"))["yaml"]
        assert (written["batchSize"], written["maxBatchDelay"]) == (8, 0)
    assert benchmark.shown(effective["plain"]) == ("off", "-")
    assert benchmark.shown({"micro_batch_size": 4, "parallelism": {"preprocess": 2}}) == (
        4,
        "2/1/1",
    )


def test_rows_of_variants_group_by_load_and_compare_with_the_baseline() -> None:
    load = {"body": "texts.jsonl: 3 bodies", "batch_size": 16, "max_batch_delay": 20}
    measured: list[dict[str, Any]] = [
        {
            "scenario": "mar",
            "handler": h,
            "repeat": r,
            "requests_per_s": rate,
            "p99_ms": p99,
            "concurrency": 32,
            "micro_batch_size": mbs,
            "parallelism": "1/1/1",
            **load,
        }
        for h, mbs, r, rate, p99 in [
            ("plain", "off", 1, 100.0, 400.0),
            ("ours", 4, 1, 150.0, 200.0),
            ("mbs8", 8, 1, 120.0, 300.0),
            ("plain", "off", 2, 80.0, 500.0),
            ("ours", 4, 2, 160.0, 250.0),
            ("mbs8", 8, 2, 100.0, 400.0),
        ]
    ]
    rows = runs.medians(measured, runs.load_tag)
    assert [(r["handler"], r["runs"]) for r in rows] == [
        ("plain", [100.0, 80.0]),
        ("ours", [150.0, 160.0]),
        ("mbs8", [120.0, 100.0]),
    ]
    pairs = [("ours", "plain"), ("mbs8", "plain")]
    ours, mbs8 = runs.compare_rounds(measured, pairs, runs.load_tag)
    assert [r["throughput"] for r in ours["rounds"]] == pytest.approx([1.5, 2.0])
    assert mbs8["comparison"] == "mbs8 / plain" and mbs8["body"] == load["body"]
    assert mbs8["median_p99"] == pytest.approx((0.75 + 0.8) / 2)


def test_a_user_input_is_named_after_its_file_never_720px(tmp_path: Path) -> None:
    body = tmp_path / "review.txt"
    body.write_text("a fine film")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"input": str(body), "requests": 100}))
    points = bench.sweep_points(bench.load_config(path))
    assert [p["body"] for p in points] == ["review.txt"]
    assert "720px" not in bench.point_tag(points[0])
    assert "." not in bench.point_tag(points[0])  # a TorchServe model name
    path.write_text(json.dumps({"input": str(body), "bodies": ["720px"]}))
    with pytest.raises(bench.BenchConfigError, match="expected one of review.txt"):
        bench.load_config(path)
    path.write_text(json.dumps({"input": str(body), "bodies": ["mix"]}))
    with pytest.raises(bench.BenchConfigError, match='"mix" cannot be sent with "input"'):
        bench.load_config(path)
    # the built-in images keep their size names
    path.write_text(json.dumps({"bodies": ["720px", "12mp"]}))
    assert [p["body"] for p in bench.sweep_points(bench.load_config(path))] == ["720px", "12mp"]


def test_the_text_corpus_step_writes_the_mix_it_is_given(tmp_path: Path) -> None:
    mix = text_study.parse_mix("70:8-64,25:65-256,5:257-512")
    assert mix == [(70.0, 8, 64), (25.0, 65, 256), (5.0, 257, 512)]
    for bad in ("70:8", "x:1-2", "0:1-2", "10:5-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            text_study.parse_mix(bad)

    def stand_in(seed: int, n_words: int) -> str:
        return " ".join(f"w{seed}" for _ in range(n_words))

    out = tmp_path / "corpus"
    paths = text_study.write_corpus(out, mix, 40, stand_in, seed=3)
    words = [len(p.read_text().split()) for p in paths]
    assert [p.name.split("-")[1] for p in paths] == [f"{n}w.txt" for n in words]
    assert (sum(n <= 64 for n in words), sum(64 < n <= 256 for n in words)) == (28, 10)
    assert sum(n > 256 for n in words) == 2
    again = text_study.write_corpus(tmp_path / "again", mix, 40, stand_in, seed=3)
    assert [p.read_text() for p in again] == [p.read_text() for p in paths]
    corpus = read_corpus(out)
    assert corpus.label.startswith("corpus: 40 bodies, ") and " chars, median " in corpus.label


def test_a_server_without_a_users_config_declares_the_pipelines_metrics(tmp_path: Path) -> None:
    # Without --ts-config the per-stage columns came out empty: TorchServe's default
    # metrics config does not declare the pipeline's metrics.
    written = server_for(tmp_path / "store", tmp_path / "work", "prometheus").write_config()
    assert read_properties(written)["metrics_config"] == str(METRICS_YAML)
    assert METRICS_YAML.is_file()
    own = tmp_path / "config.properties"
    own.write_text("metrics_config=/etc/ts/metrics.yaml\n")
    written = server_for(tmp_path / "store", tmp_path / "work2", "prometheus", own).write_config()
    assert read_properties(written)["metrics_config"] == "/etc/ts/metrics.yaml"


def test_a_settled_scrape_waits_for_the_worker_s_next_interval_of_metric_lines() -> None:
    # A short run (a new user's 200 requests) was scraped before the worker's interval of
    # lines was sent (every metrics_interval_s, 1 s): two scrapes 0.25 s apart agreed, and
    # mean_micro_batch_size read nan. Here the lines arrive 1 s after the first scrape.
    class Server:
        def __init__(self) -> None:
            self.scrapes: list[float] = []

        def scrape_metrics(self) -> str:
            now = time.monotonic()
            self.scrapes.append(now)
            sent = now - self.scrapes[0] >= 1.0
            return "MicroBatchSize_total 17.0\n" if sent else "MicroBatchSize_total 1.0\n"

    server = Server()
    text = settled_scrape(server, timeout_s=30)
    assert server.scrapes[-1] - server.scrapes[0] >= 1.0  # the scenario: the lines came late
    assert text == "MicroBatchSize_total 17.0\n"


class ScalingServer:
    """TorchServe's management API as served_workers sees it: the .mar's count of workers
    started, and a PUT that scales to what it was asked, or to ``cap`` at most."""

    def __init__(self, started: int, cap: int = 8) -> None:
        self.workers, self.cap = started, cap
        self.puts: list[int] = []

    def describe(self, model: str) -> dict[str, Any]:
        return {"workers": [{"pid": 100 + i} for i in range(self.workers)]}

    def scale(self, model: str, workers: int) -> Any:
        self.puts.append(workers)
        self.workers = min(workers, self.cap)
        return argparse.Namespace(status=200, body=b"{}")


def test_a_run_gets_the_workers_asked_for_whatever_the_mar_says_and_the_mar_s_by_default() -> None:
    from ts_microbatch.tools.measure import RegistrationError, served_workers

    # The .mar's model-config.yaml started one (minWorkers 1 wins over initial_workers).
    server = ScalingServer(started=1)
    assert len(served_workers(server, "m", 2)["workers"]) == 2
    assert server.puts == [2]
    left = ScalingServer(started=3)
    assert len(served_workers(left, "m", None)["workers"]) == 3
    assert len(served_workers(left, "m", 3)["workers"]) == 3
    assert left.puts == []
    with pytest.raises(RegistrationError, match="1 workers, not the 4 asked for"):
        served_workers(ScalingServer(started=1, cap=1), "m", 4)


def test_workers_are_the_mar_s_unless_told_and_at_least_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["--mar", "m.mar", "--corpus", "texts/"]
    assert parser().parse_args(base).workers is None
    assert parser().parse_args([*base, "--workers", "2"]).workers == 2
    for bad in ("0", "two"):
        with pytest.raises(SystemExit):
            parser().parse_args([*base, "--workers", bad])
        assert (
            f"argument --workers: expected an integer >= 1, got '{bad}'" in capsys.readouterr().err
        )
