"""Ground-truth implementations: chain rejection sampling, greedy verify, and exact laws.

``reference`` imports nothing from ``checks``, ``adapters`` or ``reports`` (DESIGN.md section 2).
"""

from losslessness.reference.chain import verify, verify_with_uniforms
from losslessness.reference.greedy import argmax_lowest_index, verify_greedy
from losslessness.reference.laws import (
    ChainLaws,
    acceptance_probability,
    chain_laws,
    residual_distribution,
    total_variation,
)
from losslessness.reference.output import accepted_lengths, emitted_tokens
from losslessness.reference.sampling import sample_inverse_cdf

__all__ = [
    "ChainLaws",
    "acceptance_probability",
    "accepted_lengths",
    "argmax_lowest_index",
    "chain_laws",
    "emitted_tokens",
    "residual_distribution",
    "sample_inverse_cdf",
    "total_variation",
    "verify",
    "verify_greedy",
    "verify_with_uniforms",
]
