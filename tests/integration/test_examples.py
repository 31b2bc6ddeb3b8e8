"""Every example's README commands, run as written (on free ports, in a temp work dir)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from ts_microbatch.tools.ports import free_ports

EXAMPLES = sorted(p.parent.name for p in Path(ROOT, "examples").glob("*/README.md"))


def bash_blocks(readme: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", readme.read_text(), flags=re.S)


@pytest.mark.parametrize("example", EXAMPLES)
def test_readme_commands_work_as_written(example: str, tmp_path: Path) -> None:
    blocks = bash_blocks(Path(ROOT, "examples", example, "README.md"))
    assert blocks, f"examples/{example}/README.md has no bash block"
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        TS_MICROBATCH_WORKDIR=str(tmp_path / "torchserve"),
        TS_MICROBATCH_PORTS=",".join(map(str, free_ports(3))),
    )
    outputs = []
    try:
        for command in "\n".join(blocks).strip().splitlines():
            proc = subprocess.run(
                ["bash", "-c", command],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            outputs.append(proc.stdout)
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    finally:
        subprocess.run(
            [sys.executable, "-m", "ts_microbatch.tools.serve", "stop"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=120,
        )
    started = next(o for o in outputs if "/predictions/" in o)
    assert "-> 200" in started
