"""The server suites need the `serve` extra; without it their modules are not collected (suites/server/conftest.py)
and this test says so: a skip naming the missing packages, or a failure where the model tests are required
(CI=true: the CPU CI installs the extra, so a missing one there is a broken install, not a skip)."""

from __future__ import annotations

from suites.server.conftest import require_serve_packages


def test_serve_packages_installed():
    require_serve_packages()
