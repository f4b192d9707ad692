"""Which optional dependency groups ("extras" of the touchstone distribution) are missing, read from the
installed package's own metadata, so that a command can name the `pip install 'touchstone[...]'` it needs
instead of failing with a traceback deep inside an import."""

from __future__ import annotations

import importlib.metadata
import re

DISTRIBUTION = "touchstone"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def requirements(extra: str) -> list[str] | None:
    """Distribution names the `extra` asks for, or None where touchstone is not installed (a source tree run
    with `python -m touchstone`), so there is nothing to check against."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    names = []
    for line in requires:
        marker = _EXTRA.search(line)
        if marker and marker.group(1) == extra and (name := _NAME.match(line)):
            names.append(name.group(1))
    return names


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(extras: tuple[str, ...]) -> dict[str, list[str]]:
    """extra -> its distributions that are not installed, for each of `extras` with any missing."""
    out = {}
    for extra in extras:
        absent = [name for name in requirements(extra) or () if not installed(name)]
        if absent:
            out[extra] = absent
    return out


def install_hint(extras: tuple[str, ...]) -> str:
    return f"pip install 'touchstone[{','.join(extras)}]'"
