"""The suite plumbing itself: the known-failure ledger, tier markers and the fail-closed GPU guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from suites.ledger import KnownFailure, find

REPO = Path(__file__).resolve().parents[2]

pytest_plugins = ["pytester"]


def test_ledger_entry_needs_a_tracker():
    with pytest.raises(ValueError, match="tracker must be"):
        KnownFailure("suites/x.py::test_y", "broken", "see slack")
    with pytest.raises(ValueError, match="reason is empty"):
        KnownFailure("suites/x.py::test_y", " ", "touchstone#1")
    with pytest.raises(ValueError, match="unknown devices"):
        KnownFailure("suites/x.py::test_y", "r", "touchstone#1", devices=("tpu",))
    for tracker in ("touchstone#12", "triton-lang/triton#11584", "https://github.com/pytorch/ao/issues/2035"):
        KnownFailure("suites/x.py::test_y", "r", tracker)


def test_ledger_matching_is_by_nodeid_glob_and_device():
    entry = KnownFailure("suites/quant/*::test_a[*]", "r", "touchstone#3", devices=("cuda",))
    assert find("suites/quant/t.py::test_a[bf16]", "cuda", (entry,)) is entry
    assert find("suites/quant/t.py::test_a[bf16]", "cpu", (entry,)) is None
    assert find("suites/quant/t.py::test_b", "cuda", (entry,)) is None


CONFTEST = """
from suites.conftest import *  # noqa: F401,F403  (the real plumbing)
from suites import ledger
ledger.KNOWN_FAILURES = (
    ledger.KnownFailure("*::test_known_bad", "planted", "touchstone#1"),
    ledger.KnownFailure("*::test_known_but_fixed", "planted", "touchstone#2"),
)
"""


def _run(pytester, source, *args, env=None):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=source)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("TOUCHSTONE_REQUIRE_BACKEND", raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    try:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    finally:
        monkeypatch.undo()


def test_ledger_xfails_and_flags_an_unexpected_pass(pytester):
    result = _run(
        pytester,
        """
def test_known_bad():
    assert False
def test_known_but_fixed():
    assert True
""",
    )
    result.assert_outcomes(xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*planted (touchstone#2)*"])


def test_markers_skip_on_the_cpu_tier_and_need_reasons(pytester):
    result = _run(
        pytester,
        """
import pytest
@pytest.mark.interpreter_unsupported(reason="bf16 dot")
def test_a(): pass
@pytest.mark.gpu_only(reason="timing")
def test_b(): pass
def test_c(device):
    assert device == "cpu"
""",
        "-rs",
    )
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*interpreter_unsupported: bf16 dot*", "*gpu_only: timing*"])
    result = _run(
        pytester,
        """
import pytest
@pytest.mark.gpu_only
def test_a(): pass
""",
    )
    result.stderr.fnmatch_lines(["*@pytest.mark.gpu_only needs a reason*"])
    assert result.ret != 0


def test_gpu_tier_refuses_to_start_without_its_backend(pytester):
    result = _run(pytester, "def test_a(device): pass", "--device", "xpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--device xpu: this session needs a xpu device but torch sees*"])


def test_required_backend_with_no_gpu_test_executed_fails(pytester):
    result = _run(pytester, "def test_a(device): pass", env={"TOUCHSTONE_REQUIRE_BACKEND": "cuda"})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*FAIL CLOSED: TOUCHSTONE_REQUIRE_BACKEND=cuda, --device cpu: 0 tests executed*"])
