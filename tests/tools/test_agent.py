"""The agent's helpers (ts_microbatch.agent) and its digests against the installed TorchServe."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import ts

from ts_microbatch import agent

AGENT_SOURCE = Path(agent.__file__).with_name("java") / "tsmicrobatch/agent/Agent.java"


def test_agent_digests_are_the_installed_torchserve_classes() -> None:
    # The agent replaces a class only over these exact bytes: a TorchServe upgrade must show
    # up here, not as an agent that silently refuses.
    jar = Path(os.path.dirname(ts.__file__)) / "frontend" / "model-server.jar"
    source = AGENT_SOURCE.read_text()
    with zipfile.ZipFile(jar) as z:
        for name in ("AsyncBatchAggregator", "AsyncWorkerThread"):
            data = z.read(f"org/pytorch/serve/wlm/{name}.class")
            assert hashlib.sha256(data).hexdigest() in source, name


def test_vmargs_appends_the_agent_once_after_existing_options() -> None:
    line = agent.vmargs()
    assert line == f"-javaagent:{agent.jar_path()}"
    assert agent.vmargs(f"-Xmx2g {line}") == f"-Xmx2g {line}"


def test_main_prints_the_config_line_or_why_not() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ts_microbatch.agent"], capture_output=True, text=True
    )
    if agent.missing():
        assert proc.returncode == 1 and "make agent" in proc.stderr
        if shutil.which("javac") and shutil.which("jar"):
            pytest.fail(f"a JDK is here: {agent.missing()}")
        pytest.skip("no JDK here (javac, jar): the agent is not built")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"vmargs=-javaagent:{agent.jar_path()}"


def test_the_committed_jar_is_the_one_make_agent_builds(tmp_path: Path) -> None:
    # Issue 50: pip users get the jar without a JDK or a checkout's `make agent`, so it is
    # committed; this holds it byte for byte to what the Makefile builds from the sources.
    if not (shutil.which("javac") and shutil.which("jar")):
        pytest.skip("no JDK here (javac, jar): nothing to build the jar with")
    root = Path(agent.__file__).resolve().parents[2]
    built = tmp_path / agent.JAR_NAME
    make = ["make", "--no-print-directory", f"AGENT_JAR={built}", f"AGENT_BUILD={tmp_path}/b"]
    done = subprocess.run([*make, str(built)], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    committed = subprocess.run(
        ["git", "show", f"HEAD:ts_microbatch/agent/{agent.JAR_NAME}"], cwd=root, capture_output=True
    )
    if committed.returncode != 0 and not (root / ".git").exists():
        pytest.skip("not a git checkout: no committed jar to compare")
    assert committed.returncode == 0, committed.stderr
    assert built.read_bytes() == committed.stdout, "rebuild the jar (make agent) and commit it"
