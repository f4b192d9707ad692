"""The sanitizer tier: every kernel's named cases under compute-sanitizer, and a report.

    python -m suites.sanitize [--tools memcheck,racecheck,initcheck] [--out reports]   (`nox -s sanitize`)

First the negative control: under memcheck, the W4A16 GEMM with a planted read of one scale past the end
(`--planted-read`) must be reported. Then the tool probes (`suites.sanitizer.tool_probes`: minimal kernels that
show what a tool reports for Triton's warp specialization and for TMA stores), each under its tool, reported
beside the kernels and not counted in the verdict. Then, for each tool, one pytest process (no xdist; the tools'
processes at the same time) runs the cases of SELECTION on the GPU under `compute-sanitizer --tool <tool>`, with torch's
caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own cudaMalloc, so an access past a
tensor's end is one past its allocation). The sanitizer's error records are attributed to kernels by the Triton
function they name (`KERNEL_MODULES`), the cases' outcomes come from pytest's JUnit XML. Writes
reports/<backend>-<slug>/sanitizer.{md,csv} and exits non-zero when a tool reports an error, a case fails or the
control goes uncaught.

The cases are the suites' named cases (hand-built inputs with expected bytes) and small fixed shapes, never the
hypothesis sweeps: the sanitizers slow kernels by orders of magnitude."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pathlib
import pkgutil
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck", "initcheck")
RUN_TIMEOUT_S = 1800  # a bound against a hang, not a speed requirement
PROGRESS_S = 60  # how often a run in progress says so
PROGRESS_LINE = re.compile(r"^([.sFExX]+)(\s+\[\s*\d+%\])?$")  # pytest -q: a character a case, then [ nn%]
GUARDED = "suites/sanitizer/test_guarded_calls.py::test_guarded_call_agrees"

# kernel module -> the pytest cases that run its kernels (node ids, relative to the repository root)
SELECTION = {
    "mxfp4": [
        "suites/quant/test_mxfp4.py::test_named_quantize_cases",
        "suites/quant/test_mxfp4.py::test_named_dequantize_cases",
    ],
    "nvfp4": [
        "suites/quant/test_nvfp4.py::test_named_quantize_cases",
        "suites/quant/test_nvfp4.py::test_named_dequantize_cases",
    ],
    "fp8_quant": ["suites/quant/test_fp8_quant.py::test_named_cases"],
    "block_fp8_gemm": [
        "suites/gemm/test_block_fp8_gemm.py::test_named_cases",
        "suites/gemm/test_block_fp8_gemm.py::test_tiny_and_empty_shapes",
    ],
    "block_fp8_gemm_wgmma": [  # its named cases run with block_fp8_gemm's (on both of its configs)
        "suites/gemm/test_block_fp8_gemm.py::test_wgmma_kernel_bit_equals_the_tiled_kernel[two_blocks-one_program-one_partition]",
        "suites/gemm/test_block_fp8_gemm.py::test_wgmma_kernel_bit_equals_the_tiled_kernel[odd_blocks_unaligned_rows-grid-one_partition]",
        "suites/gemm/test_block_fp8_gemm.py::test_wgmma_kernel_bit_equals_the_tiled_kernel[five_blocks-three_programs-one_partition]",
        "suites/gemm/test_block_fp8_gemm.py::test_wgmma_kernel_bit_equals_the_tiled_kernel[two_blocks-one_program-warp_specialized]",
        "suites/gemm/test_block_fp8_gemm.py::test_wgmma_kernel_bit_equals_the_tiled_kernel[odd_blocks_unaligned_rows-grid-warp_specialized]",
        "suites/gemm/test_block_fp8_gemm.py::test_wgmma_kernel_bit_equals_the_tiled_kernel[five_blocks-three_programs-warp_specialized]",
    ],
    "w4a16_mxfp4_gemm": [
        "suites/gemm/test_w4a16_mxfp4_gemm.py::test_named_cases",
        "suites/gemm/test_w4a16_mxfp4_layout.py::test_opcheck",
    ],
    "w4a16_nvfp4_gemm": [
        "suites/gemm/test_w4a16_nvfp4_gemm.py::test_named_cases",
        "suites/gemm/test_w4a16_nvfp4_gemm.py::test_split_k_and_ragged_k_tiles",
    ],
    "w4a16_mxfp4_fragment_gemv": [
        "suites/gemm/test_w4a16_mxfp4_fragment_gemv.py::test_named_cases",
        "suites/gemm/test_w4a16_mxfp4_fragment_gemv.py::test_launch_shapes",
    ],
    "w4a16_mxfp4_fragment_gemm": [
        "suites/gemm/test_w4a16_mxfp4_fragment_gemv.py::test_tiled_path_steps_past_the_end",
        "suites/gemm/test_w4a16_mxfp4_fragment_gemv.py::test_tiled_table_rows",
        "suites/gemm/test_w4a16_mxfp4_fragment_gemv.py::test_nan_scale_poisons_its_row_only",
    ],
    "mxfp4_fragment_layout": ["suites/gemm/test_w4a16_mxfp4_fragment_gemv.py::test_opcheck"],
    "mxfp4_fragment_dequantize": ["suites/quant/test_mxfp4_fragment_dequantize.py::test_named_dequantize_cases"],
    "split_k": ["suites/gemm/test_split_k.py::test_sum_is_in_split_order"],
    "rms_norm": ["suites/norm/test_rms_norm.py::test_named_cases"],
    "_fp8_groups": ["suites/norm/test_rms_norm.py::test_opcheck_fp8"],
    "silu_and_mul": [
        "suites/activation/test_silu_and_mul.py::test_named_values",
        "suites/activation/test_silu_and_mul.py::test_opcheck",
    ],
    "rope": ["suites/rotary/test_rope.py::test_special_values"],
    "paged_decode": [
        "suites/attention/test_paged_decode.py::test_seq_len_one_returns_its_value_row",
        "suites/attention/test_paged_decode.py::test_one_dominant_key_takes_all_weight",
        "suites/attention/test_paged_decode.py::test_fp8_dominant_key_by_its_scale_alone",
        "suites/attention/test_paged_decode_fp8_parts.py::test_v_scales_far_outside_fp16_range",
    ],
    "paged_decode_fp8_mma": [
        "suites/attention/test_paged_decode_fp8_mma.py::test_v_scales_far_outside_fp16_range",
        "suites/attention/test_paged_decode_fp8_mma.py::test_bf16_q_far_outside_fp16_range",
    ],
    "_e4m3": ["suites/attention/test_paged_decode_fp8_parts.py::test_every_code_decodes_to_its_fp16"],
    "paged_prefill": [
        "suites/attention/test_paged_prefill.py::test_first_position_returns_its_value_row",
        "suites/attention/test_paged_prefill.py::test_dominant_key_is_seen_only_from_its_position",
    ],
    "kv_store": [
        "suites/kv/test_store.py::test_bf16_named_slots",
        "suites/kv/test_store.py::test_fp8_named_codes_and_scales",
    ],
    "kv_zeroer": [
        "suites/kv/test_zeroer.py::test_kernel_on_dsv4_packed_geometry",
        "suites/kv/test_zeroer.py::test_strided_block_ids",
    ],
    "mamba_state_update": [
        "suites/mamba/test_state_update.py::test_a_zero_state_is_exact",
        "suites/mamba/test_state_update.py::test_pad_slot_inside_the_pool_keeps_its_bytes",
    ],
    "mamba_conv1d_update": [
        "suites/mamba/test_conv1d_update.py::test_decode_steps_equal_the_prefill_conv",
        "suites/mamba/test_conv1d_update.py::test_pad_slot_inside_the_pool_keeps_its_bytes",
    ],
    "moe_align": [
        "suites/moe/test_fused_moe_kernel.py::test_alignment_named_case_bytes",  # one program
        "suites/moe/test_fused_moe_kernel.py::test_alignment_paths_bit_for_bit_and_their_controls[False-150]",
    ],
    "moe_gemm": [
        "suites/moe/test_fused_moe_kernel.py::test_fixed_layer_within_the_row",
        "suites/moe/test_fused_moe_kernel.py::test_prefill_tiles_read_weights_through_tma_within_the_row",
        "suites/moe/test_block_fp8_moe_kernel.py::test_fixed_layer_within_the_row",
        "suites/moe/test_block_fp8_moe_kernel.py::test_prefill_tiles_through_tma[none]",
        "suites/moe/test_block_fp8_moe_kernel.py::test_fused_quantization_gives_the_separate_pass_bytes[16]",
        "suites/moe/test_mxfp4_moe_kernel.py::test_fixed_layer_within_the_row",
    ],
    "block_fp8_gemv": ["suites/gemm/test_block_fp8_gemm.py::test_named_cases"],
    "moe_gemv": [
        "suites/moe/test_mxfp4_moe_kernel.py::test_decode_path_within_the_row_and_beside_the_grouped_gemm",
        "suites/moe/test_block_fp8_moe_kernel.py::test_decode_path_within_the_row_and_beside_the_grouped_gemm",
    ],
    "mxfp4_moe_fragment_gemv": [
        "suites/moe/test_mxfp4_moe_fragment_kernel.py::test_launch_configs_beside_the_interchange_layer[silu-config0]",
        "suites/moe/test_mxfp4_moe_fragment_kernel.py::test_launch_configs_beside_the_interchange_layer[swiglu_oai-config7]",
        "suites/moe/test_mxfp4_moe_fragment_kernel.py::test_zeroed_and_poisoned_surroundings_give_the_same_bytes",
    ],
    "moe_combine": ["suites/moe/test_mxfp4_moe_fragment_kernel.py::test_combine_sums_the_kept_rows_in_order[3]"],
    # several modules' kernels with guard bytes and poisoned outputs; their errors are attributed by kernel name
    "guarded calls": [
        GUARDED,
        "suites/moe/test_fused_moe_kernel.py::test_zeroed_and_poisoned_surroundings_give_the_same_bytes",
        "suites/moe/test_block_fp8_moe_kernel.py::test_zeroed_and_poisoned_surroundings_give_the_same_bytes",
    ],
}

ERROR_START = re.compile(r"^========= (Invalid|Uninitialized|Error|Program hit|Race|Malloc|Cuda|Barrier|Host API)")
# initcheck's records of a host copy of device bytes no kernel wrote name no kernel: their own row
HOST_API = "host API (copy of unwritten bytes)"
SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


def kernel_modules() -> dict[str, str]:
    """Triton function name -> its kernels/ module (the name compute-sanitizer prints for the launch)."""
    import inspect

    import kernels

    names = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        for obj in vars(module).values():
            # @triton.jit objects (JITFunction, or InterpretedFunction under TRITON_INTERPRET=1) hold the
            # Python function as .fn; only this module's own, not the helpers it imports
            fn = getattr(obj, "fn", None)
            if (
                type(obj).__module__.startswith("triton.")
                and inspect.isfunction(fn)
                and fn.__module__ == module.__name__
            ):
                names[fn.__name__] = info.name
    return names


@dataclasses.dataclass
class ToolRun:
    errors: dict[str, int]  # kernels/ module (or "other") -> error records
    total_errors: int
    cases: dict[str, tuple[int, int]]  # SELECTION key -> (cases run, cases failed)
    returncode: int


def parse_log(text: str, names: dict[str, str]) -> tuple[dict[str, int], int]:
    """Error records per kernel module, and the summary's total (records whose kernel is not a Triton
    function of kernels/ count as "other")."""
    errors: dict[str, int] = {}
    record: list[str] | None = None
    records: list[list[str]] = []
    for line in text.splitlines():
        if ERROR_START.match(line):
            record = [line]
            records.append(record)
        elif record is not None and line.startswith("========="):
            record.append(line)
    for rec in records:
        # The kernel is named in the record's first lines ("at _gemv_kernel+0x1b0", "in _dot_kernel"); the
        # host backtrace below them is left out, its symbols could collide with helper names.
        words = set(re.findall(r"[A-Za-z_]\w*", " ".join(rec[:3])))
        module = next((names[w] for w in sorted(words) if w in names), "other")
        if rec[0].startswith("========= Host API"):
            module = HOST_API
        errors[module] = errors.get(module, 0) + 1
    totals = [int(n) for n in SUMMARY.findall(text)]
    return errors, sum(totals) if totals else sum(errors.values())


def parse_junit(path: pathlib.Path) -> dict[str, tuple[int, int]]:
    """SELECTION key -> (cases run, cases failed or errored) from pytest's JUnit XML."""
    counts = {key: [0, 0] for key in SELECTION}
    if path.is_file():
        for case in ET.parse(path).getroot().iter("testcase"):
            if case.find("skipped") is not None:
                continue
            node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
            failed = case.find("failure") is not None or case.find("error") is not None
            for key, nodes in SELECTION.items():
                if node in nodes or node.split("[")[0] in nodes:  # a parametrized case, selected alone or all
                    counts[key][0] += 1
                    counts[key][1] += failed
    return {key: (run, failed) for key, (run, failed) in counts.items()}


