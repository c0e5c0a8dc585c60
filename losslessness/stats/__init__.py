"""Statistics layer: identity tests, two-sample tests, binomial tests, power and sample size,
the error budget, sequential e-processes, the run-level uniformity test, and the shared argument
validation (:mod:`losslessness.stats.validation`).

Every fixed-n test comes as a triple (the assertion, the smallest discrepancy it detects at n,
the n it needs for a discrepancy); :mod:`losslessness.stats.power` lists them. Inputs are numpy
arrays, outputs Python floats and ints.
"""

from losslessness.stats.binomial import BinomialTestResult, acceptance_rate_test
from losslessness.stats.error_budget import (
    DEFAULT_FAMILY_WISE_ALPHA,
    SUITE_FAMILY_WISE_ALPHA,
    ErrorBudget,
)
from losslessness.stats.identity import (
    EXPECTED_COUNT_FLOOR,
    IdentityTestResult,
    identity_test,
    identity_test_pvalues,
    pooling_partition,
)
from losslessness.stats.power import (
    IdentityPlan,
    acceptance_rate_minimum_detectable_shift,
    acceptance_rate_sample_size,
    chi_square_minimum_detectable_tv,
    chi_square_power,
    chi_square_sample_size,
    exact_check_minimum_detectable_rate,
    exact_check_sample_size,
    identity_minimum_detectable_tv,
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
    "SUITE_FAMILY_WISE_ALPHA",
    "BinomialTestResult",
    "ErrorBudget",
    "IdentityPlan",
    "IdentityTestResult",
    "TwoSampleTestResult",
    "acceptance_rate_minimum_detectable_shift",
    "acceptance_rate_sample_size",
    "acceptance_rate_test",
    "chi_square_minimum_detectable_tv",
    "chi_square_power",
    "chi_square_sample_size",
    "exact_check_minimum_detectable_rate",
    "exact_check_sample_size",
    "identity_minimum_detectable_tv",
    "identity_test",
    "identity_test_pvalues",
    "plan_identity_test",
    "pooling_partition",
    "two_sample_minimum_detectable_tv",
    "two_sample_sample_size",
    "two_sample_test",
]
