""".mar repackaging with a micro-batching override (ts_microbatch.tools.mar): the override
lands where TorchServe reads it, and every other entry comes out unchanged."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from ts_microbatch.tools.mar import MarError, merge, override_mar

WEIGHTS = bytes(range(256)) * 64
HANDLER = b"class H:\n    pass\n"


def build_mar(
    path: Path, *, json_section: Any = None, model_yaml: Any = None, config_file: bool = True
) -> Path:
    """A tiny .mar: a manifest, a handler, stored weights, and the configs asked for."""
    manifest: dict[str, Any] = {"model": {"modelName": "tiny", "handler": "handler.py"}}
    if model_yaml is not None and config_file:
        manifest["model"]["configFile"] = "model-config.yaml"
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("handler.py", HANDLER, compress_type=zipfile.ZIP_DEFLATED)
        mar.writestr("weights.pt", WEIGHTS, compress_type=zipfile.ZIP_STORED)
        if model_yaml is not None:
            text = yaml.safe_dump(model_yaml, sort_keys=False)
            mar.writestr("model-config.yaml", text, compress_type=zipfile.ZIP_DEFLATED)
        if json_section is not None:
            mar.writestr("micro_batching.json", json.dumps(json_section))
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


def entries(path: Path) -> dict[str, tuple[bytes, int]]:
    with zipfile.ZipFile(path) as mar:
        return {i.filename: (mar.read(i), i.compress_type) for i in mar.infolist()}


def names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as mar:
        return mar.namelist()


def test_override_lands_in_micro_batching_json_when_only_it_is_there(tmp_path: Path) -> None:
    section = {"micro_batch_size": 4, "parallelism": {"preprocess": 2, "postprocess": 2}}
    source = build_mar(tmp_path / "in.mar", json_section=section)
    target = tmp_path / "out.mar"
    effective = override_mar(source, target, {"parallelism": {"preprocess": 1}, "enabled": False})
    expected = {
        "micro_batch_size": 4,
        "parallelism": {"preprocess": 1, "postprocess": 2},  # merged stage by stage
        "enabled": False,
    }
    assert effective == expected
    before, after = entries(source), entries(target)
    assert json.loads(after.pop("micro_batching.json")[0]) == expected
    before.pop("micro_batching.json")
    assert after == before  # contents and compression of everything else
    assert names(target) == names(source)


def test_override_goes_into_the_yaml_section_which_wins(tmp_path: Path) -> None:
    model_yaml = {
        "minWorkers": 1,
        "batchSize": 8,
        "micro_batching": {"micro_batch_size": 2, "parallelism": {"inference": 1}},
        "handler": {"max_length": 128},
    }
    json_section = {"micro_batch_size": 16, "timeout_s": 5}
    source = build_mar(tmp_path / "in.mar", json_section=json_section, model_yaml=model_yaml)
    target = tmp_path / "out.mar"
    effective = override_mar(
        source, target, {"order": "arrival"}, frontend={"batchSize": 32, "maxBatchDelay": 20}
    )
    after = entries(target)
    written = yaml.safe_load(after["model-config.yaml"][0])
    assert written == {
        **model_yaml,
        "batchSize": 32,
        "maxBatchDelay": 20,
        "micro_batching": {**model_yaml["micro_batching"], "order": "arrival"},
    }
    # micro_batching.json is left as it was: the YAML wins key by key over it
    assert json.loads(after["micro_batching.json"][0]) == json_section
    assert effective == {
        "micro_batch_size": 2,
        "timeout_s": 5,
        "parallelism": {"inference": 1},
        "order": "arrival",
    }
    before = entries(source)
    for name in ("handler.py", "weights.pt", "MAR-INF/MANIFEST.json", "micro_batching.json"):
        assert after[name] == before[name]


def test_a_mar_without_micro_batching_config_gets_a_json(tmp_path: Path) -> None:
    source = build_mar(tmp_path / "in.mar", model_yaml={"batchSize": 4})
    target = tmp_path / "out.mar"
    assert override_mar(source, target, {"enabled": False}) == {"enabled": False}
    after = entries(target)
    assert json.loads(after["micro_batching.json"][0]) == {"enabled": False}
    assert yaml.safe_load(after["model-config.yaml"][0]) == {"batchSize": 4}  # untouched
    assert names(target) == names(source) + ["micro_batching.json"]


def test_frontend_settings_on_a_mar_without_yaml_add_one_to_the_manifest(tmp_path: Path) -> None:
    source = build_mar(tmp_path / "in.mar", json_section={"micro_batch_size": 4})
    target = tmp_path / "out.mar"
    override_mar(source, target, None, frontend={"batchSize": 16})
    after = entries(target)
    manifest = json.loads(after["MAR-INF/MANIFEST.json"][0])
    assert manifest["model"]["configFile"] == "model-config.yaml"
    assert yaml.safe_load(after["model-config.yaml"][0]) == {"batchSize": 16}
    assert after["micro_batching.json"] == entries(source)["micro_batching.json"]


def test_a_model_directory_is_read_like_a_mar(tmp_path: Path) -> None:
    source = build_mar(tmp_path / "in.mar", json_section={"micro_batch_size": 4})
    unpacked = tmp_path / "model"
    with zipfile.ZipFile(source) as mar:
        mar.extractall(unpacked)
    target = tmp_path / "out.mar"
    assert override_mar(unpacked, target, {"micro_batch_size": 8}) == {"micro_batch_size": 8}
    after = entries(target)
    assert after["weights.pt"][0] == WEIGHTS and after["handler.py"][0] == HANDLER


def test_not_a_mar(tmp_path: Path) -> None:
    junk = tmp_path / "junk.mar"
    junk.write_bytes(b"not a zip")
    with pytest.raises(MarError, match="cannot read as a .mar"):
        override_mar(junk, tmp_path / "out.mar", {})
    empty = tmp_path / "empty.mar"
    with zipfile.ZipFile(empty, "w") as mar:
        mar.writestr("handler.py", HANDLER)
    with pytest.raises(MarError, match="no MAR-INF/MANIFEST.json"):
        override_mar(empty, tmp_path / "out.mar", {})


def test_merge_is_key_by_key_for_objects_only() -> None:
    base = {"a": {"x": 1, "y": 2}, "b": [1], "c": None}
    assert merge(base, {"a": {"y": 3}, "b": [2], "c": {"z": 1}}) == {
        "a": {"x": 1, "y": 3},
        "b": [2],
        "c": {"z": 1},
    }
    assert base == {"a": {"x": 1, "y": 2}, "b": [1], "c": None}  # not modified
