"""The server suites need the `serve` extra; without it their modules are not collected (suites/server/conftest.py)
and this test says so: a skip naming the missing packages, or a failure where the model tests are required
(CI=true: the CPU CI installs the extra, so a missing one there is a broken install, not a skip)."""

from __future__ import annotations

import os

import pytest

from suites.runner.conftest import model_required
from suites.server.conftest import MISSING_SERVE_PACKAGES


def test_serve_packages_installed():
    if not MISSING_SERVE_PACKAGES:
        return
    why = (f"the server suites need {', '.join(MISSING_SERVE_PACKAGES)} (pip install -e .[serve]); their modules "
           f"were not collected")
    if model_required(os.environ):
        pytest.fail(f"{why}; CI=true / TOUCHSTONE_REQUIRE_MODEL=1 forbids skipping them", pytrace=False)
    pytest.skip(why)
