"""Check ids: the names results, ``--only`` and replays use, declared once."""

STRUCTURE_CHECK_ID = "structure"
LAW_CHECK_ID = "law"
ACCEPTANCE_CHECK_ID = "acceptance"
INDEPENDENCE_CHECK_ID = "independence"
GREEDY_CHECK_ID = "greedy"
SEQUENCE_LAW_CHECK_ID = "sequence-law"
SEQUENCE_GREEDY_CHECK_ID = "sequence-greedy"
DRAFTS_ACCEPTED_CHECK_ID = "drafts-accepted"
EDGE_DISJOINT_CHECK_ID = "edge.disjoint"
"""Disjoint supports: no draft is ever accepted (an exact edge case of ``acceptance``)."""
EDGE_ONE_HOT_CHECK_ID = "edge.one-hot"
"""One-hot p: its token is always emitted (an exact edge case of ``law``)."""
EDGE_P_EQUALS_Q_CHECK_ID = "edge.p-equals-q"
"""p == q: every draft is accepted (an optimality edge case of ``acceptance``)."""
COUPLING_CHECK_ID = "coupling"
"""A device candidate fed the CPU reference's uniforms makes the same decisions."""
TWO_SAMPLE_CHECK_ID = "two-sample"
"""A device candidate's samples and the CPU reference's follow one law (no shared uniforms)."""
PRECISION_CHECK_ID = "precision"
"""Diagnostic: how far casting p and q to a dtype moves the step's laws (never a verdict)."""
SUITE_CHECK_ID = "suite"
"""One test of the property suite run on a target (:mod:`losslessness.engine.suite`)."""
PVALUES_CHECK_ID = "pvalues"
"""The run-level uniformity test of one target's independent p-values
(:mod:`losslessness.checks.pvalues`)."""

STATISTICAL_CHAIN_CHECK_IDS = (LAW_CHECK_ID, ACCEPTANCE_CHECK_ID, INDEPENDENCE_CHECK_ID)
"""Chain checks that spend a share of the run's false-alarm budget."""

SAMPLED_CHAIN_CHECK_IDS = (STRUCTURE_CHECK_ID, *STATISTICAL_CHAIN_CHECK_IDS)
"""The chain checks run on a case's samples (the edge cases come out of ``law`` and
``acceptance``); a case whose target crashed reports each of them as ERROR."""

CHAIN_CHECK_IDS = (
    *SAMPLED_CHAIN_CHECK_IDS,
    EDGE_DISJOINT_CHECK_ID,
    EDGE_ONE_HOT_CHECK_ID,
    EDGE_P_EQUALS_Q_CHECK_ID,
)
"""Check ids a chain verifier is audited with."""

GREEDY_CHECK_IDS = (GREEDY_CHECK_ID,)
"""Check ids a greedy verifier is audited with."""

SEQUENCE_CHECK_IDS = (SEQUENCE_LAW_CHECK_ID, SEQUENCE_GREEDY_CHECK_ID, DRAFTS_ACCEPTED_CHECK_ID)
"""Check ids an end-to-end target is audited with."""


TREE_STRUCTURE_CHECK_ID = "tree.structure"
TREE_LAW_CHECK_ID = "tree.law"
TREE_ACCEPTANCE_CHECK_ID = "tree.acceptance"
TREE_INDEPENDENCE_CHECK_ID = "tree.independence"
TREE_GREEDY_CHECK_ID = "tree.greedy"

STATISTICAL_TREE_CHECK_IDS = (
    TREE_LAW_CHECK_ID,
    TREE_ACCEPTANCE_CHECK_ID,
    TREE_INDEPENDENCE_CHECK_ID,
)
"""Tree checks that spend a share of the run's false-alarm budget."""

TREE_CHECK_IDS = (TREE_STRUCTURE_CHECK_ID, *STATISTICAL_TREE_CHECK_IDS)
"""Check ids a tree verifier is audited with (run on a tree case's samples)."""

GREEDY_TREE_CHECK_IDS = (TREE_GREEDY_CHECK_ID,)
"""Check ids a greedy tree verifier is audited with."""

DEVICE_CHECK_IDS = (COUPLING_CHECK_ID, TWO_SAMPLE_CHECK_ID, PRECISION_CHECK_ID)
"""Check ids of the device checks (a device candidate against the CPU reference)."""

SERVING_STRUCTURE_CHECK_ID = "serving.structure"
SERVING_LAW_CHECK_ID = "serving.law"
"""A serving row kind's emitted token against its engine profile's law, per position."""
SERVING_ACCEPTANCE_CHECK_ID = "serving.acceptance"
SERVING_GREEDY_CHECK_ID = "serving.greedy"

STATISTICAL_SERVING_CHECK_IDS = (SERVING_LAW_CHECK_ID, SERVING_ACCEPTANCE_CHECK_ID)
"""Serving checks that spend a share of the run's false-alarm budget."""

SERVING_CHECK_IDS = (
    SERVING_STRUCTURE_CHECK_ID,
    *STATISTICAL_SERVING_CHECK_IDS,
    SERVING_GREEDY_CHECK_ID,
)
"""Check ids a serving verifier is audited with."""

SEED_CONTRACT_CHECK_ID = "seed.contract"
"""A seeded serving request's output is the same whatever else is in its batch (exact; its
failure is IRREPRODUCIBLE, not LOSSY)."""


ALL_CHECK_IDS = (
    *CHAIN_CHECK_IDS,
    *GREEDY_CHECK_IDS,
    *SEQUENCE_CHECK_IDS,
    *TREE_CHECK_IDS,
    *GREEDY_TREE_CHECK_IDS,
    *SERVING_CHECK_IDS,
    SEED_CONTRACT_CHECK_ID,
    PVALUES_CHECK_ID,
)
"""Every check id of a run's targets (``--only`` also takes ``edge`` for every ``edge.*`` and
``tree`` for every ``tree.*``)."""

