"""Ground-truth implementations: chain rejection sampling, greedy verify, and exact laws.

``reference`` imports nothing from ``checks``, ``adapters`` or ``reports`` (DESIGN.md section 2).
"""

from losslessness.reference.chain import ChainUniforms, shares_rows, verify, verify_with_uniforms
from losslessness.reference.greedy import argmax_lowest_index, verify_greedy
from losslessness.reference.laws import (
    ChainLaws,
    acceptance_probability,
    chain_laws,
    residual_distribution,
    total_variation,
)
from losslessness.reference.output import accepted_lengths, emitted_tokens
from losslessness.reference.sampling import (
    compute_dtype,
    sample_inverse_cdf,
    sample_inverse_cdf_from_tables,
)

__all__ = [
    "ChainLaws",
    "ChainUniforms",
    "acceptance_probability",
    "accepted_lengths",
    "argmax_lowest_index",
    "chain_laws",
    "compute_dtype",
    "emitted_tokens",
    "residual_distribution",
    "sample_inverse_cdf",
    "sample_inverse_cdf_from_tables",
    "shares_rows",
    "total_variation",
    "verify",
    "verify_greedy",
    "verify_with_uniforms",
]
