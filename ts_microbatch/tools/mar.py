"""A user's .mar and its variants: the .mar repackaged with overrides, nothing else changed.

The variants ts-microbatch-benchmark serves: ``ours`` as packaged, ``plain`` with
``PLAIN_OVERRIDE`` (the handler's own stages on the whole batch) and each named on the
command line. An override goes where TorchServe reads it: model-config.yaml's
``micro_batching`` section when there is one (it wins key by key over micro_batching.json),
else micro_batching.json, which is added if missing; mappings merge key by key. A swapped-in
handler is added at the root and named in the manifest, the old one kept so it can be
subclassed. Every other entry is copied unchanged, in its order and compression.
"""

from __future__ import annotations

import copy
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.config import CONFIG_FILE_NAME, YAML_SECTION

MANIFEST = "MAR-INF/MANIFEST.json"
DEFAULT_YAML = "model-config.yaml"
BASELINE = "plain"
AS_PACKAGED = "ours"
PLAIN_OVERRIDE = {"enabled": False}  # the plain-handler baseline
# The plain baseline at one torch intra-op thread (its workers get OMP_NUM_THREADS=1): at
# torch's default, a plain handler's P99 was 8-12x its P99 at one thread in a user's study,
# so a ratio to plain alone mixes threading with batching.
BASELINE_ONE = "plain1"
VARIANT_ENV = {BASELINE_ONE: {"OMP_NUM_THREADS": "1"}}
# An override's keys that go to model-config.yaml's frontend batching, not the section.
FRONTEND_KEYS = {"batchSize": 1, "maxBatchDelay": 0}  # key -> its least value


class MarError(ValueError):
    """The .mar cannot be read or overridden: no manifest, or a config that is not a mapping."""


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: mappings merge key by key, anything else replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def split_frontend(
    override: dict[str, Any] | None,
) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """An override without its frontend keys (None stays None: as packaged), and those
    keys (``FRONTEND_KEYS``)."""
    if override is None:
        return None, {}
    frontend = {k: v for k, v in override.items() if k in FRONTEND_KEYS}
    rest = {k: v for k, v in override.items() if k not in FRONTEND_KEYS}
    return (rest if rest or not frontend else None), frontend


