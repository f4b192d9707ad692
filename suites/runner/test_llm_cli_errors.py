"""`touchstone generate` with a mistake in its arguments, in a subprocess: exit status 2, exactly one line on
stderr naming what is wrong, no traceback, and found before the model loads: the import log holds none of the
loader's modules, and for everything but the device not even torch."""

from __future__ import annotations

import pytest

from suites.runner.cli_run import heavy, missing_device, run_command
from suites.runner.conftest import require_model_packages

CASES = [
    # (case, arguments after the prompt, what the one line must name)
    ("unknown model", ["--model", "nosuch"], "'nosuch'"),
    ("negative temperature", ["--temperature", "-1"], "--temperature"),
    ("top-p above 1", ["--top-p", "2"], "--top-p"),
    ("max-tokens zero", ["--max-tokens", "0"], "--max-tokens"),
    ("max-tokens not a number", ["--max-tokens", "many"], "--max-tokens"),
    ("top-k below -1", ["--top-k", "-5"], "--top-k"),
    ("unknown load format", ["--load-format", "onnx"], "--load-format"),
    ("a shape without weights", ["--model", "smollm2-135m"], "'smollm2-135m'"),
    ("unknown option", ["--tempreature", "1"], "--tempreature"),
]


@pytest.mark.parametrize(("args", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_one_line_before_torch(args, named):
    done, errors, imported = run_command("runner.cli", "What is the capital of France?", *args)
    assert done.returncode == 2, (done.returncode, errors)
    assert len(errors) == 1 and errors[0].startswith("touchstone generate: error: ") and named in errors[0], errors
    assert "Traceback" not in done.stderr and not done.stdout
    assert not heavy(imported), f"imported before the error: {heavy(imported)[:10]}"


def test_empty_prompt_is_one_line():
    done, errors, imported = run_command("runner.cli", "")
    assert done.returncode == 2 and len(errors) == 1 and "prompt" in errors[0], errors
    assert not heavy(imported)


def test_missing_device_is_one_line_before_the_model_loads():
    device = missing_device()  # a dummy shape: the check must not depend on the model package being installed
    done, errors, imported = run_command(
        "runner.cli", "hi", "--model", "smollm2-135m", "--load-format", "dummy", "--device", device
    )
    assert done.returncode == 2, (done.returncode, errors)
    assert len(errors) == 1 and f"--device {device}" in errors[0], errors
    assert "Traceback" not in done.stderr
    assert not heavy(imported, torch_too=False)


def test_unreadable_gguf_file_is_one_line(tmp_path):
    """Past the early checks (it is a .gguf file), the load itself finds it is not GGUF: still one line."""
    require_model_packages()  # the gguf reader itself (the GPU image has none)
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    done, errors, _ = run_command("runner.cli", "hi", "--model", str(bad), "--device", "cpu")
    assert done.returncode == 2, (done.returncode, errors)
    assert len(errors) == 1 and str(bad) in errors[0] and "not a readable GGUF file" in errors[0], errors
    assert "Traceback" not in done.stderr
