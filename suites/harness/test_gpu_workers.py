"""Worker -> GPU mapping of the hardware sessions, on the CPU: one group of workers per visible GPU."""

from __future__ import annotations

import collections

import pytest

from suites.gpu_workers import assignment, worker_device


def test_workers_spread_round_robin_over_the_gpus():
    seen = collections.Counter(worker_device(f"gw{i}", 8, None) for i in range(64))
    assert seen == {str(gpu): 8 for gpu in range(8)}
    assert [worker_device(f"gw{i}", 1, None) for i in range(8)] == ["0"] * 8


def test_a_narrowed_visibility_is_respected():
    assert [worker_device(f"gw{i}", 2, "4,5") for i in range(4)] == ["4", "5", "4", "5"]
    with pytest.raises(ValueError, match="only 1 visible"):
        worker_device("gw0", 2, "3")


def test_assignment_only_for_workers_of_a_gpu_session():
    env = {"PYTEST_XDIST_WORKER": "gw9", "TOUCHSTONE_GPUS": "8"}
    assert assignment("cuda", env) == ("CUDA_VISIBLE_DEVICES", "1")
    assert assignment("rocm", env) == ("HIP_VISIBLE_DEVICES", "1")
    assert assignment("xpu", {**env, "ZE_AFFINITY_MASK": "0,1,2,3,4,5,6,7"}) == ("ZE_AFFINITY_MASK", "1")
    assert assignment("cpu", env) is None
    assert assignment("cuda", {"TOUCHSTONE_GPUS": "8"}) is None  # the controller, or no xdist
    assert assignment("cuda", {"PYTEST_XDIST_WORKER": "gw0"}) is None  # not a hardware session
