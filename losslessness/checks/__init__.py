"""The checks: one module per property (structure, conditional laws, acceptance, independence
of identical rows, greedy, the end-to-end sequence law, coupling with the CPU reference,
precision diagnostics).

Checks are pure: samples (output rows, count tables expanded to samples, generated sequences)
and the case's exact laws in, typed :class:`~losslessness.results.CheckResult` records out.
They never call a target, and never decide which samples to draw or how many: that is the
engine's (:mod:`losslessness.engine`).
"""

from losslessness.checks.acceptance import check_acceptance
from losslessness.checks.assertions import count_statistical_assertions
from losslessness.checks.conditional_law import check_conditional_laws
from losslessness.checks.greedy import check_greedy
from losslessness.checks.ids import (
    ALL_CHECK_IDS,
    CHAIN_CHECK_IDS,
    DRAFTS_ACCEPTED_CHECK_ID,
    GREEDY_CHECK_IDS,
    SAMPLED_CHAIN_CHECK_IDS,
    SEQUENCE_CHECK_IDS,
    SEQUENCE_GREEDY_CHECK_ID,
    SEQUENCE_LAW_CHECK_ID,
    STATISTICAL_CHAIN_CHECK_IDS,
)
from losslessness.checks.independence import check_row_independence
from losslessness.checks.sequence_law import (
    SequencePlan,
    check_drafts_accepted,
    check_greedy_sequences,
    check_sequence_law,
)
from losslessness.checks.structure import check_structure, malformed_output_result
from losslessness.reference.block import BLOCK_VERIFICATION, TOKEN_VERIFICATION
from losslessness.results import CheckContext, CheckResult
from losslessness.samples import ChainSamples


def run_chain_checks(
    samples: ChainSamples, context: CheckContext, verification: str = TOKEN_VERIFICATION
) -> list[CheckResult]:
    """Every chain check on one case's samples: structure, conditional laws (and one-hot
    edges), acceptance (and disjoint / p == q edges), independence of identical rows.

    Args:
        samples: the case's samples.
        context: the case's context.
        verification: how the target declares it verifies (``"token"`` or ``"block"``,
            :func:`losslessness.reference.declared_verification`): a block verifier may emit
            the draft as its correction token, and has its own acceptance threshold.
    """
    return [
        check_structure(samples, context, block_decisions=verification == BLOCK_VERIFICATION),
        *check_conditional_laws(samples, context),
        *check_acceptance(samples, context, verification=verification),
        *check_row_independence(samples, context),
    ]


__all__ = [
    "ALL_CHECK_IDS",
    "CHAIN_CHECK_IDS",
    "DRAFTS_ACCEPTED_CHECK_ID",
    "GREEDY_CHECK_IDS",
    "SAMPLED_CHAIN_CHECK_IDS",
    "SEQUENCE_CHECK_IDS",
    "SEQUENCE_GREEDY_CHECK_ID",
    "SEQUENCE_LAW_CHECK_ID",
    "STATISTICAL_CHAIN_CHECK_IDS",
    "SequencePlan",
    "check_acceptance",
    "check_conditional_laws",
    "check_drafts_accepted",
    "check_greedy",
    "check_greedy_sequences",
    "check_row_independence",
    "check_sequence_law",
    "check_structure",
    "count_statistical_assertions",
    "malformed_output_result",
    "run_chain_checks",
]
