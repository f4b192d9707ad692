"""Known-failure ledger: tests that fail for a reason tracked elsewhere, declared in one place.

Each entry names the tests it covers (a pattern over pytest node ids in which only `*` is a wildcard, so
parametrize brackets match literally), the devices it applies to,
why they fail and where that is tracked. An entry without a tracker reference cannot be built. The
conftest marks every matched test `xfail(strict=True)`: if the test starts to pass, the run fails with
XPASS(strict), which says the entry (and whatever workaround it excuses) should go.
"""

from __future__ import annotations

import dataclasses
import re

# "owner/repo#123", a GitHub issue/PR URL, or this project's own tracker "touchstone#123".
_TRACKER = re.compile(r"^(touchstone#\d+|[\w.-]+/[\w.-]+#\d+|https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+)$")
DEVICES = ("cpu", "cuda", "rocm", "xpu")


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    match: str
    reason: str
    tracker: str
    devices: tuple[str, ...] = DEVICES

    def __post_init__(self) -> None:
        if not _TRACKER.match(self.tracker):
            raise ValueError(
                f"known failure {self.match!r}: tracker must be 'touchstone#N', 'owner/repo#N' or a GitHub "
                f"issue/PR URL, got {self.tracker!r}"
            )
        if not self.reason.strip():
            raise ValueError(f"known failure {self.match!r}: reason is empty")
        unknown = set(self.devices) - set(DEVICES)
        if unknown:
            raise ValueError(f"known failure {self.match!r}: unknown devices {sorted(unknown)}")

    def applies(self, nodeid: str, device: str) -> bool:
        pattern = ".*".join(re.escape(part) for part in self.match.split("*"))
        return device in self.devices and re.fullmatch(pattern, nodeid) is not None


# The ledger. Empty today: every suite passes on every tier it runs on.
KNOWN_FAILURES: tuple[KnownFailure, ...] = ()


def find(nodeid: str, device: str, ledger: tuple[KnownFailure, ...] | None = None) -> KnownFailure | None:
    for entry in KNOWN_FAILURES if ledger is None else ledger:
        if entry.applies(nodeid, device):
            return entry
    return None
