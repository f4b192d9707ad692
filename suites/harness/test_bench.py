"""The bench/ harness on CPU: registry sweep, tidy CSV, Markdown/PNG reports, rebuild, verdicts, CLI.

A dummy op (impls built from torch copy/add) stands in for real kernels, with one impl per verdict the
runner can give: baseline, exact, mismatch, skipped (reason, and factory raising Unavailable), error.
No torch.compile here (minutes on 2 cores); timing windows are shrunk so the whole file runs in seconds.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import inspect
import io
import math
import re

import pytest
import torch

from bench import accuracy, cli, environment, oss_records, report, tables
from bench import rows as tidy
from bench.correctness import compare_exact
from bench.environment import NVIDIA_SMI_QUERIES, collect, parse_nvidia_smi
from bench.registry import ACCURACY_REPORTS, REGISTRY, AccuracyReport, Case, Impl, OpBench, Unavailable, discover
from bench.roofs import Roof, Roofs
from bench.rows import COLUMNS, KEY
from bench.runner import Progress, RunConfig, count_measurements, run_op
from bench.timing import MIN_SAMPLES, Timing, bench, summarize
from kernels.platform import Platform

FAST = dict(warmup_ms=1.0, rep_ms=2.0)
CASES = [Case("4KiB", 4.0, (1024,)), Case("16KiB", 16.0, (4096,))]


def _unavailable(x: torch.Tensor):
    raise Unavailable("kernels.dummy is not importable")


def _broken(x: torch.Tensor):
    return lambda: x / torch.zeros(3)  # shapes do not broadcast: RuntimeError on the first call


def _out_of_memory(x: torch.Tensor):
    def fn():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")

    return fn


class InductorError(Exception):
    """Stands in for torch._inductor.exc.InductorError: the runner recognizes compile failures by name."""


def _fails_to_compile(x: torch.Tensor):
    def fn():
        raise InductorError("CppCompileError: C++ compile error")

    return fn


def dummy_op() -> OpBench:
    impls = (
        Impl("copy", lambda x: lambda: x.clone()),
        Impl("add-zero", lambda x: lambda: x + 0),
        Impl("off-by-one", lambda x: lambda: x + 1),
        Impl(
            "small-only",
            lambda x: lambda: x.clone(),
            lambda case, backend: "too large for this impl" if case.x_value > 8 else None,
        ),
        Impl("missing", _unavailable),
        Impl("broken", _broken),
        Impl("oom", _out_of_memory),
        Impl("no-compile", _fails_to_compile),
    )
    return OpBench(
        name="dummy_copy",
        area="test",
        dtype="float32",
        x_name="KiB",
        sweeps={"small": CASES, "full": CASES},
        make_inputs=lambda case, device: torch.arange(case.shape[0], dtype=torch.float32, device=device),
        impls=impls,
        bytes_model=lambda case: 2 * 4 * case.shape[0],
        flops_model=lambda case: 0,
        roof="memcpy",
        baselines=("copy",),
        compare_to="copy",
        headline=(("add-zero", "copy"), ("add-zero", "memcpy")),
    )


def fake_roofs() -> Roofs:
    timing = Timing(0.9, 1.0, 1.1, 10)
    memcpy = Roof("memcpy", "torch.Tensor.copy_", "uint8", (1 << 30,), 2 << 30, 0, timing)
    gemm = Roof("gemm", "torch.matmul", "bfloat16", (64, 64, 64), 3 * 64 * 64 * 2, 2 * 64**3, timing)
    return Roofs(memcpy, gemm)


# These are self-tests of the harness: they run it on the CPU whatever tier the suite runs on.
CPU = Platform("cpu", "Test CPU", 1, None, "x86_64", "cpu")


@pytest.fixture(scope="module")
def env():
    return collect(CPU)


@pytest.fixture(scope="module")
def dummy_rows(env):
    op = dummy_op()
    config = RunConfig(sweep="small", **FAST)
    stream = io.StringIO()
    rows = run_op(op, env, fake_roofs(), config, Progress(count_measurements(op, config), stream))
    return rows, stream.getvalue()


def squeeze(markdown: str) -> str:
    """Markdown with runs of spaces collapsed: tables are padded to their widest cell."""
    return re.sub(r" +", " ", markdown)


def same_rows(frame, rows) -> bool:
    """A read-back frame holds the measured rows (missing numbers read back as NaN)."""
    back = frame.to_dict("records")
    norm = lambda v: None if isinstance(v, float) and math.isnan(v) else v
    return len(back) == len(rows) and all(
        {k: norm(v) for k, v in got.items()} == {k: norm(v) for k, v in want.items()}
        for got, want in zip(back, rows, strict=True)
    )


def _cell(rows, impl, x):
    (row,) = [row for row in rows if row["impl"] == impl and row["x_value"] == x]
    return row


def test_sweep_gives_one_row_per_impl_and_case(dummy_rows):
    rows, log = dummy_rows
    assert len(rows) == len(CASES) * 8
    assert len({tuple(row[k] for k in (*KEY, "x_value")) for row in rows}) == len(rows)
    assert "[1/16] dummy_copy copy 4KiB" in log and "[16/16]" in log
    for row in rows:
        assert set(row) == set(COLUMNS)
        if row["p50"] is not None:
            assert row["p20"] <= row["p50"] <= row["p80"] and row["n_samples"] >= MIN_SAMPLES
            assert row["gbps"] == pytest.approx(row["bytes"] / (row["p50"] * 1e-3) / 1e9)
            assert row["fraction_of_roof"] == pytest.approx(row["gbps"] / row["roof_value"])
            assert row["roof_name"] == "memcpy" and row["tflops"] is None


def test_verdicts_are_recorded(dummy_rows):
    rows, _ = dummy_rows
    assert _cell(rows, "copy", 4.0)["correctness"] == "baseline"
    assert _cell(rows, "add-zero", 16.0)["correctness"] == "exact"
    assert _cell(rows, "off-by-one", 4.0)["correctness"] == "mismatch 1024/1024"
    assert _cell(rows, "small-only", 4.0)["correctness"] == "exact"
    skipped = _cell(rows, "small-only", 16.0)
    assert skipped["correctness"] == "skipped: too large for this impl" and skipped["p50"] is None
    assert _cell(rows, "missing", 4.0)["correctness"] == "skipped: kernels.dummy is not importable"
    assert _cell(rows, "broken", 4.0)["correctness"].startswith("error: RuntimeError")
    assert _cell(rows, "broken", 16.0)["correctness"].startswith("error: RuntimeError")
    assert _cell(rows, "oom", 4.0)["correctness"].startswith("skipped: out of memory (OutOfMemoryError: CUDA")
    assert _cell(rows, "no-compile", 4.0)["correctness"].startswith("error: InductorError")
    assert _cell(rows, "no-compile", 16.0)["correctness"] == "skipped: compilation failed at 4KiB (error in that row)"


def test_correctness_only_baseline_when_not_selected(env):
    op = dummy_op()
    config = RunConfig(sweep="small", impls=["off-by-one"], cases=["4KiB"], **FAST)
    stream = io.StringIO()
    rows = run_op(op, env, fake_roofs(), config, Progress(1, stream))
    assert [row["impl"] for row in rows] == ["off-by-one"]
    assert rows[0]["correctness"] == "mismatch 1024/1024"
    assert "[--] dummy_copy copy 4KiB  correctness-only run: baseline" in stream.getvalue()


def test_time_budget_skips_remaining(env):
    config = RunConfig(sweep="small", deadline=0.0, **FAST)
    rows = run_op(dummy_op(), env, fake_roofs(), config, Progress(16, io.StringIO()))
    assert {row["correctness"] for row in rows} >= {"skipped: time budget exhausted"}
    assert all(row["p50"] is None for row in rows)


def test_report_files_and_rebuild_from_csv(dummy_rows, tmp_path, monkeypatch):
    rows, _ = dummy_rows
    monkeypatch.setitem(REGISTRY, "dummy_copy", dummy_op())
    folder = tmp_path / "cpu-test"
    tidy.upsert(folder / "dummy_copy.csv", rows)
    report.render_op(folder, "dummy_copy")
    report.render_index(folder)
    with open(folder / "dummy_copy.csv", newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS
    assert same_rows(tidy.read(folder / "dummy_copy.csv"), rows)
    md = (folder / "dummy_copy.md").read_text()
    assert "| KiB | shape | MB moved | copy | add-zero | off-by-one | small-only | missing | broken | oom |" in squeeze(
        md
    )
    assert "mismatch 1024/1024" in md and "skipped: too large for this impl" in md
    assert "add-zero vs copy:" in md and "add-zero vs memcpy:" in md and "touchstone bench --ops dummy_copy" in md
    assert (folder / "dummy_copy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (folder / "index.md").read_text()
    assert "[dummy_copy](dummy_copy.md)" in index
    for name in ("dummy_copy.md", "dummy_copy.png", "index.md"):
        (folder / name).unlink()
    assert cli.report_main(["--out", str(tmp_path)]) == 0
    assert (folder / "dummy_copy.md").read_text() == md
    assert (folder / "index.md").read_text() == index and (folder / "dummy_copy.png").exists()


def test_index_counts_checked_rows_and_never_counts_unchecked_ones(dummy_rows, tmp_path, monkeypatch):
    rows, _ = dummy_rows
    monkeypatch.setitem(REGISTRY, "dummy_copy", dummy_op())
    unchecked = [
        dict(row, correctness="unchecked: no baseline ran") if row["impl"] == "add-zero" else row for row in rows
    ]
    summary = report.summary(tidy.frame(unchecked))
    # checked: off-by-one x2 (mismatches) and small-only at 4KiB; wrong: those mismatches and 3 errors (broken x2,
    # no-compile at 4KiB). The add-zero rows, exact before, count as neither once they are unchecked.
    assert (summary["checked"], summary["wrong: ours / peers"]) == ("3", "5 / 0")
    assert report.summary(tidy.frame(rows))["checked"] == "5"


def test_other_report_tables_are_linked_without_warnings(dummy_rows, tmp_path, monkeypatch, capsys):
    rows, _ = dummy_rows
    monkeypatch.setitem(REGISTRY, "dummy_copy", dummy_op())
    folder = tmp_path / "cpu-test"
    tidy.upsert(folder / "dummy_copy.csv", rows)
    tables.write(folder / "runner_w1.csv", tables.pd.DataFrame({"workload": ["w1"], "output_tok_per_s": [5.0]}))
    report.render_index(folder)
    assert "[runner_w1](runner_w1.md)" in (folder / "index.md").read_text()
    assert capsys.readouterr().err == ""


def test_rows_are_also_pytorch_oss_benchmark_records(dummy_rows, tmp_path):
    rows, _ = dummy_rows
    path = tmp_path / "dummy_copy.csv"
    tidy.upsert(path, rows)
    records = oss_records.read(tmp_path / "dummy_copy.pytorch.json")
    timed = [row for row in rows if row["p50"] is not None]
    assert len(records) == 3 * len(timed)  # latency p50, GB/s and the fraction of the roof, per timed row
    first = records[0]
    assert first["benchmark"]["name"] == "touchstone" and first["model"]["name"] == "dummy_copy"
    assert first["metric"]["name"] == "latency_ms_p50" and first["metric"]["benchmark_values"] == [timed[0]["p50"]]
    assert first["metric"]["extra_info"]["p20"] == timed[0]["p20"]
    assert first["runners"][0]["name"] == timed[0]["device"] and first["runners"][0]["extra_info"]["driver"]
    deps = first["dependencies"]
    assert deps["torch"]["version"] == torch.__version__ and deps["touchstone"]["sha"] == timed[0]["git_sha"]
    assert {r["metric"]["name"] for r in records} == {"latency_ms_p50", "gbps", "fraction_of_roof"}


def test_upsert_replaces_same_key_only(dummy_rows, tmp_path):
    rows, _ = dummy_rows
    path = tmp_path / "dummy_copy.csv"
    tidy.upsert(path, rows)
    rerun = [dict(row, correctness="exact", timestamp="later") for row in rows if row["impl"] == "off-by-one"]
    merged = tidy.upsert(path, rerun)
    assert len(merged) == len(rows) and tidy.read(path).equals(tidy.read(path))
    assert same_rows(tidy.read(path), merged.to_dict("records"))
    assert set(merged[merged["impl"] == "off-by-one"]["timestamp"]) == {"later"}
    assert list(merged["impl"].iloc[-2:]) == ["off-by-one", "off-by-one"]  # kept rows first, then the new ones


def test_cli_bench_end_to_end_with_mismatch(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("bench.environment.detect_platform", lambda: CPU)
    monkeypatch.setitem(REGISTRY, "dummy_copy", dummy_op())
    monkeypatch.setattr("bench.roofs.MEMCPY_BYTES", {"cpu": 1 << 20, "gpu": 1 << 20})
    monkeypatch.setattr("bench.roofs.GEMM_N", {"cpu": 64, "gpu": 64})
    status = cli.bench_main(["--ops", "dummy_copy", "--impls", "copy,off-by-one", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1  # a mismatch fails the run
    assert "[4/4]" in out and "2 checked against a baseline, 2 mismatches/errors in gated impls" in out
    (folder,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    assert {p.name for p in folder.iterdir()} >= {
        "dummy_copy.csv",
        "dummy_copy.md",
        "dummy_copy.png",
        "index.md",
        "roofs.csv",
    }
    roofs = tidy.read(folder / "roofs.csv")
    assert list(roofs["roof_name"]) == ["memcpy", "gemm"] and roofs["tflops"].iloc[1] > 0
    row = tidy.read(folder / "dummy_copy.csv").iloc[0]
    assert row["repro_cmd"] == "touchstone bench --ops dummy_copy --sizes small --impls copy --cases 4KiB"


def test_cli_rejects_unknown_names_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.bench_main(["--ops", "mxfp4_quantise"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown op 'mxfp4_quantise' (did you mean mxfp4_quantize?)" in err


def test_report_on_a_missing_folder_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.report_main(["--out", str(tmp_path / "nowhere")])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_compare_exact_is_bitwise():
    x = torch.tensor([0.0, 1.0, float("nan")])
    assert compare_exact(x, x.clone()) == "exact"
    assert compare_exact(torch.tensor([-0.0, 1.0]), torch.tensor([0.0, 1.0])) == "mismatch 1/2"
    codes = torch.zeros(4, dtype=torch.uint8)
    assert compare_exact((codes, codes), (codes, codes + 1)) == "mismatch 4/8"
    assert compare_exact(codes, codes[:2]).startswith("mismatch: output 0")


def test_timing_quantiles_and_cpu_loop():
    assert summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == Timing(1.8, 3.0, 4.2, 5)
    timing = bench(lambda: torch.ones(16).sum(), "cpu", **FAST)
    assert 0 < timing.p20 <= timing.p50 <= timing.p80 and timing.n_samples >= MIN_SAMPLES


def test_gpu_timing_goes_through_do_bench(monkeypatch):
    import triton.testing

    assert "return_mode" in inspect.signature(triton.testing.do_bench).parameters
    calls = []

    def fake_do_bench(fn, warmup, rep, return_mode):
        calls.append((warmup, rep, return_mode))
        fn()
        return [3.0, 1.0, 2.0, 4.0, 5.0]

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    # "fake" is no device synchronize() knows, so the GPU path runs here without a GPU.
    assert bench(lambda: None, "fake", warmup_ms=25, rep_ms=100) == Timing(1.8, 3.0, 4.2, 5)
    assert calls == [(25, 100, "all")]


def test_gpu_timing_flushes_l2_by_reading_not_zeroing(monkeypatch):
    """do_bench flushes L2 through the active driver's clear_cache, which zeroes its buffer; the harness reads the
    buffer instead (a zeroing flush leaves dirty lines whose write-back the timed call pays), and puts the
    driver's own back afterwards. A buffer of ones stays ones under the harness's flush, and is zeroed when
    do_bench's own is asked for."""
    import triton
    import triton.testing

    class Driver:
        def clear_cache(self, cache):
            cache.zero_()

    driver = Driver()
    monkeypatch.setattr(triton.runtime.driver, "_active", driver)
    flushed = []

    def fake_do_bench(fn, warmup, rep, return_mode):
        cache = torch.ones(8, dtype=torch.int32)
        triton.runtime.driver.active.clear_cache(cache)
        flushed.append(cache)
        return [1.0] * 5

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    bench(lambda: None, "fake", warmup_ms=1, rep_ms=1)
    bench(lambda: None, "fake", warmup_ms=1, rep_ms=1, flush="zero")
    assert flushed[0].eq(1).all() and flushed[1].eq(0).all()
    assert "clear_cache" not in vars(driver)  # the driver's own method again