# Error records a tool prints (its summary counts them all; the report gives the rest a row of their own)
PRINT_LIMIT = 100


def sanitizer_command(tool: str, log: pathlib.Path) -> list[str]:
    binary = shutil.which("compute-sanitizer")
    if binary is None:
        raise SystemExit("sanitize: compute-sanitizer is not on PATH (it ships with the CUDA toolkit)")
    return [binary, "--tool", tool, "--print-limit", str(PRINT_LIMIT), "--log-file", str(log)]


def start_tool(tool: str, work: pathlib.Path) -> subprocess.Popen:
    """One pytest process (no xdist) over SELECTION's cases under `tool`, started (log and JUnit XML in `work`)."""
    log, junit = work / f"{tool}.log", work / f"{tool}.xml"
    nodes = sorted({node for nodes in SELECTION.values() for node in nodes})
    pytest = [sys.executable, "-m", "pytest", *nodes, "--device", "cuda", "-q", "-p", "no:cacheprovider"]
    pytest += ["-p", "no:xdist", "--junitxml", str(junit)]
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "HYPOTHESIS_PROFILE": "dev"}
    print(f"sanitize: {tool} over {len(nodes)} test functions, started", flush=True)
    return _start(sanitizer_command(tool, log) + pytest, env, work / f"{tool}.out")


