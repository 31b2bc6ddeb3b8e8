"""The deploy recipe for TorchServe 0.12.0's official image (deploy/image/Dockerfile), its
install line run as the image would run it, short of Docker.

The image is stood for by a venv on this stack that holds this environment's packages but
not ts_microbatch (``servers.stock_python``; on the floor's stack, Python 3.9 with torch
2.4.0 and the image's releases of numpy, Pillow, captum and PyYAML, as the image has them).
The wheel is built as the Dockerfile's header says, the Dockerfile's COPY and RUN lines are
carried out in that venv with its bin/ first on the PATH (as the image's /home/venv/bin),
then a TorchServe started from that venv serves the image example's .mar (which carries no
copy of the package: the installed wheel is what its worker imports) with good photos and
hostile bodies.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.integration.servers import MODEL, local_server, stock_python, without_pythonpath
from tests.integration.test_torchserve import parallel, worker_pids
from tests.torchserve.hostile_headers import structures
from tests.torchserve.images import bomb_png, make_jpeg
from ts_microbatch.tools.server import TorchServe

# The Dockerfile is FROM the official 0.12.0 image, whose stack is the floor's.
pytestmark = pytest.mark.skipif(
    sys.version_info[:2] != (3, 9),
    reason="the image's stack is Python 3.9 with torch 2.4.0: make test-floor runs this",
)
DOCKERFILE = Path(ROOT) / "deploy" / "image" / "Dockerfile"
# What a wheel is built from: the package and its build files (never a stale build/).
WHEEL_SOURCES = ("ts_microbatch", "setup.py", "pyproject.toml", "README.md")


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions after FROM, as (keyword, arguments)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    found = [line.split(None, 1) for line in lines if line and not line.startswith("#")]
    steps = [(keyword.upper(), rest.strip()) for keyword, rest in found]
    assert steps[0] == ("FROM", "pytorch/torchserve:0.12.0-cpu"), steps[0]
    return steps[1:]


def build_wheel(work: Path) -> Path:
    """``pip wheel --no-deps -w dist ./ts_microbatch`` on a copy of the package's sources."""
    source = work / "ts_microbatch"
    for name in WHEEL_SOURCES:
        path = Path(ROOT, name)
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    dist = work / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist)]
    subprocess.run([*command, str(source)], cwd=work, check=True, timeout=300)
    (wheel,) = dist.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's Python after the Dockerfile's steps; each step's output is checked."""
    work = tmp_path_factory.mktemp("image_recipe")
    python = stock_python(work / "home-venv", pip=True)
    wheel = build_wheel(work)
    root = work / "image-root"  # the image's filesystem, where COPY puts files
    env = dict(without_pythonpath(), PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    steps = instructions()
    assert [keyword for keyword, _ in steps] == ["COPY", "RUN"], steps
    for keyword, arguments in steps:
        if keyword == "COPY":
            name, destination = shlex.split(arguments)
            assert name == wheel.name, (name, wheel.name)  # the header's wheel is the one built
            target = root / destination.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheel, target / name)
        else:
            command = arguments.replace(" /tmp/", f" {root}/tmp/")
            out = subprocess.run(
                command, shell=True, env=env, capture_output=True, text=True, timeout=300
            )
            assert out.returncode == 0, out.stdout + out.stderr
            # the package alone: everything it requires was in the image already
            (installed,) = re.findall(r"^Successfully installed (.+)$", out.stdout, re.M)
            want = wheel.name.split("-py3")[0].replace("_", "-")
            assert installed.replace("_", "-").split() == [want], out.stdout
    yield python


def test_the_image_imports_the_package_from_the_installed_wheel(image_python: Path) -> None:
    out = subprocess.run(
        [str(image_python), "-c", "import ts_microbatch; print(ts_microbatch.__file__)"],
        cwd=image_python.parent,
        env=without_pythonpath(),
        capture_output=True,
        text=True,
        check=True,
    )
    site = image_python.parents[1] / "lib"
    assert Path(out.stdout.strip()).is_relative_to(site), out.stdout


@pytest.fixture(scope="module")
def image_server(
    image_python: Path, model_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe]:
    ts = local_server(model_store, tmp_path_factory.mktemp("image_torchserve"))
    ts.python = image_python
    with ts:
        resp = ts.register(f"{MODEL}.mar", batch_size=8, max_batch_delay_ms=50)
        assert resp.status == 200, (resp.body, ts.log()[-3000:])
        yield ts


def test_the_image_serves_the_example_good_odd_and_hostile_bodies_apart(
    image_server: TorchServe,
) -> None:
    worker = image_server.describe(MODEL)["workers"]
    (pid,) = worker_pids(image_server, MODEL)
    assert image_server.python is not None
    assert str(image_server.python.parent) in open(f"/proc/{pid}/cmdline").read()  # noqa: SIM115
    good = [make_jpeg(300 + i, size=(320, 240)) for i in range(6)]
    odd = [make_jpeg(310, size=(17, 4000)), make_jpeg(311, size=(1, 1))]
    named = dict(structures(64 * 1024))
    hostile = {
        "truncated": (good[0][: len(good[0]) // 3], 400),
        "empty": (b"", 400),
        "text": (b"name,score\nalice,3\n" * 20, 400),
        "bomb": (bomb_png(), 413),
        "jpeg header only": (named["jfif-short"], 400),
        "png huge header": (named["png-huge-ihdr"], 400),
    }
    bodies = good + odd + [body for body, _ in hostile.values()]
    responses = parallel(image_server, bodies)
    statuses = [r.status for r in responses]
    assert statuses[: len(good) + len(odd)] == [200] * (len(good) + len(odd)), statuses
    for (name, (_, status)), resp in zip(hostile.items(), responses[len(good) + len(odd) :]):
        assert resp.status == status, (name, resp.status, resp.body)
        assert json.loads(resp.body)["code"] == status, name
    assert worker_pids(image_server, MODEL) == [pid], f"the worker restarted: {worker}"