def test_cuda_graph_timing_falls_back_and_says_so(monkeypatch):
    import triton.testing

    from bench import timing

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep, return_mode: [fn(), 1.0][1:] * 5)

    def not_capturable(fn, torch_device):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(timing, "graphed", not_capturable)
    result = bench(lambda: None, "fake", warmup_ms=1, rep_ms=1, cuda_graph=True)
    assert result.note.startswith("timed without a CUDA graph (RuntimeError: operation not permitted")
    assert bench(lambda: None, "fake", warmup_ms=1, rep_ms=1).note == ""


@pytest.mark.gpu_only(reason="captures a CUDA graph")
def test_cuda_graph_replays_the_work(device):
    if not device.startswith("cuda"):
        pytest.skip("CUDA graphs are CUDA's")
    from bench.timing import graphed

    x = torch.zeros(4, device=device)
    replay = graphed(lambda: x.add_(1), device)  # capture runs nothing
    torch.cuda.synchronize()
    replay()
    replay()
    torch.cuda.synchronize()
    assert x.tolist() == [2.0] * 4


def test_cuda_environment_reads_nvidia_smi(monkeypatch):
    platform = Platform("cuda", "NVIDIA H200", 1, (9, 0), "sm_90", "hopper", "13.0")
    commands = []

    def fake_run(args, timeout=15.0):
        commands.append(args)
        return None if "pci.bus_id" in args[1] else "1980 MHz, 3201 MHz, 1980 MHz, 3201 MHz, 700.00 W, 30\n"

    monkeypatch.setattr(environment, "_run", fake_run)
    driver, clocks = environment.driver_and_clocks(platform)
    assert driver == "unknown (torch built for cuda 13.0)" and clocks.startswith("sm=1980 MHz; mem=3201 MHz")
    assert all(args[0] == "nvidia-smi" and args[1].startswith("--query-gpu=") for args in commands)
    assert platform.slug == "h200"


