"""`touchstone`: one front door for the benches (bench/) and the engine (runner/).

    touchstone bench [--ops A,B] [--sizes small|full]    measure kernels against same-run roofs and peers
    touchstone report | list | compare A B               rebuild, list, and compare reports
    touchstone generate "prompt"                          one completion from the embedded model
    touchstone serve [--port 8000]                        OpenAI-compatible server
    touchstone bench serve [--concurrency 1,4,16]         benchmark a server

Each command parses its own options (`touchstone <command> --help`) and is imported only when it runs: `touchstone
serve` must bind its port before torch is imported. A command whose optional dependencies are missing says
which extra to install, in one line, and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import sys
from collections.abc import Sequence

from touchstone import extras


@dataclasses.dataclass(frozen=True)
class Command:
    target: str  # "module:function", called with the remaining arguments
    extras: tuple[str, ...]  # the optional dependency groups it needs
    help: str


COMMANDS = {
    "bench": Command("bench.cli:bench_main", (), "measure registered ops and write reports"),
    "report": Command("bench.cli:report_main", (), "rebuild Markdown, PNG and index.md from the CSVs"),
    "list": Command("bench.cli:list_main", (), "list the registered ops, their impls and sweeps"),
    "compare": Command("bench.compare:main", (), "compare two report folders row by row; flag regressions"),
    "generate": Command("runner.cli:main", ("runner",), "print a completion of a prompt (default model)"),
    "serve": Command("runner.server.cli:main", ("runner", "serve"), "OpenAI-compatible HTTP server"),
    "bench serve": Command("bench.serve.cli:main", ("serve",), "benchmark a server: TTFT, TPOT, ITL, tok/s"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: touchstone <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    lines += ["", "`touchstone <command> --help` shows a command's options."]
    return "\n".join(lines)


def split(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(command name, its arguments): `bench serve` is one command of two words."""
    if list(argv[:2]) == ["bench", "serve"]:
        return "bench serve", list(argv[2:])
    return argv[0], list(argv[1:])


def _error(message: str) -> int:
    print(f"touchstone: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = split(argv)
    command = COMMANDS.get(name)
    if command is None:
        close = difflib.get_close_matches(name, list(COMMANDS), 1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return _error(f"unknown command {name!r}{hint}; `touchstone --help` lists them")
    if absent := extras.missing(command.extras):
        names = ", ".join(dist for dists in absent.values() for dist in dists)
        return _error(f"`touchstone {name}` needs {names}: {extras.install_hint(tuple(absent))}")
    module_name, function = command.target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:  # a source-tree run (no package metadata to check the extras against)
        if (err.name or "").split(".")[0] in ("bench", "runner", "kernels", "reference", "touchstone"):
            raise
        return _error(f"`touchstone {name}` needs {err.name}: {extras.install_hint(command.extras)}")
    return getattr(module, function)(rest)
