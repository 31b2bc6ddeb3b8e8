"""The KServe bundle: what the .mar carries, what config.properties says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.helpers import ROOT
from ts_microbatch.tools import METRICS_YAML
from ts_microbatch.tools.bundle import kserve_properties, path_keys, vendor, write_bundle


def test_the_mar_carries_core_and_torchserve_and_no_tools(tmp_path: Path) -> None:
    vendor(tmp_path)
    package = tmp_path / "ts_microbatch"
    files = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    assert {
        "__init__.py",
        "core/pipeline.py",
        "torchserve/micro_batching.py",
        "torchserve/mixin.py",
        "torchserve/kserve.py",
    } <= files
    assert not any(f.startswith("tools/") for f in files)
    # The vendored copy imports on its own, as a worker imports it: tools/ is never reached.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import ts_microbatch;"
        "from ts_microbatch import MicroBatching, MicroBatchingMixin;"
        "assert ts_microbatch.__file__.startswith(sys.argv[1]), ts_microbatch.__file__;"
        "assert not [m for m in sys.modules if m.startswith('ts_microbatch.tools')]"
    )
    subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)], check=True)


def test_config_properties_as_kserve_runs_them() -> None:
    text = kserve_properties("m.mar", "m", batch_size=32, max_batch_delay_ms=50)
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["inference_address"] == "http://0.0.0.0:8085"
    assert props["enable_envvars_config"] == "false"  # TS_SERVICE_ENVELOPE stays unread
    assert props["metrics_mode"] == "prometheus"
    model = json.loads(props["model_snapshot"])["models"]["m"]["1.0"]
    assert model["batchSize"] == 32 and model["maxBatchDelay"] == 50
    assert model["marName"] == "m.mar" and model["minWorkers"] == 1


def path_entries(properties: str) -> dict[str, str]:
    """Every *_config / *_path / model_store key of a config.properties text whose value is
    not a true/false switch (enable_envvars_config is a *_config key that names no file)."""
    entries = {}
    for line in properties.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        names_a_path = re.search(r"(_config|_path)$", key) or key == "model_store"
        if names_a_path and value.lower() not in ("true", "false"):
            entries[key] = value
    return entries


def write_fake_bundle(tmp_path: Path, **kwargs: Any) -> Path:
    mar = tmp_path / "m.mar"
    mar.write_bytes(b"a .mar")
    metrics = tmp_path / "metrics.yaml"
    metrics.write_text("dimensions: []\n")
    return write_bundle(
        tmp_path / "mnt" / "models",
        mar,
        "m",
        metrics,
        batch_size=8,
        max_batch_delay_ms=50,
        **kwargs,
    )


def test_defect_relative_metrics_config_every_path_is_absolute_under_the_mount() -> None:
    # metrics_config=metrics.yaml was resolved against the pod's working directory
    # (/home/model-server), where no metrics.yaml exists: the worker never loaded.
    props = kserve_properties("m.mar", "m", batch_size=32, max_batch_delay_ms=50)
    entries = path_entries(props)
    assert set(entries) == {"metrics_config", "model_store"}, entries
    assert entries == {
        "metrics_config": "/mnt/models/config/metrics.yaml",
        "model_store": "/mnt/models/model-store",
    }


def test_the_written_config_names_absolute_paths_that_exist_where_the_mount_maps_them(
    tmp_path: Path,
) -> None:
    mount = tmp_path / "mnt" / "models"
    out = write_fake_bundle(tmp_path, mount_path=str(mount))
    entries = path_entries((out / "config" / "config.properties").read_text())
    assert entries, "no path keys: the check would prove nothing"
    for key, value in entries.items():
        assert PurePosixPath(value).is_absolute(), (key, value)
        assert Path(value).is_relative_to(mount), (key, value)
        assert Path(value).exists(), (key, value)  # the bundle holds what the config names
    assert (Path(entries["model_store"]) / "m.mar").read_bytes() == b"a .mar"


def test_the_mount_path_is_refused_unless_absolute(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mount_path: got 'mnt/models'"):
        kserve_properties("m.mar", "m", batch_size=1, max_batch_delay_ms=1, mount_path="mnt/models")
    with pytest.raises(ValueError):
        write_fake_bundle(tmp_path, mount_path="models")
    assert not (tmp_path / "mnt").exists()  # nothing half-written


def test_the_cli_writes_paths_under_mount_path(tmp_path: Path) -> None:
    mar = tmp_path / "m.mar"
    mar.write_bytes(b"a .mar")
    out = tmp_path / "bundle"
    args = [
        sys.executable,
        "-m",
        "ts_microbatch.tools.bundle",
        "--out",
        str(out),
        "--mar",
        str(mar),
    ]
    args += ["--model-name", "m", "--metrics-yaml", str(Path(ROOT) / "configs/metrics.yaml")]
    subprocess.run([*args, "--mount-path", "/srv/models"], check=True, capture_output=True)
    entries = path_entries((out / "config" / "config.properties").read_text())
    assert entries["metrics_config"] == "/srv/models/config/metrics.yaml"
    refused = subprocess.run([*args, "--mount-path", "models"], capture_output=True, text=True)
    assert refused.returncode == 2 and "expected an absolute path" in refused.stderr


def test_path_keys_finds_the_keys_the_test_reads() -> None:
    props = kserve_properties("m.mar", "m", batch_size=32, max_batch_delay_ms=50)
    assert path_keys(props) == path_entries(props)


def test_the_cli_declares_the_pipelines_metrics_without_being_told(tmp_path: Path) -> None:
    mar = tmp_path / "m.mar"
    mar.write_bytes(b"a .mar")
    out = tmp_path / "bundle"
    args = ["--out", str(out), "--mar", str(mar), "--model-name", "m"]
    subprocess.run(
        [sys.executable, "-m", "ts_microbatch.tools.bundle", *args],
        check=True,
        capture_output=True,
        cwd=tmp_path,  # nothing found relative to a checkout
    )
    assert (out / "config" / "metrics.yaml").read_bytes() == METRICS_YAML.read_bytes()
