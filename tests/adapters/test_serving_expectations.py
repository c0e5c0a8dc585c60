"""The expected-verdict table of ``tox -e engines``' serving run (no engine needed)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.serving_expectations import merged, row_kinds, surprises

EXPECTED = {"engine": {("case-a", "min-p"): "drops min-p on drafts"}}


def _check(label: str | None, verdict: str, check_id: str = "serving.law") -> dict[str, Any]:
    return {
        "check_id": check_id,
        "case_id": "seed-contract" if check_id == "seed.contract" else "case-a",
        "verdict": verdict, "position": 0, "n": 30,
        "p_value": 0.5, "min_detectable_tv": None, "details": {"label": label} if label else {},
    }


def _record(*checks: dict[str, Any]) -> dict[str, Any]:
    return {"targets": [{"name": "engine", "checks": list(checks)}]}


def test_expected_lossy_row_kind_and_passing_rows_are_no_surprise() -> None:
    """A listed row kind that is LOSSY (one LOSSY check among PASSes) and unlisted kinds that
    PASS, structure included, give no surprise."""
    record = _record(
        _check("min-p", "PASS"), _check("min-p", "LOSSY"), _check("top-k", "PASS"),
        _check(None, "PASS", "serving.structure"), _check(None, "PASS", "seed.contract"),
    )
    assert surprises(row_kinds(record), EXPECTED) == []


def test_a_lossy_unlisted_kind_a_passing_listed_kind_and_a_broken_seed_contract_surprise() -> None:
    """Mutants of the record: an unlisted LOSSY kind, the listed kind passing, an
    IRREPRODUCIBLE seed contract, each named; a missing listed kind too."""
    record = _record(
        _check("min-p", "PASS"), _check("top-k", "LOSSY"),
        _check(None, "IRREPRODUCIBLE", "seed.contract"),
    )
    found = surprises(row_kinds(record), EXPECTED)
    assert any("case-a[top-k]: expected PASS, got LOSSY" in line for line in found)
    assert any("case-a[min-p]: expected LOSSY, got PASS" in line for line in found)
    assert any("expected PASS, got IRREPRODUCIBLE" in line for line in found)
    missing = surprises(row_kinds(_record(_check("top-k", "PASS"))), EXPECTED)
    assert missing == ["engine case-a[min-p]: expected LOSSY, not in the record"]


def test_an_undecided_kind_accepts_pass_and_lossy_but_not_error() -> None:
    """A kind listed as undecided (affected, not decided at the run's n) passes PASS or LOSSY;
    an ERROR there is still a surprise."""
    undecided = {"engine": {("case-a", "bias"): "drops bias on drafts"}}
    for verdict in ("PASS", "LOSSY"):
        record = _record(_check("min-p", "LOSSY"), _check("bias", verdict))
        assert surprises(row_kinds(record), EXPECTED, undecided) == []
    record = _record(_check("min-p", "LOSSY"), _check("bias", "ERROR"))
    assert surprises(row_kinds(record), EXPECTED, undecided) == [
        "engine case-a[bias]: expected PASS, got ERROR"
    ]


def test_a_documented_broken_seed_contract_is_expected_and_a_kept_one_then_surprises() -> None:
    """For a target whose seed contract is documented broken, IRREPRODUCIBLE is the expected
    verdict and PASS is the surprise (the finding would have gone away unnoticed)."""
    irreproducible = {"engine": "ignores seeds"}
    broken = _record(_check("min-p", "LOSSY"), _check(None, "IRREPRODUCIBLE", "seed.contract"))
    assert surprises(row_kinds(broken), EXPECTED, None, irreproducible) == []
    kept = _record(_check("min-p", "LOSSY"), _check(None, "PASS", "seed.contract"))
    assert surprises(row_kinds(kept), EXPECTED, None, irreproducible) == [
        "engine seed-contract[]: expected IRREPRODUCIBLE, got PASS"
    ]


def test_records_of_one_target_merge_their_row_kinds_and_refuse_a_kind_twice() -> None:
    """Two records auditing one target on different cases give the union of its row kinds (a
    LOSSY unlisted kind from the second record still surprises); the same row kind in both
    raises ValueError naming it."""
    first = row_kinds(_record(_check("min-p", "LOSSY")))
    second = _record(_check("top-k", "LOSSY"))
    second["targets"][0]["checks"][0]["case_id"] = "case-b"
    kinds = merged([first, row_kinds(second)])
    assert set(kinds["engine"]) == {("case-a", "min-p"), ("case-b", "top-k")}
    assert surprises(kinds, EXPECTED) == ["engine case-b[top-k]: expected PASS, got LOSSY"]
    with pytest.raises(ValueError, match=r"case-a\[min-p\] is in two records"):
        merged([first, row_kinds(_record(_check("min-p", "PASS")))])


def test_a_serving_tree_case_is_one_row_kind_of_its_tree_checks_and_other_tree_cases_are_not(
) -> None:
    """The tree checks of a serving tree battery case form one row kind (label ``""``: one
    request per case), LOSSY when one of them is; a tree check of another case (the tree
    battery's) is no row kind."""
    law = _check(None, "LOSSY", "tree.law")
    law["case_id"] = "stree-greedy-min-tokens"
    structure = _check(None, "PASS", "tree.structure")
    structure["case_id"] = "stree-greedy-min-tokens"
    plain = _check(None, "LOSSY", "tree.law")
    plain["case_id"] = "tree-star2-iid"
    kinds = row_kinds(_record(law, structure, plain))
    assert list(kinds["engine"]) == [("stree-greedy-min-tokens", "")]
    assert kinds["engine"][("stree-greedy-min-tokens", "")].verdict == "LOSSY"
