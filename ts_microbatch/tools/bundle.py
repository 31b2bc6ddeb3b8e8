"""Packaging: torch-model-archiver run safely, and a KServe storage layout
(``config/config.properties`` and a self-contained .mar).

KServe's TorchServe runtime starts a stock image; nothing installs this package there. So
the .mar carries the part of ts_microbatch a worker runs (``vendor``: ``core/`` and
``torchserve/``, never ``tools/``), and every path config.properties names is absolute under
the mount (``--mount-path``): TorchServe resolves a relative one against its working
directory, not the config file's. ``make kserve-bundle`` runs this; see deploy/kserve/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from . import METRICS_YAML
from ._cli import prog
from .results import OutputError, claimed_dir

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # ts_microbatch/
WORKER_WINGS = ("core", "torchserve")  # what a worker runs; tools/ never is
MOUNT_PATH = "/mnt/models"  # where KServe's storage initializer puts the storage URI
# The keys of config.properties that name a file or directory (TorchServe 0.12's
# *_config, *_path and model_store keys; the enable_*_config switches name none).
_PATH_KEY = re.compile(r"^(?!enable_).*(_config|_path)$|^model_store$")


class ArchiverError(RuntimeError):
    """torch-model-archiver exited with an error; the message carries what it printed."""


def run_archiver(args: Sequence[str]) -> None:
    """Runs the torch-model-archiver beside this interpreter with ``args``, in a temp dir of
    its own: it stages in ``<temp dir>/<model name>``, deleting that first, so two builds of
    one name at once would delete and fill each other's files.

    Raises:
        ArchiverError: it exited with an error (its output in the message).
    """
    archiver = str(Path(sys.executable).with_name("torch-model-archiver"))
    with tempfile.TemporaryDirectory(prefix="tsmb-archiver-") as staging:
        env = {**os.environ, "TMPDIR": staging}
        proc = subprocess.run([archiver, *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()
        raise ArchiverError(f"torch-model-archiver {' '.join(args[:4])}... failed:\n{output}")


def path_keys(properties: str) -> dict[str, str]:
    """The keys of a config.properties text that name a path, with their values."""
    lines = (line.split("=", 1) for line in properties.splitlines() if "=" in line)
    return {
        key.strip(): value.strip()
        for key, value in lines
        if not key.lstrip().startswith("#") and _PATH_KEY.match(key.strip())
    }


def vendor(dest: Path) -> Path:
    """Copies the worker's part of the package to ``dest/ts_microbatch``; returns ``dest``
    (for torch-model-archiver's --extra-files: a directory's contents land in the model root)."""
    target = dest / "ts_microbatch"
    shutil.rmtree(target, ignore_errors=True)
    files = ["__init__.py", "py.typed"]
    for wing in WORKER_WINGS:
        files += sorted(f"{wing}/{p.name}" for p in (PACKAGE_DIR / wing).glob("*.py"))
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PACKAGE_DIR / name, target / name)
    return dest


def kserve_properties(
    mar_name: str,
    model_name: str,
    *,
    batch_size: int,
    max_batch_delay_ms: int,
    min_workers: int = 1,
    max_workers: int = 1,
    response_timeout_s: int = 120,
    inference_port: int = 8085,
    metrics_port: int = 8082,
    mount_path: str = MOUNT_PATH,
) -> str:
    """config.properties for KServe's TorchServe runtime, the bundle seen at ``mount_path``.

    The model loads from ``model_snapshot`` (without maxBatchDelay TorchServe stops).
    ``enable_envvars_config=false`` keeps the runtime's ``TS_SERVICE_ENVELOPE`` from switching
    TorchServe's KServe envelope on (it answers only a batch's first request). The KServe
    wrapper sends no token, and only it reaches these addresses: token authorization is off.
    """
    mount = PurePosixPath(mount_path)
    if not mount.is_absolute():
        raise ValueError(f"mount_path: got {mount_path!r}, expected an absolute path")
    model = {
        "defaultVersion": True,
        "marName": mar_name,
        "minWorkers": min_workers,
        "maxWorkers": max_workers,
        "batchSize": batch_size,
        "maxBatchDelay": max_batch_delay_ms,
        "responseTimeout": response_timeout_s,
    }
    snapshot = {"name": "startup.cfg", "modelCount": 1, "models": {model_name: {"1.0": model}}}
    lines = {
        "inference_address": f"http://0.0.0.0:{inference_port}",
        "management_address": f"http://0.0.0.0:{inference_port}",
        "metrics_address": f"http://0.0.0.0:{metrics_port}",
        "grpc_inference_port": "7070",
        "grpc_management_port": "7071",
        "enable_metrics_api": "true",
        "metrics_mode": "prometheus",
        "metrics_config": str(mount / "config" / "metrics.yaml"),
        "number_of_netty_threads": "4",
        "job_queue_size": "1000",
        "max_request_size": "33554432",  # camera photos, base64-encoded (configs/config.properties)
        "enable_envvars_config": "false",
        "install_py_dep_per_model": "false",
        "disable_token_authorization": "true",
        "model_store": str(mount / "model-store"),
        "model_snapshot": json.dumps(snapshot, separators=(",", ":")),
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def write_bundle(
    out: Path,
    mar: Path,
    model_name: str,
    metrics_yaml: Path,
    *,
    mount_path: str = MOUNT_PATH,
    **settings: int,
) -> Path:
    """Writes ``out/config/config.properties`` (+ metrics.yaml) and ``out/model-store/``;
    ``out`` is what the pod will see at ``mount_path``."""
    properties = kserve_properties(mar.name, model_name, mount_path=mount_path, **settings)
    relative = {k: v for k, v in path_keys(properties).items() if not v.startswith("/")}
    if relative:  # resolved against the image's working directory, not the bundle's
        raise ValueError(f"config.properties names relative paths: {relative}")
    claimed_dir(out, "ts-microbatch-bundle")  # it overwrites: only in a folder it made
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "model-store").mkdir(parents=True, exist_ok=True)
    shutil.copy2(mar, out / "model-store" / mar.name)
    shutil.copy2(metrics_yaml, out / "config" / "metrics.yaml")
    (out / "config" / "config.properties").write_text(properties, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    description = "A KServe storage layout: config/config.properties and a self-contained .mar."
    parser = argparse.ArgumentParser(
        prog=prog("ts_microbatch.tools.bundle"), description=description
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mar", type=Path, required=True, help="a self-contained .mar")
    parser.add_argument("--model-name", required=True)
    what = "TorchServe's metrics config; the package's, declaring the pipeline's, by default"
    parser.add_argument("--metrics-yaml", type=Path, default=METRICS_YAML, help=what)
    what = f"where the pod sees --out; config.properties names paths under it ({MOUNT_PATH})"
    parser.add_argument("--mount-path", default=MOUNT_PATH, help=what)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-batch-delay", type=int, default=50)
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--max-workers", type=int, default=1)
    parser.add_argument("--response-timeout", type=int, default=120)
    args = parser.parse_args(argv)
    if not PurePosixPath(args.mount_path).is_absolute():
        parser.error(f"--mount-path: got {args.mount_path!r}, expected an absolute path")
    try:
        out = write_bundle(
            args.out,
            args.mar,
            args.model_name,
            args.metrics_yaml,
            mount_path=args.mount_path,
            batch_size=args.batch_size,
            max_batch_delay_ms=args.max_batch_delay,
            min_workers=args.min_workers,
            max_workers=args.max_workers,
            response_timeout_s=args.response_timeout,
        )
    except OutputError as err:
        parser.exit(2, f"error: {err}\n")
    print(f"KServe storage layout in {out}: config/config.properties, model-store/{args.mar.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
