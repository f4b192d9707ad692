"""The sanitizer tier's plumbing, on the CPU: every selected case exists, error records are attributed to the
kernel they name (not to symbols of the host backtrace), JUnit outcomes are counted per kernel, a bad tool
name is refused, the tools run at once (a stand-in sanitizer) each with its own records, and a hung one is
killed at the bound and fails the run. The tier itself runs on a GPU (`nox -s sanitize`)."""

from __future__ import annotations

import pathlib
import sys

import pytest

from suites import sanitize

# compute-sanitizer's record layout (memcheck and racecheck), with Triton kernel names
LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 1 bytes
=========     at _gemv_kernel+0x1b0
=========     by thread (3,0,0) in block (1,0,0)
=========     Address 0x7f0000001230 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: _dot_kernel_launcher in launcher.so
=========
========= Error: Race reported between Write access at 0x1a0 in _rms_norm_kernel
=========     and Read access at 0x1c0 in _rms_norm_kernel [128 hazards]
=========
========= Invalid __global__ write of size 4 bytes
=========     at some_cuda_library_kernel+0x20
=========
========= ERROR SUMMARY: 3 errors
"""


def test_every_selected_case_exists():
    root = sanitize.ROOT
    for kernel, nodes in sanitize.SELECTION.items():
        for node in nodes:
            path, name = node.split("::")
            assert f"def {name.split('[')[0]}(" in (root / path).read_text(), f"{kernel}: {node} does not exist"


def test_every_kernel_module_has_cases():
    modules = set(sanitize.kernel_modules().values())
    # modules of jit helpers that launch nothing of their own
    helpers = {"_e2m1", "_mamba", "_tiles", "_paged", "_fp8_fragment_rows", "_mxfp4_fragment_tiles", "_pdl"}
    assert modules - set(sanitize.SELECTION) <= helpers, modules


def test_records_are_attributed_to_the_kernel_they_name():
    names = sanitize.kernel_modules()
    assert names["_gemv_kernel"] == "w4a16_mxfp4_gemm"
    errors, total = sanitize.parse_log(LOG, names)
    assert total == 3
    assert errors == {"w4a16_mxfp4_gemm": 1, "rms_norm": 1, "other": 1}


def test_initchecks_host_copy_records_get_their_own_row():
    log = (
        "========= Host API memory access error at host access to 0x7f1162867800 of size 240 bytes\n"
        "=========     Uninitialized access to 0x7f1162867800 on access by cudaMemcpy source\n"
        "=========         Host Frame: _gemv_kernel_launcher in launcher.so\n"
        "========= ERROR SUMMARY: 1 error\n"
    )
    assert sanitize.parse_log(log, {"_gemv_kernel": "w4a16_mxfp4_gemm"}) == ({sanitize.HOST_API: 1}, 1)


def test_a_clean_log_has_no_errors():
    assert sanitize.parse_log("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", {}) == ({}, 0)


def test_junit_outcomes_are_counted_per_kernel(tmp_path: pathlib.Path):
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="suites.norm.test_rms_norm" name="test_named_cases[zero-bf16]"/>'
        '<testcase classname="suites.norm.test_rms_norm" name="test_named_cases[nan-bf16]"><failure/></testcase>'
        '<testcase classname="suites.rotary.test_rope" name="test_special_values[inf]"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = sanitize.parse_junit(junit)
    assert counts["rms_norm"] == (2, 1)
    assert counts["rope"] == (0, 0)


def test_a_parametrized_case_selected_alone_is_counted(tmp_path: pathlib.Path):
    node = next(n for n in sanitize.SELECTION["moe_align"] if "[" in n)
    path, name = node.split("::")
    junit = tmp_path / "r.xml"
    junit.write_text(
        f'<testsuites><testsuite name="pytest"><testcase classname="{path[:-3].replace("/", ".")}" name="{name}"/>'
        "</testsuite></testsuites>"
    )
    assert sanitize.parse_junit(junit)["moe_align"] == (1, 0)


def test_an_unknown_tool_is_refused(capsys):
    with pytest.raises(SystemExit):
        sanitize.main(["--tools", "memcheck,leakcheck"])
    assert "--tools: unknown ['leakcheck']" in capsys.readouterr().err


def _fake_sanitizer(body: str):
    """A stand-in for compute-sanitizer: writes its --log-file with `body`'s records, then runs the Python
    statement `body` names after a '|' (the pytest command it is handed is ignored)."""
    records, _, statement = body.partition("|")

    def command(tool: str, log: pathlib.Path) -> list[str]:
        script = f"import pathlib, time; pathlib.Path({str(log)!r}).write_text({records!r}); {statement or 'pass'}"
        return [sys.executable, "-c", script]

    return command


def test_tools_run_at_once_and_each_reports_its_own_records(tmp_path, monkeypatch):
    monkeypatch.setattr(sanitize, "sanitizer_command", _fake_sanitizer(LOG))
    runs = sanitize.run_tools(["memcheck", "racecheck"], tmp_path, {"_gemv_kernel": "w4a16_mxfp4_gemm"})
    assert set(runs) == {"memcheck", "racecheck"}
    for run in runs.values():
        assert run.returncode == 0 and run.total_errors == 3
        assert run.errors["w4a16_mxfp4_gemm"] == 1
        assert run.cases == {}  # no JUnit XML written: no cases counted, none invented


def test_a_hung_tool_is_killed_at_the_bound_and_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sanitize, "sanitizer_command", _fake_sanitizer("|time.sleep(600)"))
    monkeypatch.setattr(sanitize, "RUN_TIMEOUT_S", 1)
    (run,) = sanitize.run_tools(["initcheck"], tmp_path, {}).values()
    assert run.returncode != 0  # killed: the report's verdict fails on it
    assert run.total_errors == 0 and run.cases == {}


def test_progress_counts_the_cases_pytest_has_reported(tmp_path):
    out = tmp_path / "memcheck.out"
    out.write_text("..s.F                    [ 40%]\n...x\nsuites/x.py::test_y FAILED\n")
    assert sanitize._cases_done(out) == 9
    assert sanitize._cases_done(tmp_path / "missing.out") == 0


def test_a_slow_tool_reports_progress_while_it_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sanitize, "sanitizer_command", _fake_sanitizer("|time.sleep(2)"))
    monkeypatch.setattr(sanitize, "PROGRESS_S", 0.2)
    (run,) = sanitize.run_tools(["racecheck"], tmp_path, {}).values()
    assert run.returncode == 0
    assert "still running (cases done): racecheck 0" in capsys.readouterr().out


def test_the_control_is_read_from_its_own_log_and_a_hung_one_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(sanitize, "sanitizer_command", _fake_sanitizer(LOG))
    assert sanitize.run_control(tmp_path, {"_gemv_kernel": "w4a16_mxfp4_gemm"}) == (1, 3)
    monkeypatch.setattr(sanitize, "sanitizer_command", _fake_sanitizer("|time.sleep(600)"))
    monkeypatch.setattr(sanitize, "RUN_TIMEOUT_S", 1)
    assert sanitize.run_control(tmp_path, {}) == (0, 0)  # killed: not caught, and the run goes on to its report


def test_each_probe_runs_under_its_tool_and_is_reported_beside_the_verdict(tmp_path, monkeypatch):
    from suites.sanitize_report import write_report
    from suites.sanitizer.tool_probes import BODIES

    assert set(BODIES) == set(sanitize.PROBES)
    tools = []

    def fake(tool, log):
        tools.append(tool)
        return _fake_sanitizer(LOG)(tool, log)

    monkeypatch.setattr(sanitize, "sanitizer_command", fake)
    probes = sanitize.run_probes(list(sanitize.TOOLS), tmp_path, {})
    assert probes == {name: (tool, 3, 0) for name, tool in sanitize.PROBES.items()}
    assert tools == list(sanitize.PROBES.values()) == ["racecheck", "initcheck"]
    tools.clear()
    assert set(sanitize.run_probes(["memcheck", "initcheck"], tmp_path, {})) == {"tma_store"}  # --tools is heeded
    assert tools == ["initcheck"]
    clean = sanitize.ToolRun({}, 0, {"rms_norm": (2, 0)}, 0)
    probes["tma_store"] = ("initcheck", 0, 1)  # a probe that could not run is not a clean one
    folder, ok = write_report(tmp_path / "reports", {"memcheck": clean}, (1, 1), probes)
    assert ok  # the probes' records are not the kernels'
    text = (folder / "sanitizer.md").read_text()
    assert "## Tool probes" in text and "| ws_handshake | racecheck |" in text
    assert "| tma_store    | initcheck | did not run (exit 1) |" in text


def test_a_hung_probe_is_killed_at_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(sanitize, "sanitizer_command", _fake_sanitizer("|time.sleep(600)"))
    monkeypatch.setattr(sanitize, "PROBE_TIMEOUT_S", 1)
    probes = sanitize.run_probes(["racecheck"], tmp_path, {})
    assert list(probes) == ["ws_handshake"] and probes["ws_handshake"][2] != 0


def test_errors_past_the_print_limit_get_a_row_so_the_table_sums_to_the_tools_total(tmp_path):
    """compute-sanitizer counts every error in its summary but prints only the first --print-limit records: the
    report's table adds the rest as a row of their own (initcheck's 12,932 errors against 100 printed records)."""
    import pandas as pd

    from suites.sanitize_report import UNPRINTED, write_report

    run = sanitize.ToolRun({"host API (copy of unwritten bytes)": 100}, 12932, {"rms_norm": (2, 0)}, 0)
    folder, ok = write_report(tmp_path / "reports", {"initcheck": run}, (1, 1))
    table = pd.read_csv(folder / "sanitizer.csv")
    assert not ok and int(table["errors"].sum()) == 12932
    assert table.set_index("kernel").loc[UNPRINTED, "errors"] == 12832
    full = sanitize.ToolRun({"rms_norm": 3}, 3, {"rms_norm": (2, 0)}, 0)
    folder, _ = write_report(tmp_path / "again", {"initcheck": full}, (1, 1))
    assert UNPRINTED not in set(pd.read_csv(folder / "sanitizer.csv")["kernel"])
