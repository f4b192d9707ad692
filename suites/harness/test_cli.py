"""The `touchstone` front door: every command has --help, user errors are one line, a missing optional
dependency names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runner.server.process import ROOT, server_env
from touchstone import cli, extras


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("bench", "report", "list", "compare", "generate", "serve", "bench serve"):
        assert f"  {name} " in out
    assert "bench.cli" not in out and "runner." not in out  # commands, not module paths


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        if cli.main([*command.split(), "--help"]) == 2:  # its extra is missing here (the GPU image has no serve)
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "pip install 'touchstone[" in err, err
            pytest.skip(f"touchstone {command}: {err.strip()}")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: touchstone {command}") and "Traceback" not in out
    assert "runner.cli" not in out and "bench.cli" not in out and "runner.server" not in out


def test_unknown_command_is_one_line_with_a_hint(capsys):
    assert cli.main(["benhc"]) == 2
    err = capsys.readouterr().err
    assert err == "touchstone: error: unknown command 'benhc' (did you mean bench?); `touchstone --help` lists them\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["bench", "serve", "--concurrency", "x"],
            "argument --concurrency: must be a comma-separated list of ints > 0, got 'x'",
        ),
        (["bench", "--sizes", "huge"], "argument --sizes: invalid choice: 'huge'"),
        (["compare", "only-one"], "the following arguments are required: b"),
    ],
)
def test_argument_errors_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_a_missing_extra_is_named_in_one_line(monkeypatch, capsys):
    """As without the serve extra installed: the command is not imported, the extra is named, exit 2."""
    monkeypatch.setattr(extras, "requirements", lambda extra: {"serve": ["starlette", "uvicorn"]}.get(extra, []))
    monkeypatch.setattr(extras, "installed", lambda dist: dist != "starlette")
    monkeypatch.delitem(sys.modules, "runner.server.cli", raising=False)
    assert cli.main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err == "touchstone: error: `touchstone serve` needs starlette: pip install 'touchstone[serve]'\n"
    assert "runner.server.cli" not in sys.modules


def test_extras_are_read_from_the_package_metadata():
    """The nox sessions install the package: its metadata names each extra's distributions."""
    if extras.requirements("serve") is None:
        pytest.skip("touchstone is not installed here (a source-tree run): there is no metadata to read")
    assert "uvicorn" in (extras.requirements("serve") or [])
    assert "transformers" in (extras.requirements("runner") or [])
    assert extras.missing(("runner", "serve")) == {}


def test_the_console_script_runs_the_front_door():
    done = subprocess.run(
        [sys.executable, "-m", "touchstone", "list"],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mxfp4_quantize [quant" in done.stdout
