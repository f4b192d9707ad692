"""`touchstone serve` with a mistake in its arguments, in a subprocess: exit status 2, exactly one line on
stderr naming what is wrong, no traceback, and found before the model loads: the import log holds none of the
loader's modules, and for everything but the device not even torch."""

from __future__ import annotations

import pytest

from suites.runner.cli_run import heavy, missing_device, run_command


def run_serve(*args: str):
    return run_command("runner.server.cli", "--host", "127.0.0.1", "--port", "0", *args)


CASES = [
    # (case, arguments, what the one line must name)
    ("unknown model", ["--model", "nosuch"], "'nosuch'"),
    ("unknown load format", ["--load-format", "onnx"], "--load-format"),
    ("port out of range", ["--port", "70000"], "--port"),
    ("zero sequences", ["--max-num-seqs", "0"], "--max-num-seqs"),
    ("context not a number", ["--max-model-len", "long"], "--max-model-len"),
    ("memory fraction above 1", ["--gpu-memory-utilization", "2"], "--gpu-memory-utilization"),
    ("negative shutdown timeout", ["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    ("unknown dtype", ["--dtype", "fp8"], "--dtype"),
    ("unknown log level", ["--log-level", "loud"], "--log-level"),
]


@pytest.mark.parametrize(("args", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_one_line_before_torch(args, named):
    done, errors, imported = run_serve(*args)
    assert done.returncode == 2, (done.returncode, errors)
    assert len(errors) == 1 and errors[0].startswith("touchstone serve: error: ") and named in errors[0], errors
    assert "Traceback" not in done.stderr
    assert not heavy(imported), f"imported before the error: {heavy(imported)[:10]}"


def test_missing_device_is_one_line_before_the_model_loads():
    device = missing_device()
    done, errors, imported = run_serve("--device", device)
    assert done.returncode == 2, (done.returncode, errors)
    assert len(errors) == 1 and f"--device {device}" in errors[0], errors
    assert "Traceback" not in done.stderr
    assert not heavy(imported, torch_too=False)
