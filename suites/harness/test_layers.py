"""The layers point one way: reference (torch only) -> kernels -> runner; bench and the suites on top and
never each other; the `touchstone` front door above bench and runner.

Every import statement of every module (at any depth: lazy imports inside functions count) is checked
against the table below; a wrong-way import fails the test, naming file and line. Files of the suites that
test bench itself (`test_*bench*.py`, and `bench_runs.py`, their helper) may import bench, and the front
door's tests (`test_cli*.py`) may import it.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIRST_PARTY = ("reference", "kernels", "runner", "bench", "suites", "touchstone")
# Layer -> the first-party layers it may import (itself included).
MAY_IMPORT = {
    "reference": {"reference"},
    "kernels": {"kernels", "reference"},
    "runner": {"runner", "kernels", "reference"},
    "bench": {"bench", "runner", "kernels", "reference"},
    "touchstone": {"touchstone", "bench", "runner", "kernels", "reference"},
    "suites": {"suites", "runner", "kernels", "reference"},
}
# The base layers also name the third-party packages they may use; the others may use any.
THIRD_PARTY = {"reference": {"torch"}, "kernels": {"torch", "triton"}}


def exceptions(path: pathlib.Path) -> set[str]:
    """First-party layers a suites file may import because it tests them."""
    if path.parts[0] != "suites":
        return set()
    name = path.name
    if (name.startswith("test_") and "bench" in name) or name == "bench_runs.py":
        return {"bench"}
    if name.startswith("test_cli"):
        return {"touchstone"}
    return set()


def imported_names(tree: ast.AST, module_parts: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `tree`; relative imports resolved from `module_parts`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module_parts[: len(module_parts) - node.level]
                found.append((node.lineno, ".".join((*base, node.module or ""))))
            elif node.module != "__future__":
                found.append((node.lineno, node.module))
    return found


def wrong_way_imports(root: pathlib.Path) -> list[str]:
    """'file:line: <layer> imports <module>' for every import the table forbids, over the tree at `root`."""
    problems = []
    for layer in MAY_IMPORT:
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root)
            module_parts = rel.with_suffix("").parts
            tree = ast.parse(path.read_text(), filename=str(rel))
            allowed = MAY_IMPORT[layer] | exceptions(rel)
            for line, module in imported_names(tree, module_parts):
                top = module.split(".")[0]
                if top in FIRST_PARTY:
                    ok = top in allowed
                elif layer in THIRD_PARTY:
                    ok = top in THIRD_PARTY[layer] or top in sys.stdlib_module_names
                else:
                    ok = True
                if not ok:
                    problems.append(f"{rel}:{line}: {layer} imports {module}")
    return problems


def test_no_wrong_way_import():
    problems = wrong_way_imports(ROOT)
    assert not problems, "wrong-way imports:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "bench/x.py",
            "def f():\n    from suites.tolerances import LOSSY\n",
            "bench/x.py:2: bench imports suites.tolerances",
        ),
        (
            "suites/quant/test_x.py",
            "import bench.registry\n",
            "suites/quant/test_x.py:1: suites imports bench.registry",
        ),
        ("reference/quant/x.py", "import numpy as np\n", "reference/quant/x.py:1: reference imports numpy"),
        ("kernels/x.py", "from runner.model import load_model\n", "kernels/x.py:1: kernels imports runner.model"),
        ("runner/engine/x.py", "from ...bench import cli\n", "runner/engine/x.py:1: runner imports bench"),
        ("runner/x.py", "from touchstone import cli\n", "runner/x.py:1: runner imports touchstone"),
    ],
)
def test_a_planted_wrong_way_import_is_named(tmp_path, path, source, expected):
    """Negative control: each planted import is caught, with its file and line."""
    for layer in MAY_IMPORT:
        (tmp_path / layer).mkdir()
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source)
    assert wrong_way_imports(tmp_path) == [expected]


def test_tests_of_bench_may_import_it(tmp_path):
    for layer in MAY_IMPORT:
        (tmp_path / layer).mkdir()
    (tmp_path / "suites" / "test_rope_bench.py").write_text("from bench.rotary import rope\n")
    (tmp_path / "suites" / "test_cli.py").write_text("from touchstone.cli import main\n")
    assert wrong_way_imports(tmp_path) == []
