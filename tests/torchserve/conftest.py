"""Fixtures for the handler tests: a real (untrained) ResNet-18 laid out as a .mar extracts;
the inputs and contexts are in images.py."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from tests.torchserve.images import prepare


@pytest.fixture(autouse=True, scope="module")
def fresh_model_module() -> Iterator[None]:
    """A TorchServe worker serves one model, so its loader imports the model file by its
    plain name ("model"); this process loads several models, and a module must not get the
    one another module's model left in sys.modules."""
    sys.modules.pop("model", None)
    yield
    sys.modules.pop("model", None)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A model directory laid out as TorchServe extracts a .mar."""
    directory = tmp_path_factory.mktemp("resnet18")
    shutil.copy(os.path.join(ROOT, "examples/image_classifier/model.py"), directory / "model.py")
    torch.manual_seed(0)
    from torchvision.models import resnet18

    torch.save(resnet18(weights=None).state_dict(), directory / "resnet18.pth")
    prepare.write_labels(str(directory))
    shutil.copy(
        os.path.join(ROOT, "configs/micro_batching.json"), directory / "micro_batching.json"
    )
    sys.path.insert(0, str(directory))  # TorchServe puts the model dir on sys.path
    yield directory
    sys.path.remove(str(directory))
