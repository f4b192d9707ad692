"""Test-tier plumbing shared by every suite: devices, markers, hypothesis profiles, the known-failure ledger.

Tiers: `--device cpu` (default) runs Triton kernels under the interpreter (`TRITON_INTERPRET=1`, set here
before any kernel module is imported) with the interpreter shim installed; `--device cuda|rocm|xpu` runs them
on the GPU and refuses to start if torch does not see that backend. With TOUCHSTONE_REQUIRE_BACKEND set (the
hardware nox sessions set it), a run in which no test executed on that device fails.

Hypothesis profiles: `dev` (few examples), `ci`, `nightly`; chosen by HYPOTHESIS_PROFILE, else `ci` when
the CI variable is set, else `dev`. In a GPU session each xdist worker is given one GPU (suites/gpu_workers.py).
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

from suites import gpu_workers, ledger

ROOT = pathlib.Path(__file__).resolve().parent.parent

DEVICE_CHOICES = ("cpu", "cuda", "rocm", "xpu")
_PLATFORM = pytest.StashKey()
# Tests that ran (not skipped) on a GPU device; counted in the xdist controller too.
_counter = {"gpu_executed": 0}

# The `device` fixture is function-scoped only to record where each test ran; its value never changes between
# examples, so hypothesis' function-scoped-fixture check does not apply.
_common = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("ci", max_examples=200, derandomize=True, database=None, print_blob=True, **_common)
settings.register_profile("nightly", max_examples=1000, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default=os.environ.get("TOUCHSTONE_DEVICE", "cpu"),
        choices=DEVICE_CHOICES,
        help="where kernels run: cpu (Triton interpreter) or a GPU backend",
    )


def pytest_configure(config: pytest.Config) -> None:
    # First: a worker of a GPU session sees its one GPU before anything initializes the device.
    if assigned := gpu_workers.assignment(config.getoption("--device"), os.environ):
        os.environ[assigned[0]] = assigned[1]
    config.addinivalue_line(
        "markers", "interpreter_unsupported(reason): cannot be right under the Triton interpreter; skipped on cpu"
    )
    config.addinivalue_line("markers", "gpu_only(reason): needs a real GPU (timing, graphs, hardware units)")
    config.addinivalue_line("markers", "multi_gpu(n): needs at least n GPUs of the tier's backend")
    config.addinivalue_line("markers", "slow: long-running; deselect with -m 'not slow'")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        # xdist runs one process a core: torch's own thread pool per worker would oversubscribe the cores. On the
        # 2-core CI box a 135M-model decode step took 1.4 s with 2 threads a worker against 0.15 s with one.
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    device = config.getoption("--device")
    if device == "cpu":
        # Must happen before any kernels/ module is imported: @triton.jit reads it at decoration time.
        os.environ["TRITON_INTERPRET"] = "1"
        from suites import interpreter_shim

        interpreter_shim.install()
    else:
        from kernels.platform import require_backend

        try:
            config.stash[_PLATFORM] = require_backend(device)
        except RuntimeError as err:
            raise pytest.UsageError(f"--device {device}: {err}") from err


def _device_count(config: pytest.Config) -> int:
    platform = config.stash.get(_PLATFORM, None)
    return platform.device_count if platform else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    device = config.getoption("--device")
    for item in items:
        for name in ("interpreter_unsupported", "gpu_only"):
            marker = item.get_closest_marker(name)
            if marker is None:
                continue
            reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs a reason")
            if device == "cpu":
                item.add_marker(pytest.mark.skip(reason=f"{name}: {reason}"))
        multi = item.get_closest_marker("multi_gpu")
        if multi is not None and _device_count(config) < int(multi.args[0]):
            item.add_marker(pytest.mark.skip(reason=f"needs {multi.args[0]} GPUs, have {_device_count(config)}"))
        known = ledger.find(item.nodeid, device)
        if known is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"{known.reason} ({known.tracker})"))
    items[:] = longest_files_first(items)


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items file by file, the files in decreasing order of their measured duration (`.test_durations`,
    pytest-split's file), each file's items in their own order. xdist's `--dist loadfile` hands files out in
    this order, so the longest files start first and the short ones fill in at the end; a long file handed out
    last would run alone while the other workers idle."""
    path = ROOT / ".test_durations"
    measured = json.loads(path.read_text()) if path.is_file() else {}
    typical = sum(measured.values()) / len(measured) if measured else 0.0
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    total = {name: sum(measured.get(i.nodeid, typical) for i in group) for name, group in files.items()}
    return [item for name in sorted(files, key=lambda n: -total[n]) for item in files[name]]


@pytest.fixture
def device(request: pytest.FixtureRequest) -> str:
    """The torch device the tier's kernels run on: 'cpu' (interpreter), 'cuda' (CUDA and ROCm) or 'xpu'."""
    backend = request.config.getoption("--device")
    torch_device = {"rocm": "cuda"}.get(backend, backend)
    request.node.user_properties.append(("touchstone_device", backend))
    return torch_device


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Runs in the xdist controller for every worker's report too, so the count covers the whole run.
    if report.when == "call" and not report.skipped and ("touchstone_device", "cpu") not in report.user_properties:
        if any(key == "touchstone_device" for key, _ in report.user_properties):
            _counter["gpu_executed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    required = os.environ.get("TOUCHSTONE_REQUIRE_BACKEND")
    if not required or hasattr(session.config, "workerinput"):
        return
    device = session.config.getoption("--device")
    if device != required or _counter["gpu_executed"] == 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"FAIL CLOSED: TOUCHSTONE_REQUIRE_BACKEND={required}, --device {device}: "
                f"{_counter['gpu_executed']} tests executed on a {required} device",
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