def test_nvidia_smi_parsing_picks_torch_device():
    text = (
        "00000000:18:00.0, 570.124.06, 345 MHz, 2619 MHz, 1980 MHz, 3201 MHz, 700.00 W, 31\n"
        "00000000:2A:00.0, 570.124.06, 1980 MHz, 3201 MHz, 1980 MHz, 3201 MHz, 700.00 W, 36\n"
    )
    full, clocks_only = NVIDIA_SMI_QUERIES
    driver, clocks = parse_nvidia_smi(text, full, (0, 0x2A, 0))
    assert driver == "570.124.06"
    assert clocks == ("sm=1980 MHz; mem=3201 MHz; max_sm=1980 MHz; max_mem=3201 MHz; power_limit=700.00 W; temp_c=36")
    assert parse_nvidia_smi(text, full, None)[1].endswith("(first GPU listed; torch's not matched)")
    one_gpu = "1755 MHz, 3201 MHz, 1980 MHz, 3201 MHz, 700.00 W, 30\n"
    assert parse_nvidia_smi(one_gpu, clocks_only, (0, 0x2A, 0)) == (
        "unknown",
        "sm=1755 MHz; mem=3201 MHz; max_sm=1980 MHz; max_mem=3201 MHz; power_limit=700.00 W; temp_c=30",
    )


