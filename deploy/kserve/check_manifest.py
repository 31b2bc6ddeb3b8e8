"""Checks an InferenceService manifest against the KServe Python SDK's model classes.

Run with the SDK's interpreter (`make kserve-venv` makes .venv-kserve):

    .venv-kserve/bin/python deploy/kserve/check_manifest.py deploy/kserve/inferenceservice.yaml

Every field is looked up in the SDK's generated model of its object (``attribute_map`` and
``openapi_types`` of kserve.V1beta1InferenceService and below): an unknown field (a misspelt
key) or a value of the wrong type fails. Kubernetes' own objects inside it (metadata,
resources) are validated by the Kubernetes client's models. The SDK's deserializer cannot
do this itself: it names Kubernetes types it resolves only in its own module, and the
Kubernetes client the SDK installs is generated differently. Prints the checked fields.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import kserve.models
import kubernetes.client.models
import yaml

PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "object": (object,),
    "datetime": (str,),
}


class ManifestError(Exception):
    """The manifest does not fit the SDK's schema."""


def check_value(value: Any, type_name: str, where: str) -> None:
    list_of = re.fullmatch(r"(?:list|List)\[(.+)\]", type_name)
    dict_of = re.fullmatch(r"(?:dict\(str, *|Dict\[str, *)(.+)[)\]]", type_name)
    if list_of:
        if not isinstance(value, list):
            raise ManifestError(f"{where}: expected a list ({type_name}), got {value!r}")
        for i, item in enumerate(value):
            check_value(item, list_of.group(1), f"{where}[{i}]")
    elif dict_of:
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected a mapping ({type_name}), got {value!r}")
        for key, item in value.items():
            check_value(item, dict_of.group(1), f"{where}.{key}")
    elif type_name in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[type_name]) or (
            type_name in ("int", "float") and isinstance(value, bool)
        ):
            raise ManifestError(f"{where}: expected {type_name}, got {value!r}")
    elif hasattr(kserve.models, type_name):
        check_object(value, getattr(kserve.models, type_name), where)
    elif hasattr(kubernetes.client.models, type_name):
        try:
            getattr(kubernetes.client.models, type_name).from_dict(value)
        except Exception as exc:  # pydantic's ValidationError and friends
            raise ManifestError(f"{where}: not a valid {type_name}: {exc}") from exc
        check_object(value, getattr(kubernetes.client.models, type_name), where)
    else:
        raise ManifestError(f"{where}: the SDK names an unknown type {type_name}")


def check_object(value: Any, model: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected an object ({model.__name__}), got {value!r}")
    by_json_key = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json_key:
            known = ", ".join(sorted(by_json_key))
            raise ManifestError(f"{where}.{key}: not a field of {model.__name__} ({known})")
        check_value(item, model.openapi_types[by_json_key[key]], f"{where}.{key}")


def check(path: Path) -> dict[str, Any]:
    manifest = yaml.safe_load(path.read_text())
    check_object(manifest, kserve.models.V1beta1InferenceService, "InferenceService")
    if manifest.get("apiVersion") != "serving.kserve.io/v1beta1":
        raise ManifestError(f"apiVersion: {manifest.get('apiVersion')!r}")
    if manifest.get("kind") != "InferenceService":
        raise ManifestError(f"kind: {manifest.get('kind')!r}")
    predictor = manifest["spec"]["predictor"]
    model = predictor["model"]
    return {
        "model_format": model["modelFormat"]["name"],
        "protocol_version": model.get("protocolVersion"),
        "storage_uri": model.get("storageUri"),
        "runtime_version": model.get("runtimeVersion"),
        "min_replicas": predictor.get("minReplicas"),
        "max_replicas": predictor.get("maxReplicas"),
        "scale_metric": predictor.get("scaleMetric"),
        "scale_target": predictor.get("scaleTarget"),
        "resources": model.get("resources"),
    }


if __name__ == "__main__":
    try:
        print(json.dumps(check(Path(sys.argv[1]))))
    except ManifestError as exc:
        raise SystemExit(f"{sys.argv[1]}: {exc}") from exc
