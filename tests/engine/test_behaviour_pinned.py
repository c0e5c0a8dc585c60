"""The engine's decisions on fixed seeds are pinned (:mod:`tests.engine.behaviour`): the default
audit of the reference, a chain mutant, a tree mutant, a sharded fixed-design grid and the
property suite give exactly the verdicts, p-values, steps, count tables and replay lines that
were recorded before the engine was reorganised."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.behaviour import SCENARIOS, pinned


def _differences(expected: Any, got: Any, where: str = "") -> list[str]:
    if isinstance(expected, dict) and isinstance(got, dict):
        found = [f"{where}/{key}: missing" for key in expected if key not in got]
        found += [f"{where}/{key}: unexpected" for key in got if key not in expected]
        for key in expected.keys() & got.keys():
            found += _differences(expected[key], got[key], f"{where}/{key}")
        return found
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        return [
            line
            for index, (left, right) in enumerate(zip(expected, got, strict=True))
            for line in _differences(left, right, f"{where}[{index}]")
        ]
    return [] if expected == got else [f"{where}: pinned {expected!r}, got {got!r}"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_engine_decisions_equal_the_pinned_record(scenario: str) -> None:
    """Every verdict, p-value, step count, count table and replay line of ``scenario`` equals
    the pinned record (``python -m tests.engine.behaviour --write`` re-pins, for intended
    changes only)."""
    differences = _differences(pinned()[scenario], SCENARIOS[scenario]())
    assert not differences, "\n".join(differences[:20])
