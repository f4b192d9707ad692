"""The correctness contract of every kernel: the bit-exact rule, the lossy rules and the table of bounds.

The suites assert with it and the bench gives each row its verdict with it, so a test's verdict and a bench
row's correctness are the same rule. Exact ops (format encode/decode, packing, geometry, hashing) are held to
`exact`; lossy ops (GEMM, attention, SSD, norms) to their row of `table.LOSSY` through `lossy`.
"""

from kernels.tolerances.exact import assert_exact, exact_mismatches, exact_verdict
from kernels.tolerances.lossy import (
    LossyMetrics,
    assert_agree,
    assert_lossy,
    lossy_bound,
    lossy_metrics,
    lossy_verdict,
    nonfinite_agreement,
    sqnr_db,
    tolerance_verdict,
)
from kernels.tolerances.table import AGREEMENT, LOSSY, AgreementBound, LossyBound

__all__ = [
    "AGREEMENT",
    "LOSSY",
    "AgreementBound",
    "LossyBound",
    "LossyMetrics",
    "assert_agree",
    "assert_exact",
    "assert_lossy",
    "exact_mismatches",
    "exact_verdict",
    "lossy_bound",
    "lossy_metrics",
    "lossy_verdict",
    "nonfinite_agreement",
    "sqnr_db",
    "tolerance_verdict",
]
