"""The checks: one module per property (structure, conditional laws, acceptance, independence
of identical rows, greedy, the end-to-end sequence law, coupling with the CPU reference,
precision diagnostics), and for tree verifiers one ``tree_*`` module per property beside them
(``tree_structure``, ``tree_law``, ``tree_acceptance``, ``tree_independence``, ``tree_greedy``;
which assertions a case makes in ``assertions`` and ``tree_assertions``).

Checks are pure: samples (output rows, the engine's count tables read as counted steps,
generated sequences) and the case's exact laws in, typed
:class:`~losslessness.results.CheckResult` records out. They never call a target, and never
decide which samples to draw or how many: that is the engine's (:mod:`losslessness.engine`).
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
from losslessness.checks.tree_acceptance import check_tree_acceptance
from losslessness.checks.tree_greedy import check_tree_greedy
from losslessness.checks.tree_independence import check_tree_independence
from losslessness.checks.tree_law import check_tree_law
from losslessness.checks.tree_structure import check_tree_structure
from losslessness.reference.block import BLOCK_VERIFICATION, TOKEN_VERIFICATION
from losslessness.results import CheckContext, CheckResult
from losslessness.samples import ChainCounts, ChainSamples, TreeSamples, chain_counts


def run_chain_checks(
    samples: ChainSamples | ChainCounts,
    context: CheckContext,
    verification: str = TOKEN_VERIFICATION,
) -> list[CheckResult]:
    """Every chain check on one case's samples: structure, conditional laws (and one-hot
    edges), acceptance (and disjoint / p == q edges), independence of identical rows.

    Args:
        samples: the case's samples: raw, as drawn, or counted
            (:class:`~losslessness.samples.ChainCounts`, e.g. a count table's steps).
        context: the case's context.
        verification: how the target declares it verifies (``"token"`` or ``"block"``,
            :func:`losslessness.reference.declared_verification`): a block verifier may emit
            the draft as its correction token, and has its own acceptance threshold.
    """
    counted = chain_counts(samples)
    return [
        check_structure(counted, context, block_decisions=verification == BLOCK_VERIFICATION),
        *check_conditional_laws(counted, context),
        *check_acceptance(counted, context, verification=verification),
        *check_row_independence(counted, context),
    ]


def run_tree_checks(samples: TreeSamples, context: CheckContext) -> list[CheckResult]:
    """Every tree check on one case's samples: structure, law, acceptance, independence."""
    return [
        check_tree_structure(samples, context),
        *check_tree_law(samples, context),
        *check_tree_acceptance(samples, context),
        *check_tree_independence(samples, context),
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
    "check_tree_acceptance",
    "check_tree_greedy",
    "check_tree_independence",
    "check_tree_law",
    "check_tree_structure",
    "count_statistical_assertions",
    "malformed_output_result",
    "run_chain_checks",
    "run_tree_checks",
]
