"""The battery: one module per property (structure, conditional laws, acceptance,
independence of identical rows, greedy, the end-to-end sequence law).

Checks consume samples and exact laws and produce :class:`CheckResult` records; they never
decide which samples to draw (``sampling``) or how many (``planning``).
"""

from losslessness.checks.acceptance import check_acceptance
from losslessness.checks.battery import BATTERY_SEED, default_chain_battery, default_greedy_battery
from losslessness.checks.cases import ChainCase, GreedyCase
from losslessness.checks.conditional_law import check_conditional_laws
from losslessness.checks.greedy import check_greedy
from losslessness.checks.independence import check_row_independence
from losslessness.checks.planning import CasePlan, count_statistical_assertions, plan_case
from losslessness.checks.result import (
    CheckContext,
    CheckKind,
    CheckResult,
    Verdict,
    check_from_dict,
    check_to_dict,
)
from losslessness.checks.sampling import ChainSamples, ProtocolViolation, sample_chain
from losslessness.checks.sequence_law import (
    DRAFTS_ACCEPTED_CHECK_ID,
    SEQUENCE_CHECK_IDS,
    SEQUENCE_GREEDY_CHECK_ID,
    SEQUENCE_LAW_CHECK_ID,
    SequencePlan,
    accepted_length_snapshot,
    check_drafts_accepted,
    check_greedy_sequences,
    check_sequence_law,
    plan_sequence_law,
)
from losslessness.checks.structure import check_structure, malformed_output_result


def run_chain_checks(samples: ChainSamples, context: CheckContext) -> list[CheckResult]:
    """Every chain check on one case's samples: structure, conditional laws (and one-hot
    edges), acceptance (and disjoint / p == q edges), independence of identical rows."""
    return [
        check_structure(samples, context),
        *check_conditional_laws(samples, context),
        *check_acceptance(samples, context),
        *check_row_independence(samples, context),
    ]


CHAIN_CHECK_IDS = (
    "structure",
    "law",
    "acceptance",
    "independence",
    "edge.disjoint",
    "edge.one-hot",
    "edge.p-equals-q",
)
"""Check ids a chain verifier is audited with."""

GREEDY_CHECK_IDS = ("greedy",)
"""Check ids a greedy verifier is audited with."""

__all__ = [
    "BATTERY_SEED",
    "CHAIN_CHECK_IDS",
    "DRAFTS_ACCEPTED_CHECK_ID",
    "GREEDY_CHECK_IDS",
    "SEQUENCE_CHECK_IDS",
    "SEQUENCE_GREEDY_CHECK_ID",
    "SEQUENCE_LAW_CHECK_ID",
    "CasePlan",
    "ChainCase",
    "ChainSamples",
    "CheckContext",
    "CheckKind",
    "CheckResult",
    "GreedyCase",
    "ProtocolViolation",
    "SequencePlan",
    "Verdict",
    "accepted_length_snapshot",
    "check_acceptance",
    "check_conditional_laws",
    "check_drafts_accepted",
    "check_from_dict",
    "check_greedy",
    "check_greedy_sequences",
    "check_row_independence",
    "check_sequence_law",
    "check_structure",
    "check_to_dict",
    "count_statistical_assertions",
    "default_chain_battery",
    "default_greedy_battery",
    "malformed_output_result",
    "plan_case",
    "plan_sequence_law",
    "run_chain_checks",
    "sample_chain",
]
