"""The variants a benchmark serves: the .mar as packaged (``ours``), its plain baseline
(``plain``: micro-batching off) and each named override or handler swapped in, parsed from
the command line of ts-microbatch-benchmark (ts_microbatch.tools.benchmark)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

BASELINE = "plain"
AS_PACKAGED = "ours"
PLAIN_OVERRIDE = {"enabled": False}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# Keys of a variant's JSON that set the frontend's batching for that variant alone (in its
# model-config.yaml) instead of the micro-batching section: the batch size and the window.
FRONTEND_KEYS = {"batchSize": 1, "maxBatchDelay": 0}  # key -> its least value


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=JSON``: a variant's name and its override of the micro_batching section."""
    name, sep, raw = text.partition("=")
    if not sep or not _NAME.match(name) or name in (BASELINE, AS_PACKAGED):
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected NAME=JSON with NAME of letters, digits, - and _ "
            f"(not {BASELINE!r} or {AS_PACKAGED!r})"
        )
    try:
        override = json.loads(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: not JSON: {exc}") from None
    if not isinstance(override, dict):
        raise argparse.ArgumentTypeError(f"{name}: got {raw!r}, expected a JSON object")
    for key, least in FRONTEND_KEYS.items():
        value = override.get(key, least)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise argparse.ArgumentTypeError(
                f"{name}: {key}: got {value!r}, expected an integer >= {least}"
            )
    return name, override


def split_frontend(
    override: dict[str, Any] | None,
) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """A variant's override without its frontend keys (None stays None: as packaged), and
    those keys (``FRONTEND_KEYS``)."""
    if override is None:
        return None, {}
    frontend = {k: v for k, v in override.items() if k in FRONTEND_KEYS}
    rest = {k: v for k, v in override.items() if k not in FRONTEND_KEYS}
    return (rest if rest or not frontend else None), frontend


def parse_handler_variant(text: str) -> tuple[str, dict[str, Any], Path]:
    """``NAME=HANDLER.py[:JSON]``: a variant's name, its override ({} without one) and the
    handler file it swaps in."""
    name, sep, rest = text.partition("=")
    path, dot_py, raw = rest.partition(".py")
    if not sep or not dot_py or (raw and not raw.startswith(":")):
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected NAME=HANDLER.py or NAME=HANDLER.py:JSON"
        )
    name, override = parse_variant(f"{name}={raw[1:] or '{}'}")
    return name, override, Path(path + dot_py)


def variants_of(args: argparse.Namespace) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, override) in the order each round serves them; None: as packaged."""
    variants: list[tuple[str, dict[str, Any] | None]] = []
    if not args.no_baseline:
        variants.append((BASELINE, PLAIN_OVERRIDE))
    variants.append((AS_PACKAGED, None))
    given = [(n, o) for n, o in args.variant] + [(n, o) for n, o, _ in args.handler_variant]
    for name, override in given:
        if name in dict(variants):
            raise SystemExit(f"error: --variant {name} given twice")
        variants.append((name, override))
    return variants


def handlers_of(args: argparse.Namespace) -> dict[str, Path]:
    """The handler file each variant swaps in; a variant not named keeps the .mar's."""
    handlers = {name: path for name, _, path in args.handler_variant}
    if args.baseline_handler is not None:
        handlers[BASELINE] = args.baseline_handler
    return handlers