def test_environment_fields(env):
    fields = env.row_fields()
    assert set(fields) <= set(COLUMNS) and fields["backend"] == "cpu" and fields["torch"] == torch.__version__
    assert fields["dirty"] in ("true", "false", "unknown")


def test_mxfp4_definitions():
    ops = discover()
    quantize, dequantize = ops["mxfp4_quantize"], ops["mxfp4_dequantize"]
    full = {case.label: case for case in quantize.sweeps["full"]}
    assert list(full) == ["1MiB", "16MiB", "64MiB", "256MiB", "1GiB"]
    assert full["1GiB"].shape == (131072, 4096)
    assert all(case.x_value <= 8 for case in quantize.sweeps["small"])
    assert quantize.bytes_model(full["1MiB"]) == (1 << 20) + 128 * 2048 + 128 * 128
    assert dequantize.bytes_model(full["1GiB"]) == quantize.bytes_model(full["1GiB"])
    eager, triton = quantize.impl("reference-eager"), quantize.impl("triton")
    assert eager.skip_reason(full["1GiB"], "cuda") is None  # the definition checks every GPU size
    assert eager.gated and triton.gated and not quantize.impl("reference-compiled").gated
    assert triton.skip_reason(full["1MiB"], "cpu") and triton.skip_reason(full["1MiB"], "cuda") is None
    if importlib.util.find_spec("kernels.mxfp4") is None:
        with pytest.raises(Unavailable):
            triton.factory(torch.zeros(1, 32, dtype=torch.bfloat16))


