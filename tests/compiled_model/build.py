"""Lays out TinyNet as TorchServe extracts a .mar, or archives it, for the compile tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

HERE = Path(__file__).resolve().parent
WEIGHTS = "tiny.pt"


def eager_model() -> torch.nn.Module:
    """The model the weights come from, uncompiled: the reference for every answer."""
    sys.path.insert(0, str(HERE))
    try:
        from tiny_net import TinyNet
    finally:
        sys.path.remove(str(HERE))
    torch.manual_seed(0)
    return TinyNet().eval()


def model_config(micro_batching: dict[str, Any], compiled: bool = True, **top: Any) -> str:
    config: dict[str, Any] = {"micro_batching": micro_batching, **top}
    if compiled:
        config["pt2"] = {"compile": {"enable": True, "backend": "inductor", "dynamic": False}}
    return yaml.safe_dump(config)


def model_dir(directory: Path, config_yaml: str) -> Path:
    """``directory`` laid out as TorchServe extracts a .mar."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tiny_net.py", "tiny_handler.py"):
        shutil.copy(HERE / name, directory / name)
    torch.save(eager_model().state_dict(), directory / WEIGHTS)
    (directory / "model-config.yaml").write_text(config_yaml)
    (directory / "MAR-INF").mkdir(exist_ok=True)
    manifest = {
        "model": {
            "modelName": "tiny",
            "serializedFile": WEIGHTS,
            "modelFile": "tiny_net.py",
            "handler": "tiny_handler.py",
            "configFile": "model-config.yaml",
        }
    }
    (directory / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    return directory


def build_mar(store: Path, work: Path, name: str, config_yaml: str) -> Path:
    """``store/<name>.mar`` of TinyNet with ``config_yaml`` as its model-config.yaml."""
    work.mkdir(parents=True, exist_ok=True)
    torch.save(eager_model().state_dict(), work / WEIGHTS)
    (work / "model-config.yaml").write_text(config_yaml)
    archiver = Path(sys.executable).with_name("torch-model-archiver")
    subprocess.run(
        [
            str(archiver),
            "--force",
            "--model-name",
            name,
            "--version",
            "1.0",
            "--model-file",
            str(HERE / "tiny_net.py"),
            "--serialized-file",
            str(work / WEIGHTS),
            "--handler",
            str(HERE / "tiny_handler.py"),
            "--config-file",
            str(work / "model-config.yaml"),
            "--export-path",
            str(store),
            "--archive-format",
            "zip-store",
        ],
        check=True,
    )
    return store / f"{name}.mar"
