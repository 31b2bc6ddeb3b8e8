"""The tools as console commands (setup.py's entry points): each names a module of
ts_microbatch.tools whose ``main`` reads sys.argv when called without arguments, as a
console script calls it, and whose usage line names the command it was run as."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


def console_scripts() -> dict[str, str]:
    """``name = module:function`` of setup.py's console_scripts, read without running it."""
    tree = ast.parse((Path(ROOT) / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entries = ast.literal_eval(node.value)["console_scripts"]
            return dict((part.strip() for part in entry.split("=", 1)) for entry in entries)
    raise AssertionError("setup.py declares no entry_points")


COMMANDS = console_scripts()


def test_every_tool_a_user_runs_is_a_command() -> None:
    assert set(COMMANDS) == {
        "ts-microbatch-benchmark",
        "ts-microbatch-tune",
        "ts-microbatch-serve",
        "ts-microbatch-scrape",
        "ts-microbatch-bundle",
    }
    for name, target in COMMANDS.items():
        module, _, function = target.partition(":")
        assert module == f"ts_microbatch.tools.{name.removeprefix('ts-microbatch-')}"
        assert function == "main"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_reads_its_arguments_from_argv(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module, _, function = COMMANDS[name].partition(":")
    main = getattr(importlib.import_module(module), function)
    assert all(p.default is not p.empty for p in inspect.signature(main).parameters.values())
    monkeypatch.setattr(sys, "argv", [f"/usr/local/bin/{name}", "--help"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {name} ")


def test_python_m_still_runs_a_tool_and_names_itself_so() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ts_microbatch.tools.benchmark", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m ts_microbatch.tools.benchmark ")
    assert "--corpus" in done.stdout and "--variant" in done.stdout


def test_the_benchmark_needs_a_mar(capsys: pytest.CaptureFixture[str]) -> None:
    from ts_microbatch.tools.benchmark import main

    with pytest.raises(SystemExit) as exited:
        main(["--corpus", "texts/"])
    assert exited.value.code == 2
    assert "--mar is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--rates", "0,10"], "argument --rates: got '0,10', expected rates > 0"),
        (["--rates", "40,20"], "expected rising rates"),
        (["--floor-requests", "-3"], "argument --floor-requests: expected an integer >= 0"),
        (["--floor-requests", "some"], "expected an integer >= 0, got 'some'"),
    ],
)
def test_a_refused_value_is_named_with_what_is_expected_not_a_function_name(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse replaces a ValueError's message with "invalid parse_rates value".
    from ts_microbatch.tools.benchmark import main

    with pytest.raises(SystemExit) as exited:
        main(["--mar", "m.mar", "--corpus", "texts/", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert said in err and "invalid" not in err


def test_the_floor_sends_min_answers_unless_told_and_none_with_zero() -> None:
    from ts_microbatch.tools.benchmark import build_parser
    from ts_microbatch.tools.curves import floor_count

    base = ["--mar", "m.mar", "--corpus", "texts/", "--min-answers", "2000"]
    assert floor_count(build_parser().parse_args(base)) == 2000
    assert floor_count(build_parser().parse_args([*base, "--floor-requests", "300"])) == 300
    assert floor_count(build_parser().parse_args([*base, "--floor-requests", "0"])) == 0


def test_the_tuner_needs_an_objective(capsys: pytest.CaptureFixture[str]) -> None:
    from ts_microbatch.tools.tune import main

    with pytest.raises(SystemExit) as exited:
        main(["--mar", "m.mar", "--input", "body.txt"])
    assert exited.value.code == 2
    assert "the following arguments are required: --slo-p99-ms" in capsys.readouterr().err


def test_the_tools_extra_the_commands_check_is_setup_py_s() -> None:
    from ts_microbatch.tools._cli import TOOLS_EXTRA

    tree = ast.parse((Path(ROOT) / "setup.py").read_text())
    (tools,) = [
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "TOOLS"
    ]
    assert {spec.split(">")[0].split("=")[0] for spec in tools} == set(TOOLS_EXTRA)


# The arguments each command needs to get past its parser; nothing they name exists.
RUNS = {
    "ts-microbatch-benchmark": ["--mar", "m.mar", "--corpus", "texts/"],
    "ts-microbatch-tune": ["--mar", "m.mar", "--corpus", "texts/", "--slo-p99-ms", "100"],
    "ts-microbatch-scrape": ["http://127.0.0.1:9/metrics"],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_command_missing_its_extra_fails_at_once_naming_it(name: str, tmp_path: Path) -> None:
    # Issue 50: without the tools extra, the benchmark ran a whole measured run and then
    # died importing prometheus_client. Now it stops before anything runs.
    module, _, function = COMMANDS[name].partition(":")
    script = (
        "import sys; sys.modules['prometheus_client'] = None  # not installed\n"
        f"sys.argv = {[name, *RUNS[name]]!r}\n"
        f"from {module} import {function}; sys.exit({function}())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pip install 'ts_microbatch[tools]'" in done.stderr
    assert f"{name} needs prometheus_client" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made: no run folder, no server


def test_a_hint_names_the_command_it_asks_for_not_the_running_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ts_microbatch.tools._cli import prog

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/ts-microbatch-serve", "start"])
    assert prog("ts_microbatch.tools.scrape") == "ts-microbatch-scrape"
    assert prog("ts_microbatch.tools.serve") == "ts-microbatch-serve"
    monkeypatch.setattr(sys, "argv", ["-m"])
    assert prog("ts_microbatch.tools.scrape") == "python -m ts_microbatch.tools.scrape"


def test_a_killed_tool_stopped_without_its_finally_blocks_(tmp_path: Path) -> None:
    # The incident: `kill` on ts-microbatch-tune left its confirm step's TorchServe serving
    # (Python's default for SIGTERM ends the process at once, no finally runs).
    script = (
        "import os, signal, time\n"
        "from ts_microbatch.tools._cli import start_tool\n"
        "with start_tool('ts_microbatch.tools.tune'):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(30)\n"
        "    finally:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)  # a second one: cleanup goes on\n"
        "        print('the servers stopped', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.stdout == "the servers stopped\n" and done.returncode == 128 + 15
    # In a process that goes on (a test calling a tool's main), the handler is put back.
    import signal

    from ts_microbatch.tools._cli import start_tool

    before = signal.getsignal(signal.SIGTERM)
    with start_tool("ts_microbatch.tools.tune"):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