def test_mxfp4_eager_runs_on_cpu(env):
    ops = discover()
    for name in ("mxfp4_quantize", "mxfp4_dequantize"):
        config = RunConfig(sweep="small", impls=["reference-eager", "triton"], cases=["1MiB"], **FAST)
        rows = run_op(ops[name], env, fake_roofs(), config, Progress(2, io.StringIO()))
        verdicts = {row["impl"]: row["correctness"] for row in rows}
        assert verdicts["reference-eager"] == "baseline" and verdicts["triton"].startswith("skipped: Triton")
        assert rows[0]["p50"] > 0 and rows[0]["shape"] == "[128, 4096]"


def dummy_accuracy(ops=("dummy_copy",)) -> AccuracyReport:
    return AccuracyReport(
        name="dummy_accuracy",
        title="Dummy accuracy table",
        ops=ops,
        note="Two rows, two columns.",
        rows=lambda: [{"policy": "a", "sqnr_db": 20.123456}, {"policy": "b", "sqnr_db": "refused"}],
    )


def test_accuracy_table_files_index_and_rebuild(tmp_path, monkeypatch):
    table = dummy_accuracy()
    monkeypatch.setitem(ACCURACY_REPORTS, table.name, table)
    folder = tmp_path / "cpu-test"
    path = accuracy.write(folder, table, table.rows())
    assert path.name == "dummy_accuracy.accuracy.csv"
    assert tables.read(path).to_dict("records") == [
        {"policy": "a", "sqnr_db": "20.12"},
        {"policy": "b", "sqnr_db": "refused"},
    ]
    md = (folder / "dummy_accuracy.accuracy.md").read_text()
    assert md.startswith("# Dummy accuracy table") and "Two rows, two columns." in md
    assert (
        "| policy | sqnr_db |" in squeeze(md)
        and "| a | 20.12 |" in squeeze(md)
        and "touchstone bench --ops dummy_copy" in md
    )
    report.render_index(folder)
    assert "[dummy_accuracy](dummy_accuracy.accuracy.md)" in (folder / "index.md").read_text()
    (folder / "dummy_accuracy.accuracy.md").unlink()
    assert cli.report_main(["--out", str(tmp_path)]) == 0  # no bench CSV warning, the table rebuilt
    assert (folder / "dummy_accuracy.accuracy.md").read_text() == md
    assert accuracy.for_ops(["dummy_copy"]) == [table] and accuracy.for_ops(["other"]) == []
    with pytest.raises(ValueError, match="same keys"):
        accuracy.write(folder, table, [{"a": 1}, {"b": 2}])


