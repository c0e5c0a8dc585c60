"""The engine's decisions on fixed seeds are pinned (:mod:`tests.engine.behaviour`): the default
audit of the reference, a chain mutant, a tree mutant, a sharded fixed-design grid and the
property suite give exactly the verdicts, p-values, steps, count tables and replay lines that
were recorded before the engine was reorganised."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from numpy._core import _multiarray_umath

from tests.engine.behaviour import SCENARIOS, pinned

ROOT = Path(__file__).resolve().parents[2]


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


BATTERY_HASHES = """
import hashlib
from losslessness.batteries.chain import chain_battery_at_vocab, default_chain_battery
from losslessness.batteries.serving import default_serving_battery
from losslessness.batteries.serving_tree import default_serving_tree_battery
from losslessness.batteries.tree import default_tree_battery, tree_cases_at_vocab
cases = [*default_chain_battery(), *chain_battery_at_vocab(1000), *default_tree_battery(),
         *tree_cases_at_vocab(2000), *default_serving_battery(),
         *default_serving_tree_battery("vllm-v1")]
print(hashlib.sha256(" ".join(case.case_hash for case in cases).encode()).hexdigest())
"""


def test_battery_cases_are_the_same_bits_whatever_simd_kernels_the_cpu_selects() -> None:
    """Every battery case (chain, tree, serving, serving tree, and the ``--vocab-size`` ones)
    hashes the same here (this process, the CPU's own kernels) and when numpy is kept off
    AVX-512 and AVX2 (``NPY_DISABLE_CPU_FEATURES``) and torch off its
    vector kernels (``ATEN_CPU_CAPABILITY=default``): their ``exp`` kernels differ in the last bit,
    which changed ``v1000-peaked``'s seeds, and so this record, from one x86-64 machine to the
    next. numpy refuses to disable a feature the CPU lacks, so only the dispatched features
    this CPU has are disabled; on a CPU with none of them the numpy variant runs the same
    kernels and agrees trivially."""
    dispatched = [
        feature for feature in _multiarray_umath.__cpu_dispatch__
        if _multiarray_umath.__cpu_features__.get(feature)
    ]
    variants = [{"ATEN_CPU_CAPABILITY": "default"}]
    if dispatched:
        variants.append({"NPY_DISABLE_CPU_FEATURES": " ".join(dispatched)})
    as_is = io.StringIO()
    with contextlib.redirect_stdout(as_is):
        exec(BATTERY_HASHES, {})
    hashes = {as_is.getvalue()}
    for variant in variants:
        environment = {**os.environ, **variant, "PYTHONPATH": str(ROOT)}
        result = subprocess.run(
            [sys.executable, "-c", BATTERY_HASHES], env=environment, capture_output=True,
            text=True, timeout=300, check=False,
        )
        assert result.returncode == 0, result.stderr
        hashes.add(result.stdout)
    assert len(hashes) == 1, hashes
