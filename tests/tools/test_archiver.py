"""torch-model-archiver in a staging folder of its own (ts_microbatch.tools.bundle.run_archiver)."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import pytest

from ts_microbatch.tools.bundle import ArchiverError, run_archiver


def test_hang_a_build_deleted_another_builds_staging_folder(tmp_path: Path) -> None:
    # torch-model-archiver stages in <temp dir>/<model name> and deletes it first: a build of
    # the same name running beside it (a test run, the user's own build) lost its files.
    name = "tsmb-staging-probe"
    other = Path(tempfile.gettempdir()) / name
    other.mkdir(exist_ok=True)
    (other / "another_builds_handler.py").write_text("# mid-build\n")
    handler = tmp_path / "handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    try:
        run_archiver(
            ["--model-name", name, "--version", "1.0", "--handler", str(handler),
             "--export-path", str(tmp_path), "--force"]
        )  # fmt: skip
        assert (other / "another_builds_handler.py").exists()
        with zipfile.ZipFile(tmp_path / f"{name}.mar") as mar:
            assert "handler.py" in mar.namelist()
    finally:
        for leftover in other.iterdir():
            leftover.unlink()
        other.rmdir()


def test_a_failed_build_says_why(tmp_path: Path) -> None:
    with pytest.raises(ArchiverError, match="torch-model-archiver --model-name m"):
        run_archiver(["--model-name", "m", "--version", "1.0", "--handler", "/no/such.py",
                      "--export-path", str(tmp_path)])  # fmt: skip
