"""Lays out TinyNet (or TinySeqNet, the token model) as TorchServe extracts a .mar, or
archives it, for the compile tests."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml

from ts_microbatch.tools.bundle import run_archiver

HERE = Path(__file__).resolve().parent
WEIGHTS = "tiny.pt"


class Model(NamedTuple):
    model_file: str
    handler: str
    cls: str


MODELS = {
    "tiny": Model("tiny_net.py", "tiny_handler.py", "TinyNet"),
    "tiny_seq": Model("tiny_seq_net.py", "tiny_seq_handler.py", "TinySeqNet"),
}


def eager_model(name: str = "tiny") -> torch.nn.Module:
    """The model the weights come from, uncompiled: the reference for every answer."""
    model = MODELS[name]
    sys.path.insert(0, str(HERE))
    try:
        module = __import__(model.model_file[:-3])
    finally:
        sys.path.remove(str(HERE))
    torch.manual_seed(0)
    return getattr(module, model.cls)().eval()  # type: ignore[no-any-return]


def model_config(micro_batching: dict[str, Any], compiled: bool = True, **top: Any) -> str:
    config: dict[str, Any] = {"micro_batching": micro_batching, **top}
    if compiled:
        config["pt2"] = {"compile": {"enable": True, "backend": "inductor", "dynamic": False}}
    return yaml.safe_dump(config)


def model_dir(directory: Path, config_yaml: str, name: str = "tiny") -> Path:
    """``directory`` laid out as TorchServe extracts a .mar of model ``name``."""
    model = MODELS[name]
    directory.mkdir(parents=True, exist_ok=True)
    for file in (model.model_file, model.handler):
        shutil.copy(HERE / file, directory / file)
    torch.save(eager_model(name).state_dict(), directory / WEIGHTS)
    (directory / "model-config.yaml").write_text(config_yaml)
    (directory / "MAR-INF").mkdir(exist_ok=True)
    manifest = {
        "model": {
            "modelName": name,
            "serializedFile": WEIGHTS,
            "modelFile": model.model_file,
            "handler": model.handler,
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
    run_archiver(
        [
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
        ]
    )
    return store / f"{name}.mar"