def read_entries(source: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    """Every file of a .mar (a zip) or of a model directory laid out like an unpacked one."""
    if source.is_dir():
        return [
            (zipfile.ZipInfo.from_file(p, p.relative_to(source).as_posix()), p.read_bytes())
            for p in sorted(source.rglob("*"))
            if p.is_file()
        ]
    try:
        with zipfile.ZipFile(source) as mar:
            return [(info, mar.read(info)) for info in mar.infolist() if not info.is_dir()]
    except (OSError, zipfile.BadZipFile) as exc:
        raise MarError(f"{source}: cannot read as a .mar: {exc}") from exc


def settings_of(entries: list[tuple[zipfile.ZipInfo, bytes]]) -> dict[str, Any]:
    """``manifest``, ``yaml_name``, ``yaml`` (model-config.yaml or None), ``json``
    (micro_batching.json or None) and ``effective``: the YAML section over the JSON."""
    files = {info.filename: data for info, data in entries}
    if MANIFEST not in files:
        raise MarError(f"no {MANIFEST}: not a model archive")
    manifest = json.loads(files[MANIFEST])
    yaml_name = manifest.get("model", {}).get("configFile")
    model_yaml = None
    if yaml_name and yaml_name in files:
        model_yaml = yaml.safe_load(files[yaml_name]) or {}
        if not isinstance(model_yaml, dict):
            raise MarError(f"{yaml_name}: got {type(model_yaml).__name__}, expected a mapping")
    section_json = json.loads(files[CONFIG_FILE_NAME]) if CONFIG_FILE_NAME in files else None
    section_yaml = (model_yaml or {}).get(YAML_SECTION)
    effective = merge(section_json or {}, section_yaml or {})
    return {
        "manifest": manifest,
        "yaml_name": yaml_name,
        "yaml": model_yaml,
        "json": section_json,
        "effective": effective,
    }


def override_mar(
    source: Path,
    target: Path,
    override: Mapping[str, Any] | None = None,
    frontend: Mapping[str, Any] | None = None,
    handler: Path | None = None,
) -> dict[str, Any]:
    """Writes ``target``: ``source`` (a .mar or model directory) with ``override`` merged
    into its micro-batching settings, ``frontend`` (model-config.yaml keys: batchSize,
    maxBatchDelay) set and ``handler`` (a .py file) swapped in. Returns the effective
    micro-batching section of ``target``.

    Raises:
        MarError: not a model archive, a config not a mapping, or an unreadable handler.
    """
    entries = read_entries(Path(source))
    found = settings_of(entries)
    manifest, yaml_name, model_yaml = found["manifest"], found["yaml_name"], found["yaml"]
    changed: dict[str, bytes] = {}
    if handler is not None:
        changed.update(swap_handler(manifest, Path(handler)))
    if override is not None:
        if model_yaml is not None and isinstance(model_yaml.get(YAML_SECTION), Mapping):
            model_yaml[YAML_SECTION] = merge(model_yaml[YAML_SECTION], override)
            changed[yaml_name] = b""  # written below
        else:
            section = merge(found["json"] or {}, override)
            changed[CONFIG_FILE_NAME] = (json.dumps(section, indent=4) + "\n").encode()
    if frontend:
        if model_yaml is None:  # a .mar without model-config.yaml gets one
            yaml_name = yaml_name or DEFAULT_YAML
            manifest.setdefault("model", {})["configFile"] = yaml_name
            changed[MANIFEST] = (json.dumps(manifest, indent=2) + "\n").encode()
            model_yaml = {}
        model_yaml.update(frontend)
        changed[yaml_name] = b""
    if yaml_name in changed:
        changed[yaml_name] = yaml.safe_dump(model_yaml, sort_keys=False).encode()
    write_entries(Path(target), entries, changed)
    effective: dict[str, Any] = settings_of(read_entries(Path(target)))["effective"]
    return effective


def swap_handler(manifest: dict[str, Any], handler: Path) -> dict[str, bytes]:
    """The entries that make ``handler`` the archive's handler: the file at the root and
    the manifest naming it (``manifest`` is updated in place)."""
    if handler.suffix != ".py":
        raise MarError(f"handler: got {str(handler)!r}, expected a .py file")
    try:
        code = handler.read_bytes()
    except OSError as exc:
        raise MarError(f"handler: cannot read {handler}: {exc}") from exc
    manifest.setdefault("model", {})["handler"] = handler.name
    return {handler.name: code, MANIFEST: (json.dumps(manifest, indent=2) + "\n").encode()}


def write_entries(
    target: Path, entries: list[tuple[zipfile.ZipInfo, bytes]], changed: Mapping[str, bytes]
) -> None:
    """The archive again, each entry with its own metadata; ``changed`` replaces contents
    (new names are appended, deflated)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".partial")
    names = {info.filename for info, _ in entries}
    with zipfile.ZipFile(tmp, "w") as out:
        for info, data in entries:
            out.writestr(info, changed.get(info.filename, data))
        for name, data in changed.items():
            if name not in names:
                out.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(target)


def frontend_of(
    mar: Path, batch_size: int | None = None, max_batch_delay: int | None = None
) -> dict[str, int]:
    """batchSize and maxBatchDelay to register ``mar`` with: those given, else its
    model-config.yaml's, else 32 and 50 ms."""
    packaged = settings_of(read_entries(mar))["yaml"] or {}
    if max_batch_delay is None:
        max_batch_delay = int(packaged.get("maxBatchDelay", 50))
    return {
        "batchSize": batch_size or int(packaged.get("batchSize", 32)),
        "maxBatchDelay": max_batch_delay,
    }