def _start(command: list[str], env: dict[str, str], output: pathlib.Path) -> subprocess.Popen:
    """`command` (compute-sanitizer and the program it runs) started in its own process group, so that a hang is
    killed with the program, which compute-sanitizer runs as its child; its output to `output` (printed only when
    the run fails)."""
    with output.open("w") as sink:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink, start_new_session=True)


def _wait(name: str, process: subprocess.Popen, deadline: float, output: pathlib.Path) -> int:
    """The exit status of `process`, waited on until `deadline` (time.monotonic()), then killed with its process
    group: a hang is reported, not waited on. A failed run's output is printed."""
    try:
        returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        returncode = process.wait()
        print(f"sanitize: {name} killed at its bound", flush=True)
    if returncode:
        print(output.read_text()[-4000:], flush=True)
    return returncode


def finish_tool(
    tool: str, process: subprocess.Popen, deadline: float, work: pathlib.Path, names: dict[str, str]
) -> ToolRun:
    """Wait for `tool`'s process until `deadline` (`_wait`) and read its records and case outcomes."""
    returncode = _wait(tool, process, deadline, work / f"{tool}.out")
    log, junit = work / f"{tool}.log", work / f"{tool}.xml"
    errors, total = parse_log(log.read_text() if log.is_file() else "", names)
    print(f"sanitize: {tool} done: {total} errors, exit {returncode}", flush=True)
    return ToolRun(errors, total, parse_junit(junit) if junit.is_file() else {}, returncode)


