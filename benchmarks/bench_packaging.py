"""Packaging for benchmark-ab.py: each handler and scenario as a model directory in a store
(no zip: large weights pack slowly), and a user's .mar with one micro-batching config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import prepare
import yaml

from ts_microbatch.core.config import CONFIG_FILE_NAME, MicroBatchingConfig
from ts_microbatch.tools.bundle import run_archiver
from ts_microbatch.tools.inprocess import model_dir_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HANDLER_FILES = {
    "plain": "image_classifier",
    "upstream": str(HERE / "handlers/upstream_mb_handler.py"),
    "ours": str(ROOT / "handlers/micro_batching_handler.py"),
    "ours-same": str(ROOT / "handlers/micro_batching_handler.py"),
    "noop": str(HERE / "handlers/noop_handler.py"),
}


def model_yaml(config: dict[str, Any], point: dict[str, Any], handler: str) -> dict[str, Any]:
    """model-config.yaml for one run: the frontend settings and the micro-batching config
    (upstream's handler reads only micro_batch_size and parallelism from it)."""
    settings = point["micro_batching"]
    if handler == "upstream":
        effective = MicroBatchingConfig.from_mapping(settings)
        settings = {
            "micro_batch_size": effective.micro_batch_size,
            "parallelism": effective.parallelism.as_dict(),
        }
    model: dict[str, Any] = {
        "minWorkers": point["workers"],
        "maxWorkers": point["workers"],
        "batchSize": point["batch_size"],
        "maxBatchDelay": point["max_batch_delay"],
        "responseTimeout": config["response_timeout"],
        "micro_batching": settings,
    }
    if handler == "ours":
        model["handler"] = {"decoder": config["decoder"]}
    elif handler == "ours-same":  # upstream's stages exactly: ImageClassifier's decoding
        model["handler"] = {"decoder": "pil", "exif_orientation": False}
    return model


def package(
    store: Path,
    work: Path,
    name: str,
    scenario: str,
    handler: str,
    config: dict[str, Any],
    point: dict[str, Any],
    weights: str | None,
) -> str:
    """An unarchived model directory in the store (no zip: large weights pack slowly)."""
    work.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    if scenario == "mar":
        return package_mar(store, work, name, config, point)
    import torch

    extra = [prepare.write_labels(str(work))]
    if scenario == "real":
        model_file = ROOT / "examples/image_classifier/model.py"
        serialized = work / "resnet18.pth"
        if not serialized.exists():  # made once per run; untrained unless --weights
            serialized = Path(prepare.write_weights(str(work), weights))
    else:
        model_file = HERE / "models/sim_accelerator.py"
        serialized = work / "sim.pth"
        torch.save({"scale": torch.ones(1)}, serialized)
        cost = work / "sim_accelerator.json"
        cost.write_text(json.dumps(config["accelerator"]))
        extra.append(str(cost))
    yaml_path = work / f"{name}.yaml"
    yaml_path.write_text(yaml.safe_dump(model_yaml(config, point, handler), sort_keys=False))
    cmd = [
        "--force",
        "--model-name",
        name,
        "--version",
        "1.0",
        "--handler",
        HANDLER_FILES[handler],
        "--config-file",
        str(yaml_path),
        "--export-path",
        str(store),
        "--archive-format",
        "no-archive",
    ]
    if handler != "noop":
        cmd += [
            "--model-file",
            str(model_file),
            "--serialized-file",
            str(serialized),
            "--extra-files",
            ",".join(extra),
        ]
    run_archiver(cmd)
    return name


def with_config(
    source: Path, target: Path, settings: dict[str, Any], frontend: dict[str, Any]
) -> Path:
    """A copy of the model directory ``source`` at ``target``, named after it, with
    ``settings`` in both micro_batching.json and model-config.yaml (where the YAML's section
    would otherwise win) and ``frontend`` (model-config.yaml keys such as batchSize)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    manifest_path = target / "MAR-INF" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["modelName"] = target.name
    config_file = manifest["model"].setdefault("configFile", "model-config.yaml")
    yaml_path = target / config_file
    model = yaml.safe_load(yaml_path.read_text()) if yaml_path.exists() else None
    model = {**(model or {}), **frontend, "micro_batching": settings}
    yaml_path.write_text(yaml.safe_dump(model, sort_keys=False))
    (target / CONFIG_FILE_NAME).write_text(json.dumps(settings, indent=4))
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return target


def package_mar(
    store: Path, work: Path, name: str, config: dict[str, Any], point: dict[str, Any]
) -> str:
    """The user's .mar (or model directory) as a model directory in the store, with this
    point's micro-batching config and frontend settings."""
    source = Path(config["mar"])
    if not source.is_dir():
        if not (work / "mar").exists():  # unpacked once per run
            model_dir_of(source, work / "mar")
        source = work / "mar"
    with_config(source, store / name, point["micro_batching"], model_yaml(config, point, "mar"))
    return name
