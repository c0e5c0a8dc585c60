"""Ground-truth implementations: chain rejection sampling, greedy verify, and exact laws.

``reference`` imports nothing from ``checks``, ``adapters`` or ``reports`` (DESIGN.md section 2).
"""

from losslessness.reference.block import (
    BLOCK_VERIFICATION,
    TOKEN_VERIFICATION,
    VERIFICATION_ATTRIBUTE,
    BlockLaws,
    block_decisions,
    block_laws,
    block_residual,
    declared_verification,
    expected_accepted_drafts,
    verify_block,
)
from losslessness.reference.chain import ChainUniforms, shares_rows, verify, verify_with_uniforms
from losslessness.reference.greedy import argmax_lowest_index, verify_greedy
from losslessness.reference.laws import (
    ChainLaws,
    PrefixAcceptanceBound,
    acceptance_probability,
    chain_laws,
    prefix_acceptance_bound,
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
    "BLOCK_VERIFICATION",
    "TOKEN_VERIFICATION",
    "VERIFICATION_ATTRIBUTE",
    "BlockLaws",
    "ChainLaws",
    "ChainUniforms",
    "PrefixAcceptanceBound",
    "acceptance_probability",
    "accepted_lengths",
    "argmax_lowest_index",
    "block_decisions",
    "block_laws",
    "block_residual",
    "chain_laws",
    "compute_dtype",
    "declared_verification",
    "emitted_tokens",
    "expected_accepted_drafts",
    "prefix_acceptance_bound",
    "residual_distribution",
    "sample_inverse_cdf",
    "sample_inverse_cdf_from_tables",
    "shares_rows",
    "total_variation",
    "verify",
    "verify_block",
    "verify_greedy",
    "verify_with_uniforms",
]