def run_tools(tools: list[str], work: pathlib.Path, names: dict[str, str]) -> dict[str, ToolRun]:
    """The tools at once, one process each. Why: run one after another over this selection they took longer than
    one 600 s call of the project's GPU machine (initcheck was still running at b6a9041); a sanitized run is mostly
    the host's work per launch, one core a process, so at once they take about the slowest tool's time."""
    started = time.monotonic()
    deadline = started + RUN_TIMEOUT_S
    processes = {tool: start_tool(tool, work) for tool in tools}
    # Progress while they run (their pytest output goes to files: three at once would interleave): which are left,
    # and how many cases each has finished, from pytest's one character a case.
    next_report = started + PROGRESS_S
    while (running := [t for t, p in processes.items() if p.poll() is None]) and time.monotonic() < deadline:
        if time.monotonic() >= next_report:
            done = ", ".join(f"{t} {_cases_done(work / f'{t}.out')}" for t in running)
            print(f"sanitize: {time.monotonic() - started:.0f} s; still running (cases done): {done}", flush=True)
            next_report += PROGRESS_S
        time.sleep(0.1)
    return {tool: finish_tool(tool, process, deadline, work, names) for tool, process in processes.items()}


def _cases_done(output: pathlib.Path) -> int:
    """Cases pytest -q has reported in `output` so far: its progress lines' outcome characters."""
    lines = output.read_text(errors="replace").splitlines() if output.is_file() else []
    return sum(len(m[1]) for line in lines if (m := PROGRESS_LINE.match(line)))


