"""The serving zoo through the audit: every serving mutant is LOSSY on the battery case of its
mechanism, and its failing results sit on the row kinds that exercise that mechanism; the
lossless controls are LOSSLESS. Built for the test profile (:mod:`tests.serving.profile`)."""

from __future__ import annotations

import pytest

from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.results import TargetVerdict, Verdict
from losslessness.zoo.registry import SERVING_MUTANTS, mutant
from losslessness.zoo.serving import serving_zoo
from tests.serving.profile import PROFILE_NAME, small_profile

STEPS = 800
"""Rows per kind: each mutant's mechanism shifts its rows' laws by TV >= 0.1."""

CATCHING_ROWS = {
    "serving-default-sampling-params": ("T 0.5", "T 1.5"),
    "serving-drops-min-p-logit-bias": ("logit bias", "min-p"),
    "serving-ignores-frequency-penalty": ("frequency",),
    "serving-top-p-before-top-k": ("top-k 5 + top-p 0.6", "top-k 6 top-p 0.8"),
    "serving-shared-accept-residual-uniform": ("T 1", "T 1.5", "T 0.5"),
    "serving-stale-noise-unseeded-rows": ("unseeded",),
    "serving-ignores-penalties": ("frequency", "presence", "repetition"),
}
"""For each mutant, the labels of the battery rows its mechanism acts on."""


def _entries() -> dict[str, object]:
    return {entry.name: entry for entry in serving_zoo(small_profile())}


@pytest.mark.parametrize("name", sorted(CATCHING_ROWS))
def test_serving_mutant_is_lossy_on_the_rows_of_its_mechanism(name: str) -> None:
    """The mutant is LOSSY through run_audit, and only rows exercising its mechanism fail."""
    entry = _entries()[name]
    result = run_audit(
        [entry.adapter], RunConfig(cases=(entry.case.case_id,), steps=STEPS)  # type: ignore[attr-defined]
    )
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSY, [c.message for c in target.checks]
    failing = {str(c.details.get("label")) for c in target.checks if c.verdict is Verdict.LOSSY}
    assert failing
    assert all(any(key in label for key in CATCHING_ROWS[name]) for label in failing), failing


@pytest.mark.parametrize("name", ["serving-reference", "serving-sparse-support"])
def test_serving_control_is_lossless(name: str) -> None:
    """The lossless controls pass the same audit (LOSSLESS)."""
    entry = _entries()[name]
    result = run_audit(
        [entry.adapter], RunConfig(cases=(entry.case.case_id,), steps=STEPS)  # type: ignore[attr-defined]
    )
    assert result.targets[0].verdict is TargetVerdict.LOSSLESS


def test_serving_entries_resolve_as_mutant_names_and_cite_their_bugs() -> None:
    """Every registered serving entry resolves as ``mutant/<name>``, in its protocol's slot
    (serving, or serving tree for ``serving-tree-*``), claiming the zoo's profile, with a
    source URL."""
    assert set(CATCHING_ROWS) <= set(SERVING_MUTANTS)
    for name, entry in SERVING_MUTANTS.items():
        adapter = mutant(f"mutant/{name}").adapter
        slot = adapter.serving if entry.protocol == "serving" else adapter.serving_tree
        assert slot is not None and adapter.engine_profile == entry.engine_profile
        assert entry.source.startswith("https://")
    assert all(e.engine_profile == PROFILE_NAME for e in serving_zoo(PROFILE_NAME))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SERVING_MUTANTS))
def test_registered_serving_entry_gets_its_declared_verdict_on_the_vllm_v1_profile(
    name: str,
) -> None:
    """The registered entries (``mutant/serving-<name>`` and ``mutant/serving-tree-<name>``, on
    the vLLM v1 profile): the lossy ones LOSSY, the controls LOSSLESS, on their cases (10-25 s
    each on 2 cores)."""
    entry = SERVING_MUTANTS[name]
    result = run_audit(
        [entry.adapter], RunConfig(cases=(entry.case.case_id,), steps=STEPS)  # type: ignore[union-attr]
    )
    expected = TargetVerdict.LOSSY if entry.lossy else TargetVerdict.LOSSLESS
    # The seed-contract mutants keep the law: on a law case alone they are LOSSLESS too (the
    # seed contract, tests/serving/test_seed_contract.py, is what finds them).
    assert result.targets[0].verdict is expected
