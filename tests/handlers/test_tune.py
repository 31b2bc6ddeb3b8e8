"""The tuner on a real .mar (the text example), in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module
from ts_microbatch import load_config
from ts_microbatch.tune import main

text_build = load_module("examples/text_classifier/build_mar.py", "ts_microbatch_text_build_mar")


def test_tuner_ranks_the_grid_and_writes_a_valid_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mar = text_build.build_mar(str(tmp_path), work_dir=tmp_path / "work")
    out = tmp_path / "micro_batching.json"
    code = main(
        [
            "--mar",
            str(mar),
            "--input",
            str(Path(ROOT, "examples/text_classifier/sample.txt")),
            "--batch-size",
            "16",
            "--micro-batch-sizes",
            "1,4,16,64",
            "--threads",
            "1,2",
            "--repeats",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("requests/s,") == 6  # sizes above the batch size are dropped: 3 x 2
    table = [line for line in printed.splitlines() if line[:4].strip().isdigit() and " | " in line]
    rates = [float(line.split("|")[3]) for line in table]
    assert len(rates) == 6 and rates == sorted(rates, reverse=True)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "micro_batching.json").write_text(out.read_text())
    config = load_config(tmp_path / "model")
    best = table[0].split("|")
    assert config.micro_batch_size == int(best[1]) and config.micro_batch_size in (1, 4, 16)
    assert json.loads(out.read_text())["parallelism"]["inference"] == 1


def test_tuner_refuses_a_handler_without_micro_batching(tmp_path: Path) -> None:
    handler = tmp_path / "plain_handler.py"
    handler.write_text(
        "from ts.torch_handler.base_handler import BaseHandler\n\n"
        "class Plain(BaseHandler):\n    def initialize(self, context):\n"
        "        self.initialized = True\n"
    )
    import subprocess
    import sys

    work = tmp_path / "store"
    work.mkdir()
    subprocess.run(
        [
            str(Path(sys.executable).with_name("torch-model-archiver")),
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
        ],
        check=True,
    )
    with pytest.raises(SystemExit, match="does not use ts_microbatch"):
        main(["--mar", str(work / "plain"), "--input", str(handler), "--batch-size", "2"])
