"""The Java agent that fixes TorchServe 0.12.0's asynchronous frontend (README.md here).

The jar is built by ``make agent`` from ``java/`` beside this file, committed (a pip install
from a checkout or a wheel has it without a JDK; CI holds it byte for byte to a fresh
build) and shipped in the package; this module only finds it. Enable it with the one line
:func:`vmargs` gives, in config.properties; ``python -m ts_microbatch.agent`` prints it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["JAR_NAME", "jar_path", "missing", "vmargs"]

JAR_NAME = "ts-microbatch-agent.jar"


def jar_path() -> Path:
    """Where the package keeps the agent's jar (it may be missing: see :func:`missing`)."""
    return Path(__file__).resolve().with_name(JAR_NAME)


def missing() -> str | None:
    """Why the jar is not there, or None when it is."""
    if jar_path().is_file():
        return None
    return (
        f"{jar_path()} is not built: run `make agent` in a checkout (it needs a JDK: javac "
        "and jar, e.g. apt-get install openjdk-17-jdk-headless)"
    )


def vmargs(existing: str = "") -> str:
    """The ``vmargs`` value that loads the agent, after the JVM options already in ``existing``.

    TorchServe passes ``vmargs`` from config.properties to its frontend's JVM, split on
    whitespace (so a path with a space cannot be passed: it is refused here).
    """
    path = str(jar_path())
    if any(c.isspace() for c in path):
        raise ValueError(
            f"the agent's path {path!r} has whitespace, which TorchServe's vmargs splits on; "
            "copy the jar to a path without it"
        )
    words = [w for w in shlex.split(existing) if not w.startswith(f"-javaagent:{path}")]
    return " ".join([*words, f"-javaagent:{path}"])
