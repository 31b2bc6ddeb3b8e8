"""Writing a tuned config into the user's own file: merged, with a backup, or refused.

Every key of the existing file the tuner does not set is kept (a dropped
``responseTimeout: 30`` once moved the pipeline's ``timeout_s`` from 27 s to 108 s); the
``micro_batching`` section is merged key by key, as ``load_config`` reads it. The existing
file is first copied to ``<name>.bak`` (``.bak.1``, ``.bak.2``... : a backup is never
overwritten); a file that cannot be parsed is refused and nothing is written. The merged
file replaces the old one by a rename (a crash leaves either whole); a symlinked config
stays a link, its target rewritten with its mode. YAML comments stay in the backup only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.config import YAML_SECTION


class MergeError(ValueError):
    """An existing config file the tuner cannot merge into: not parsed, or not a mapping."""


def read_existing(path: Path) -> dict[str, Any] | None:
    """The mapping in the YAML file ``path``; None when there is no file.

    Raises:
        MergeError: it cannot be read or parsed, or holds something other than a mapping.
    """
    if not path.exists():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise MergeError(
            f"{path}: cannot parse the existing file, so nothing was written over it "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc}); fix it "
            "or give another --out"
        ) from exc
    if data is None:
        return {}  # an empty file
    if not isinstance(data, dict):
        raise MergeError(
            f"{path}: holds {type(data).__name__}, expected a mapping of settings; nothing "
            "was written over it (fix it or give another --out)"
        )
    return data


def merged(
    existing: Mapping[str, Any] | None, values: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """``existing`` with ``values`` set (the ``micro_batching`` section merged key by key)
    and ``defaults`` set only where ``existing`` has no such key."""
    result = dict(existing or {})  # in the user's order, the tuner's new keys after
    for key, value in defaults.items():
        result.setdefault(key, value)
    for key, value in values.items():
        old = result.get(key)
        if key == YAML_SECTION and isinstance(old, Mapping) and isinstance(value, Mapping):
            value = {**old, **value}
        result[key] = value
    return result


def backup_path(path: Path) -> Path:
    """The first of ``<name>.bak``, ``<name>.bak.1``, ``.bak.2``... that does not exist,
    not even as a dangling symlink (``exists()`` follows it and says no, ``open(..., "xb")``
    then refuses the name: ``_backup`` retried that one name forever)."""
    candidate, number = path.with_name(path.name + ".bak"), 0
    while os.path.lexists(candidate):
        number += 1
        candidate = path.with_name(f"{path.name}.bak.{number}")
    return candidate


def _backup(path: Path) -> Path:
    """``path`` copied to its ``backup_path``, created exclusively (never over a file that
    appeared in between)."""
    while True:
        target = backup_path(path)
        with contextlib.suppress(FileExistsError):
            with open(target, "xb") as copy, open(path, "rb") as original:
                shutil.copyfileobj(original, copy)
            shutil.copystat(path, target)
            return target


def write_merged(
    path: Path,
    values: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
    header: str = "",
) -> tuple[dict[str, Any], Path | None]:
    """``values`` written into the YAML config file ``path`` (``merged``) after a backup of
    the existing file; returns what was written and the backup (None when there was no
    file). ``header``: a comment line on top.

    Raises:
        MergeError: the existing file cannot be parsed; nothing written.
    """
    existing = read_existing(path)
    data = merged(existing, values, defaults or {})
    text = (f"# {header}\n" if header else "") + yaml.safe_dump(data, sort_keys=False)
    backup = _backup(path) if existing is not None else None
    target = path.resolve()  # a symlinked config: its file rewritten, the link kept
    scratch = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    scratch.write_text(text, encoding="utf-8")
    if existing is not None:
        os.chmod(scratch, stat.S_IMODE(target.stat().st_mode))
    os.replace(scratch, target)
    return data, backup
