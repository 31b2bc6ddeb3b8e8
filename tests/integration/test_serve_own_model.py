"""`ts-microbatch-serve` as a pip user runs it: their own .mar, in a folder of their own
with no checkout (no ``configs/``), no ``--config`` and no batch flags. A new user's trial
met a traceback (``configs/config.properties`` missing), the .mar's batchSize and window
overridden by 32/50 unasked, and ``stop`` from another folder saying nothing ran."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import load_module
from ts_microbatch.tools.ports import free_ports

build = load_module("examples/tabular_scorer/build_mar.py", "ts_microbatch_tabular_build_mar")
NAME = "tabular_mb"


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def serve(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console command pip installs, as a user runs it."""
    return run([str(Path(sys.executable).with_name("ts-microbatch-serve")), *args], cwd, env)


def hint(output: str, lead: str) -> list[str]:
    """The command a line of ``output`` starting with ``lead`` tells the user to run."""
    line = next(line for line in output.splitlines() if line.startswith(lead))
    return line.removeprefix(lead).split(" (from ")[0].split()


def test_a_pip_user_serves_their_mar_with_its_own_settings_and_stops_it_from_its_folder(
    tmp_path: Path,
) -> None:
    user, elsewhere = tmp_path / "my_model", tmp_path / "elsewhere"
    store = user / "store"
    for folder in (store, elsewhere):
        folder.mkdir(parents=True)
    build.build_mar(store, work_dir=tmp_path / "build")
    (user / "sample.json").write_text(json.dumps({"features": build.prepare.make_features(1)}))
    ports = free_ports(3)
    env = dict(os.environ, TS_MICROBATCH_PORTS=",".join(map(str, ports)))
    env.pop("TS_MICROBATCH_WORKDIR", None)  # the default: ./logs/torchserve
    try:
        started = serve(
            "start", "--mar", f"{NAME}.mar", "--input", "sample.json", "--model-store", "store",
            "--token-auth", "off", cwd=user, env=env,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        assert not (user / "configs").exists()  # the scenario: no checkout's config
        assert "-> 200" in started.stdout
        # registered with the .mar's model-config.yaml (batchSize 32, maxBatchDelay 1)
        assert "batch_size=32 max_batch_delay=1 ms" in started.stdout, started.stdout
        assert f"serve stop (from {user})" in started.stdout  # where to stop it from
        # Every hint it printed runs as printed (it once named the running command).
        scrape = hint(started.stdout, "Pipeline metrics: ")
        assert scrape[0] == "ts-microbatch-scrape", scrape
        bin_dir = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        scraped = run(
            [*scrape, "--interval", "0.5", "--count", "1"], user, {**env, "PATH": bin_dir}
        )
        assert scraped.returncode == 0 and "requests" in scraped.stdout, scraped.stderr

        other = serve("stop", cwd=elsewhere, env=env)
        assert other.returncode == 0 and "No TorchServe started from this directory" in other.stdout
        assert str(elsewhere) in other.stdout  # says where it looked
        assert (user / "logs" / "torchserve" / "torchserve.pid").exists()  # still running
        assert hint(started.stdout, "Stop it with: ") == ["ts-microbatch-serve", "stop"]
    finally:
        stopped = serve("stop", cwd=user, env=env)  # the hint, run from the folder it names
    assert stopped.returncode == 0 and "TorchServe stopped." in stopped.stdout, stopped.stdout
    assert not (user / "logs" / "torchserve" / "torchserve.pid").exists()


def test_a_port_taken_is_an_error_naming_it_before_anything_starts(tmp_path: Path) -> None:
    # Without --config, `serve start` listens on 8080-8082: another server there answered
    # /ping for ours. A listener stands for it on one of the ports given.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        ports = [free_ports(1)[0], taken, free_ports(1)[0]]
        env = dict(os.environ, TS_MICROBATCH_PORTS=",".join(map(str, ports)))
        env.pop("TS_MICROBATCH_WORKDIR", None)
        started = serve(
            "start", "--mar", "m.mar", "--input", "x.json", "--token-auth", "off",
            cwd=tmp_path, env=env,
        )  # fmt: skip
    assert started.returncode == 1
    assert f"port {taken} (management) taken" in started.stderr, started.stderr
    assert "Starting TorchServe" not in started.stdout  # nothing started