def planted_read() -> int:
    """The negative control's body (run under memcheck): the W4A16 GEMM with its scale read past the end."""
    import torch

    from kernels import w4a16_mxfp4_gemm
    from reference.quant.mxfp4 import quantize_mxfp4

    gen = torch.Generator().manual_seed(0)
    codes, scales = quantize_mxfp4(torch.randn(19, 96, generator=gen).to(torch.bfloat16))
    x = torch.randn(1, 96, generator=gen).to(torch.bfloat16).cuda()
    try:
        w4a16_mxfp4_gemm.launch(x, codes.cuda(), scales.cuda(), fault="scale_past_end")
        torch.cuda.synchronize()
    except RuntimeError as err:  # memcheck stops the faulting kernel: the launch fails, as it should here
        print(f"planted read: {type(err).__name__}: {str(err).splitlines()[0]}")
    return 0


def _run_self(
    name: str, tool: str, flag: list[str], work: pathlib.Path, names: dict[str, str], bound_s: float
) -> tuple[dict[str, int], int, int]:
    """This module with `flag` under `tool` (the control, a probe), bounded by `bound_s`, on its own allocations:
    (error records by kernel module, total, exit status). Its log and output: `work`/<name>.log, .out."""
    log, output = work / f"{name}.log", work / f"{name}.out"
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    command = [*sanitizer_command(tool, log), sys.executable, "-m", "suites.sanitize", *flag]
    returncode = _wait(name, _start(command, env, output), time.monotonic() + bound_s, output)
    return (*parse_log(log.read_text() if log.is_file() else "", names), returncode)


def run_control(work: pathlib.Path, names: dict[str, str]) -> tuple[int, int]:
    """(error records attributed to the W4A16 GEMM, total) of memcheck on the planted read."""
    print("sanitize: negative control (W4A16 scale read past the end) under memcheck ...", flush=True)
    errors, total, returncode = _run_self("control", "memcheck", ["--planted-read"], work, names, RUN_TIMEOUT_S)
    if not returncode:  # the planted read reports how its launch ended (a failed run's output is printed already)
        print((work / "control.out").read_text()[-2000:], flush=True)
    return errors.get("w4a16_mxfp4_gemm", 0), total


# `suites.sanitizer.tool_probes`'s probes and the tool each is run under (named here: that module imports Gluon,
# which this process need not load), and a bound on each: a probe takes seconds.
PROBES = {"ws_handshake": "racecheck", "tma_store": "initcheck"}
PROBE_TIMEOUT_S = 300


def run_probes(tools: list[str], work: pathlib.Path, names: dict[str, str]) -> dict[str, tuple[str, int, int]]:
    """Probe -> (its tool, error records, exit status), for the probes of the selected `tools`."""
    results = {}
    for name, tool in PROBES.items():
        if tool in tools:
            print(f"sanitize: probe {name} under {tool} ...", flush=True)
            bound = min(PROBE_TIMEOUT_S, RUN_TIMEOUT_S)
            _, total, returncode = _run_self(f"probe_{name}", tool, ["--probe", name], work, names, bound)
            results[name] = (tool, total, returncode)
    return results


def main(argv: list[str] | None = None) -> int:
    global RUN_TIMEOUT_S
    p = argparse.ArgumentParser(prog="python -m suites.sanitize", description=__doc__.split("\n")[0])
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "reports")
    p.add_argument("--timeout-s", type=float, default=RUN_TIMEOUT_S, help="bound on each run, against a hang")
    p.add_argument("--planted-read", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.timeout_s <= 0:
        p.error(f"--timeout-s: a bound in seconds above 0, got {args.timeout_s:g}")
    RUN_TIMEOUT_S = args.timeout_s
    if args.planted_read:
        return planted_read()
    if args.probe:
        from suites.sanitizer.tool_probes import check

        check(args.probe)
        return 0
    tools = args.tools.split(",")
    if unknown := set(tools) - set(TOOLS):
        p.error(f"--tools: unknown {sorted(unknown)}; known {', '.join(TOOLS)}")
    from suites.sanitize_report import write_report

    names = kernel_modules()
    with tempfile.TemporaryDirectory(prefix="touchstone-sanitize-") as tmp:
        work = pathlib.Path(tmp)
        control = run_control(work, names)
        probes = run_probes(tools, work, names)
        runs = run_tools(tools, work, names)
    folder, ok = write_report(args.out, runs, control, probes)
    print(f"wrote {folder}/sanitizer.md, .csv", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
