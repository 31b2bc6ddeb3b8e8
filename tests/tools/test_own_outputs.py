"""The tools delete and overwrite only what they made (ts_microbatch.tools.results.claimed_dir):
a non-empty folder of the user's given as ``--out`` is refused before anything is touched;
a folder the tool made may be written again."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, load_module
from tests.tools.test_outputs import RATES, benchmark_args, fake_measure
from ts_microbatch.tools import benchmark, bundle
from ts_microbatch.tools.results import MARKER, OutputError, ResultsLog, claimed_dir

USERS_FILES = {
    "results.json": '{"mine": true}\n',
    "store/model.mar": "my own archive",
    "servers/notes.txt": "my notes",
}


def users_folder(path: Path) -> dict[str, str]:
    for name, text in USERS_FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return {name: (path / name).read_text() for name in USERS_FILES}


def test_benchmark_out_deleted_and_overwrote_a_users_folder_(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    before = users_folder(out)
    calls: list[Path] = []

    def measure(server_dir: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(server_dir)
        return {"requests_per_s": 1.0, "p99_ms": 1.0, "p50_ms": 1.0, "errors": 0}

    monkeypatch.setattr(benchmark, "measure", measure)
    assert benchmark.run(benchmark_args(tmp_path, out), None, tmp_path / "runs") == 2
    err = capsys.readouterr().err
    assert f"--out {out}: the folder is not empty" in err and "give another" in err
    assert calls == []  # refused before the first run
    assert {name: (out / name).read_text() for name in USERS_FILES} == before
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == sorted(
        ["results.json", "store", "store/model.mar", "servers", "servers/notes.txt"]
    )


def test_the_benchmark_writes_again_into_a_folder_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "runs" / "mine"
    monkeypatch.setattr(benchmark, "measure", fake_measure(out, RATES))
    reported: list[Path] = []
    monkeypatch.setattr(benchmark, "report", lambda args, out, *rest: reported.append(out))
    for _ in range(2):
        assert benchmark.run(benchmark_args(tmp_path, out), None, tmp_path / "runs") == 0
    assert reported == [out, out]
    assert len(ResultsLog(out / "results.jsonl").read()) == 12  # both runs' lines
    assert json.loads((out / MARKER).read_text()) == {"made_by": "ts-microbatch-benchmark"}


def test_a_folder_another_tool_made_is_refused_an_empty_one_taken(tmp_path: Path) -> None:
    assert claimed_dir(tmp_path / "new", "tool-a") == tmp_path / "new"
    (tmp_path / "new" / "results.json").write_text("{}")
    assert claimed_dir(tmp_path / "new", "tool-a").is_dir()
    with pytest.raises(OutputError, match="was made by tool-a"):
        claimed_dir(tmp_path / "new", "tool-b")
    (tmp_path / "empty").mkdir()
    claimed_dir(tmp_path / "empty", "tool-b")
    assert json.loads((tmp_path / "empty" / MARKER).read_text()) == {"made_by": "tool-b"}


def test_image_sizes_deleted_the_whole_out_folder_(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    image_sizes = load_module("benchmarks/image_sizes.py", "ts_microbatch_image_sizes_out")
    out = tmp_path / "mine"
    before = users_folder(out)

    class Stop(Exception):
        """The run got past its --out."""

    def build_example(*args: Any) -> tuple[Path, Path]:
        return tmp_path / "x.mar", tmp_path

    def shuffled_rounds(*args: Any) -> None:
        raise Stop

    monkeypatch.setattr(image_sizes, "build_example", build_example)
    monkeypatch.setattr(image_sizes, "shuffled_rounds", shuffled_rounds)
    argv = ["image_sizes.py", "--example", "object_detector", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert image_sizes.main() == 2
    assert f"--out {out}: the folder is not empty" in capsys.readouterr().err
    assert {name: (out / name).read_text() for name in USERS_FILES} == before
    # A folder it made is its own: written again, what an earlier run left there removed.
    fresh = tmp_path / "fresh"
    monkeypatch.setattr(sys, "argv", [*argv[:-1], str(fresh)])
    for _ in range(2):
        with pytest.raises(Stop):
            image_sizes.main()
        assert [p.name for p in fresh.iterdir()] == [MARKER]
        (fresh / "metrics").mkdir()


def test_benchmark_ab_config_deleted_a_users_store_and_work_folders_(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_module("benchmarks/benchmark-ab.py", "ts_microbatch_benchmark_ab_out")
    out = tmp_path / "mine"
    before = users_folder(out)
    (out / "work").mkdir()
    (out / "work" / "draft.txt").write_text("my draft")
    ran: list[Path] = []
    monkeypatch.setattr(bench.ab, "ab_problem", lambda: None)
    monkeypatch.setattr(bench, "run_all", lambda config, out, *rest: ran.append(out) or [])
    config = Path(ROOT, "benchmarks/config.json")
    monkeypatch.setattr(
        sys, "argv", ["benchmark-ab.py", "--config", str(config), "--out", str(out)]
    )
    assert bench.main() == 2
    assert ran == []
    assert f"--out {out}: the folder is not empty" in capsys.readouterr().err
    assert {name: (out / name).read_text() for name in USERS_FILES} == before
    assert (out / "work" / "draft.txt").read_text() == "my draft"


def test_bundle_wrote_over_a_users_config_and_mar_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mar = tmp_path / "m.mar"
    mar.write_bytes(b"the .mar to bundle")
    out = tmp_path / "storage"
    (out / "config").mkdir(parents=True)
    (out / "config" / "config.properties").write_text("inference_address=mine\n")
    argv = ["--out", str(out), "--mar", str(mar), "--model-name", "m"]
    with pytest.raises(SystemExit) as exited:
        bundle.main(argv)
    assert exited.value.code == 2
    assert f"--out {out}: the folder is not empty" in capsys.readouterr().err
    assert (out / "config" / "config.properties").read_text() == "inference_address=mine\n"
    assert not (out / "model-store").exists()
    fresh = tmp_path / "bundle"
    for _ in range(2):  # a bundle it wrote, written again
        assert bundle.main(["--out", str(fresh), *argv[2:]]) == 0
    assert (fresh / "model-store" / "m.mar").read_bytes() == b"the .mar to bundle"


def test_bundle_claimed_a_users_folder_that_held_none_of_its_files_(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A folder was another's only when it already held one of the bundle's three files: a
    # user's non-empty folder got the tool's marker, and from then on the bundle wrote over
    # the config/config.properties the user put there.
    mar = tmp_path / "m.mar"
    mar.write_bytes(b"the .mar to bundle")
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    argv = ["--out", str(out), "--mar", str(mar), "--model-name", "m"]
    assert not (out / MARKER).exists()  # the scenario: the user's, none of the bundle's files
    with pytest.raises(SystemExit) as exited:
        bundle.main(argv)
    assert exited.value.code == 2
    assert f"--out {out}: the folder is not empty and has no {MARKER}" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # no marker, nothing written
