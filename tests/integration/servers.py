"""The example's models and the project's TorchServe, for the integration tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, load_module
from ts_microbatch.tools import measure
from ts_microbatch.tools.scrape import summarize
from ts_microbatch.tools.server import TorchServe

build = load_module("examples/image_classifier/build_mar.py", "ts_microbatch_example_build_mar")
MODEL = "resnet-18_mb"
BAD_MODEL = "resnet-18_badcfg"
BAD_CONFIG = {"micro_batch_size": 4, "parallelism": {"preprocess": 2, "inference": 0}}
AUTO_MODEL = "resnet-18_auto"
AUTO_CONFIG = {
    "micro_batch_size": "auto",
    "min_micro_batch_size": 2,
    "max_micro_batch_size": 6,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1},
    # A line per micro-batch: its test reads each micro-batch's size from the histogram.
    "metrics_interval_s": 0,
}


def local_server(model_store: Path, workdir: Path) -> TorchServe:
    """A TorchServe on free loopback ports with the project's config; a context manager
    that starts it and always stops it."""
    return TorchServe(
        model_store=model_store,
        workdir=workdir,
        base_config=Path(ROOT) / "configs/config.properties",
    )


@contextlib.contextmanager
def registered(server: TorchServe, *names: str, **settings: Any) -> Iterator[TorchServe]:
    """``<name>.mar`` of each of ``names`` (in ``server``'s store) registered under that
    name with ``register``'s ``settings``, and unregistered on exit: a module's models on
    the shared server, gone before the next module's tests run."""
    try:
        for name in names:
            resp = server.register(f"{name}.mar", model_name=name, **settings)
            assert resp.status == 200, (resp.body, server.log()[-3000:])
        yield server
    finally:
        for name in names:
            server.unregister(name, drain=False)


def model_log(server: TorchServe, name: str) -> str:
    """The lines of the model log that ``name``'s workers wrote (``W-<port>-<name>_<version>``):
    on the shared server, the other models' lines are in the same file."""
    return "\n".join(line for line in server.log().splitlines() if f"-{name}_" in line)


def settled_scrape(server: TorchServe, model: str, timeout_s: float = 30) -> str:
    """``/metrics`` once the worker's lines stopped moving (``measure.settled_scrape``, the
    tools' rule); ``model`` names whose lines the caller reads."""
    return measure.settled_scrape(server, timeout_s)


def scraped(server: TorchServe, model: str, before: str = "") -> dict[str, Any]:
    """The summary of ``model``'s pipeline metrics since ``before`` (a settled scrape), once
    the worker's lines for the traffic sent have all reached ``/metrics``."""
    return summarize(settled_scrape(server, model), before, model_name=model)


def stock_python(venv: Path, *, pip: bool = False) -> Path:
    """The Python of a venv standing for a stock TorchServe image: this environment's
    packages (torch, TorchServe, ...) without ts_microbatch.

    Its site directory lists, in a .pth file, a folder of links to everything in this
    environment's site directories but the package's own entries (its dist-info, the
    editable install's hook): Python finds torch and TorchServe there and pip counts them
    installed, while neither finds the package. On the floor's venv that takes in the shared
    torch it lists in a .pth file of its own (the Makefile's FLOOR_TORCH), whose .pth files a
    listed folder never runs. Its bin/ holds a ``torchserve`` command, as the image's PATH
    does; ``pip`` gives it pip, for an install step to run in it.
    """
    venv_args = [] if pip else ["--without-pip"]
    subprocess.run([sys.executable, "-m", "venv", *venv_args, str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    stock = venv / "stock-site-packages"
    stock.mkdir()
    sites = [Path(p) for p in sys.path if Path(p).name == "site-packages" and Path(p).is_dir()]
    assert Path(sysconfig.get_paths()["purelib"]) in sites
    distributions = set()  # a distribution's first metadata on sys.path wins, as its code
    for entry in (e for found in sites for e in sorted(found.iterdir())):
        own = "ts_microbatch" in entry.name or entry.name.startswith("__editable__")
        if entry.suffix in (".dist-info", ".egg-info"):
            name = entry.name.split("-")[0].lower().replace("_", "-")
            own = own or name in distributions
            distributions.add(name)
        if not own and not (stock / entry.name).exists():  # the first on sys.path wins
            (stock / entry.name).symlink_to(entry)
    Path(site, "stock_packages.pth").write_text(f"{stock}\n")
    torchserve = venv / "bin" / "torchserve"  # what pip writes for TorchServe's entry point
    torchserve.write_text(
        f"#!{python}\nimport sys\nfrom ts.model_server import start\nsys.exit(start())\n"
    )
    torchserve.chmod(0o755)
    probe = (
        "import ts, torch, torchvision\n"
        "try:\n import ts_microbatch\nexcept ImportError:\n print('absent')"
    )
    # Probed as the image runs it: a developer's PYTHONPATH pointing at a checkout would
    # make the package importable here alone.
    out = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        cwd=venv,
        env=without_pythonpath(),
        check=True,
    )
    assert out.stdout.strip() == "absent", "ts_microbatch is importable: a test would prove nothing"
    return python


def without_pythonpath() -> dict[str, str]:
    """This environment without PYTHONPATH, as an image's processes run."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
