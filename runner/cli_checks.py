"""The checks `touchstone generate` and `touchstone serve` run on their arguments: argparse types for numbers
(a bad one is argparse's one-line error), and, right after parsing, the model source and the device, so that a
mistake is reported in a second instead of after a model load of many seconds. Each check raises ValueError
worded "--flag: why", which the command prints as its one-line error (runner.cli_parser.fail)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def as_flag(message: str) -> str:
    """A field's error as the library words it ("top_p: must be in (0, 1]") -> the option's ("--top-p: ...")."""
    field, sep, rest = message.partition(": ")
    if sep and field.isidentifier():
        return f"--{field.replace('_', '-')}: {rest}"
    return message


def bounded(kind: type, ok: Callable[[float], bool], wanted: str) -> Callable[[str], float]:
    """An argparse type: a `kind` (int or float) for which `ok` holds, else "must be <wanted>, got <text>"."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value if kind is int else f'{value:g}'}")
        return value

    return parse


positive_int = bounded(int, lambda v: v >= 1, "an integer >= 1")
port = bounded(int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535]")
fraction = bounded(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
seconds = bounded(float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")


def number_list(kind: type, ok: Callable[[float], bool], wanted: str) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of `kind` values for which `ok` holds ("1,4,16")."""

    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or not all(ok(v) for v in values):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return values

    return parse


def positive_list(kind: type) -> Callable[[str], list]:
    return number_list(kind, lambda v: v > 0, f"a comma-separated list of {kind.__name__}s > 0")


def check_model(model: str, load_format: str) -> None:
    """--model names a registered model whose package is installed, a .gguf file or an HF directory, and
    --load-format fits it (no torch imported)."""
    from runner.model.source import resolve

    try:
        resolve(model, load_format)
    except ValueError as err:
        raise ValueError(as_flag(str(err))) from None


def check_device(device: str | None) -> str:
    """The device to run on: `device` if this machine has it, else ValueError; None: CUDA when present, else
    the CPU. Imports torch (about a second), so it runs after the checks that need nothing."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: must be cpu, cuda or cuda:N, got {device!r}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
            raise ValueError(
                f"--device {device}: no CUDA GPU is available on this machine (torch {torch.__version__}, {build})"
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"--device {device}: this machine has {count} CUDA device(s)")
    return device