def test_cli_bench_writes_the_accuracy_tables_of_its_ops(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("bench.environment.detect_platform", lambda: CPU)
    monkeypatch.setitem(REGISTRY, "dummy_copy", dummy_op())
    monkeypatch.setitem(ACCURACY_REPORTS, "dummy_accuracy", dummy_accuracy())
    monkeypatch.setitem(
        ACCURACY_REPORTS, "other_accuracy", dataclasses.replace(dummy_accuracy(("other_op",)), name="other_accuracy")
    )
    monkeypatch.setattr("bench.roofs.MEMCPY_BYTES", {"cpu": 1 << 20, "gpu": 1 << 20})
    monkeypatch.setattr("bench.roofs.GEMM_N", {"cpu": 64, "gpu": 64})
    assert cli.bench_main(["--ops", "dummy_copy", "--impls", "copy", "--out", str(tmp_path)]) == 0
    assert "accuracy table dummy_accuracy" in capsys.readouterr().out
    (folder,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    names = {p.name for p in folder.iterdir()}
    assert {"dummy_accuracy.accuracy.csv", "dummy_accuracy.accuracy.md"} <= names
    assert "other_accuracy.accuracy.csv" not in names
    assert "[dummy_accuracy](dummy_accuracy.accuracy.md)" in (folder / "index.md").read_text()


def test_nvfp4_definitions():
    ops = discover()
    quantize, dequantize = ops["nvfp4_quantize"], ops["nvfp4_dequantize"]
    full = {case.label: case for case in quantize.sweeps["full"]}
    assert full["256MiB"].shape == (256 * 1024 * 1024 // (7168 * 2), 7168)
    m = full["1MiB"].shape[0]
    assert quantize.bytes_model(full["1MiB"]) == m * 7168 * 2 + m * 3584 + m * 448
    assert dequantize.bytes_model(full["1GiB"]) == quantize.bytes_model(full["1GiB"])
    assert not quantize.impl("reference-compiled").gated and quantize.impl("triton").gated
    assert ("triton", "memcpy") in quantize.headline and ("triton", "reference-compiled") in quantize.headline
    assert [t.name for t in accuracy.for_ops(["nvfp4_quantize"])] == ["nvfp4_w13_policies"]


def test_nvfp4_eager_runs_on_cpu(env):
    ops = discover()
    for name in ("nvfp4_quantize", "nvfp4_dequantize"):
        config = RunConfig(sweep="small", impls=["reference-eager", "triton"], cases=["1MiB"], **FAST)
        rows = run_op(ops[name], env, fake_roofs(), config, Progress(2, io.StringIO()))
        verdicts = {row["impl"]: row["correctness"] for row in rows}
        assert verdicts["reference-eager"] == "baseline" and verdicts["triton"].startswith("skipped: Triton")


def test_nvfp4_w13_policy_table():
    from bench.quant.nvfp4 import W13_RATIOS, w13_policy_rows

    rows = w13_policy_rows(rows=32, k=128)
    sqnr = {(row["amax_ratio_up_over_gate"], row["policy"]): row["sqnr_db"] for row in rows}
    assert {ratio for ratio, _ in sqnr} == set(W13_RATIOS)
    assert sqnr[1.0, "use_w1"] == sqnr[1.0, "max_requant"] == sqnr[1.0, "raise"] == sqnr[1.0, "separate"]
    for ratio in (2.0, 10.0):
        assert sqnr[ratio, "raise"] == "refused (ValueError)"
        assert sqnr[ratio, "use_w1"] < 10.0 < sqnr[ratio, "max_requant"] <= sqnr[ratio, "separate"] + 1e-9


def test_launch_sweep_lines_are_rows_of_a_csv(tmp_path, monkeypatch, capsys):
    from bench import launch_sweep

    monkeypatch.setattr("bench.environment.detect_platform", lambda: CPU)
    recorder = launch_sweep.Recorder("demo_launch_sweep", tmp_path, "python -m bench.demo_launch_sweep --quick")
    monkeypatch.setattr(launch_sweep, "_recorder", recorder)
    launch_sweep.line("  tile=64 warps=4", 0.5, {"memcpy": 0.9, "SDPA": 1.2}, "ok [max_rel 1e-3]", gbps=3800.0)
    launch_sweep.report("blocks=8 warps=2", 1.0, 4 << 30, 4000.0, exact=False, memset=3000.0)
    launch_sweep.failed("tile=256 warps=8", RuntimeError("out of resource: shared memory\nmore"))
    printed = capsys.readouterr().out
    assert "tile=64 warps=4     500.0 us   3800 GB/s  0.900x memcpy  1.200x SDPA  ok" in printed
    frame = tables.read(recorder.path, ["time_us", "gbps", "x_memcpy"])
    assert recorder.path == tmp_path / "cpu-test-cpu" / "launch_sweeps" / "demo_launch_sweep.csv"
    assert list(frame["config"]) == ["tile=64 warps=4", "blocks=8 warps=2", "tile=256 warps=8"]
    assert list(frame.columns[:4]) == ["sweep", "config", "time_us", "gbps"]
    assert frame["gbps"].iloc[1] == pytest.approx((4 << 30) / 1e9 / 1e-3) and frame["verdict"].iloc[1] == "MISMATCH"
    assert frame["x_memcpy"].iloc[0] == pytest.approx(0.9) and math.isnan(frame["time_us"].iloc[2])
    assert frame["verdict"].iloc[2] == "FAILED: RuntimeError: out of resource: shared memory"
    assert set(frame["device"]) == {"Test CPU"} and set(frame["command"]) == {recorder.command}


def test_sweep_shape_lists_are_parsed_and_bad_items_refused():
    import argparse

    from bench.launch_sweep import dims

    assert dims("MxNxK", (3,))("8192x8192x8192,4096x2112x7168") == [(8192, 8192, 8192), (4096, 2112, 7168)]
    assert dims("T", (3, 4))("128x4x2,128x4x1x128") == [(128, 4, 2), (128, 4, 1, 128)]
    for bad in ("8192x8192", "1x2x3x4", "1xax3", "0x2x3", "1x2x3,"):
        item = bad.split(",")[-1]
        with pytest.raises(argparse.ArgumentTypeError, match=f"MxNxK with positive integers, got '{item}'"):
            dims("MxNxK", (3,))(bad)
