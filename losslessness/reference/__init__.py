"""Ground-truth implementations: chain, block and tree rejection sampling, greedy verify (the
exact laws they must follow are the domain's, :mod:`losslessness.laws`).

``reference`` imports nothing from ``checks``, ``adapters`` or ``reports`` (docs/architecture.md,
'Layers').
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
    "ChainUniforms",
    "accepted_lengths",
    "argmax_lowest_index",
    "block_decisions",
    "block_laws",
    "block_residual",
    "compute_dtype",
    "declared_verification",
    "emitted_tokens",
    "expected_accepted_drafts",
    "sample_inverse_cdf",
    "sample_inverse_cdf_from_tables",
    "shares_rows",
    "verify",
    "verify_block",
    "verify_greedy",
    "verify_with_uniforms",
]
