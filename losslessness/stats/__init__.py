"""Statistics layer: identity tests, two-sample tests, binomial tests, power and sample size,
error budget.

Every test comes as a triple (the assertion, the smallest discrepancy it detects at n, the n it
needs for a discrepancy); see :mod:`losslessness.stats.power`. Inputs are numpy arrays, outputs
Python floats and ints.
"""

from losslessness.stats.binomial import BinomialTestResult, acceptance_rate_test
from losslessness.stats.error_budget import DEFAULT_FAMILY_WISE_ALPHA, ErrorBudget
from losslessness.stats.identity import (
    EXPECTED_COUNT_FLOOR,
    IdentityTestResult,
    identity_test,
    identity_test_pvalues,
    pooling_partition,
)
from losslessness.stats.power import (
    IdentityPlan,
    binomial_minimum_detectable_shift,
    chi_square_power,
    chi_square_sample_size,
    exact_check_minimum_detectable_rate,
    identity_minimum_detectable_tv,
    minimum_detectable_tv,
    plan_identity_test,
)
from losslessness.stats.two_sample import (
    TwoSampleTestResult,
    two_sample_minimum_detectable_tv,
    two_sample_sample_size,
    two_sample_test,
)

__all__ = [
    "DEFAULT_FAMILY_WISE_ALPHA",
    "EXPECTED_COUNT_FLOOR",
    "BinomialTestResult",
    "ErrorBudget",
    "IdentityPlan",
    "IdentityTestResult",
    "TwoSampleTestResult",
    "acceptance_rate_test",
    "binomial_minimum_detectable_shift",
    "chi_square_power",
    "chi_square_sample_size",
    "exact_check_minimum_detectable_rate",
    "identity_minimum_detectable_tv",
    "identity_test",
    "identity_test_pvalues",
    "minimum_detectable_tv",
    "plan_identity_test",
    "pooling_partition",
    "two_sample_minimum_detectable_tv",
    "two_sample_sample_size",
    "two_sample_test",
]
