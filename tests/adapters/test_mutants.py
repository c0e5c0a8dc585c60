"""The mutant zoo: every lossy mutant is caught by the default audit (exit 1), every lossless
control passes it (exit 0; sample-and-match as SUBOPTIMAL), each mutant's own case shows its
mechanism, and the zoo is well-formed, listed and addressable as ``mutant/<name>``.

The default audits run the whole battery once per chain mutant at the default design (TV 0.05,
power 0.9, family-wise false-alarm rate 1e-3, run seed 0): a few seconds each. Seeds are fixed,
so the verdicts are reproducible; the controls' false-alarm probability per run is the audit's
family-wise 1e-3.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
from click.testing import CliRunner

from losslessness.adapters import AdapterNotFound
from losslessness.cases import ChainCase, GreedyCase
from losslessness.checks import check_greedy, run_chain_checks
from losslessness.cli import main
from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.engine.draw import sample_chain, sample_greedy
from losslessness.reference.block import declared_verification
from losslessness.results import CheckContext, TargetVerdict, Verdict
from losslessness.targets import resolve_adapter
from losslessness.zoo import MUTANT_PREFIX, MUTANTS, Mutant, mutant

CASE_STEPS = 4000
"""Verify steps per mutant case in the mechanism check (small V and k: enough for every
mechanism of the zoo to exceed the minimum detectable effect by a wide margin)."""

CASE_ALPHA = 1e-6
"""Per-assertion level of the mechanism check (a few tens of assertions per case)."""

CASE_SEED = 7
"""Seed of the mechanism check's samples."""

CHAIN_OR_GREEDY = [
    name for name, entry in MUTANTS.items() if isinstance(entry.case, (ChainCase, GreedyCase))
]
"""The chain and greedy entries; the tree entries are tested in test_tree_mutants.py."""

SLOW_LOSSY = {"block-verification-wrong-residual"}
"""Mutants whose default audit takes about 40 s on 2 cores (block verification's draft-length
sweep): ``tox -e slow``; the property suite catches the same mutant in the default run
(tests/reference/test_block_verification.py)."""
LOSSY = [
    pytest.param(name, marks=pytest.mark.slow) if name in SLOW_LOSSY else name
    for name in CHAIN_OR_GREEDY
    if MUTANTS[name].lossy
]
CONTROLS = [name for name in CHAIN_OR_GREEDY if not MUTANTS[name].lossy]


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Run this module's audits on one torch thread: on two shared cores intra-op threading
    costs more than it saves at these tensor sizes (one mutant verify call at V = 4096, B = 341
    measured 0.12 s of CPU and 0.52 s of wall time with torch's two threads, 0.03 s and 0.18 s
    with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _docstring(entry: Mutant) -> str:
    adapter = entry.adapter
    verifier = adapter.chain or adapter.greedy or adapter.tree or adapter.greedy_tree
    return verifier.__doc__ or ""


@pytest.mark.parametrize("name", LOSSY)
def test_default_audit_catches_lossy_mutant_with_exit_1(name: str) -> None:
    """Power on real bugs: the default audit (default config and battery, seed 0) finds every
    lossy mutant LOSSY, so ``losslessness audit mutant/<name>`` exits 1."""
    result = run_audit([mutant(name).adapter], AuditConfig())
    target = result.targets[0]
    lossy = [check for check in target.checks if check.verdict is Verdict.LOSSY]
    assert result.exit_code == 1, [check.message for check in target.checks[:5]]
    assert target.verdict is TargetVerdict.LOSSY
    assert lossy


@pytest.mark.slow
@pytest.mark.parametrize("name", CONTROLS)
def test_default_audit_passes_lossless_control_with_exit_0(name: str) -> None:
    """No false alarm on lossless variants: every control exits 0 under the default audit;
    sample-and-match is SUBOPTIMAL (it accepts sum p q < sum min(p, q)), the others LOSSLESS.

    Slow (30-40 s each on two cores: a control samples the whole battery to the end); the
    default run checks each control on its own case (``test_mutant_case_shows_its_mechanism``)
    and the reference on the whole battery (``tests/engine/test_behaviour_pinned.py``)."""
    result = run_audit([mutant(name).adapter], AuditConfig())
    target = result.targets[0]
    flagged = [
        f"{check.check_id} {check.where}: {check.message}"
        for check in target.checks
        if check.verdict not in (Verdict.PASS, Verdict.SKIPPED)
    ]
    assert result.exit_code == 0, flagged
    expected = TargetVerdict.SUBOPTIMAL if name == "sample-and-match" else TargetVerdict.LOSSLESS
    assert target.verdict is expected, flagged


@pytest.mark.parametrize("name", CHAIN_OR_GREEDY)
def test_mutant_case_shows_its_mechanism(name: str) -> None:
    """Each mutant's own case is one where it acts: on it the checks flag a lossy mutant as
    LOSSY (its law, acceptance or output differs from the reference's), and find no loss in
    a control."""
    entry = mutant(name)
    context = CheckContext.for_case(
        name, entry.case, alpha=CASE_ALPHA, power=0.9, tv=0.05, seed=CASE_SEED
    )
    if isinstance(entry.case, ChainCase):
        assert entry.adapter.chain is not None
        samples = sample_chain(entry.adapter.chain, entry.case, CASE_STEPS, CASE_SEED)
        results = run_chain_checks(samples, context, declared_verification(entry.adapter.chain))
    else:
        assert entry.adapter.greedy is not None
        outputs = sample_greedy(entry.adapter.greedy, entry.case)
        results = [check_greedy(outputs, entry.case, context)]
    lossy = [f"{r.check_id} {r.where}" for r in results if r.verdict is Verdict.LOSSY]
    assert bool(lossy) == entry.lossy, lossy


def test_zoo_has_fifteen_lossy_mutants_then_controls_with_unique_kebab_names() -> None:
    """At least 15 lossy mutants, listed before the controls; names unique, kebab-case, and
    each adapter is named ``mutant/<name>`` with exactly one protocol."""
    flags = [entry.lossy for entry in MUTANTS.values()]
    assert sum(flags) >= 15
    assert flags == sorted(flags, reverse=True)
    assert len(CONTROLS) >= 4
    for name, entry in MUTANTS.items():
        assert entry.name == name
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9.]+)*", name), name
        assert entry.adapter.name == MUTANT_PREFIX + name
        adapter = entry.adapter
        protocols = (adapter.chain, adapter.greedy, adapter.tree, adapter.greedy_tree)
        assert sum(verifier is not None for verifier in protocols) == 1
        assert entry.mechanism and "\n" not in entry.mechanism


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_docstring_cites_its_source_url(name: str) -> None:
    """Every mutant names the public report its mechanism comes from, in ``source`` and in
    its verifier's docstring."""
    entry = mutant(name)
    assert re.fullmatch(r"https://github\.com/\S+", entry.source), entry.source
    assert entry.source in _docstring(entry)


def test_mutant_prefix_resolves_to_the_zoo_adapter() -> None:
    """``mutant/<name>`` resolves to that mutant's adapter (with or without the prefix in
    :func:`mutant`)."""
    assert resolve_adapter("mutant/shared-random-stream") is MUTANTS["shared-random-stream"].adapter
    assert mutant("mutant/sample-and-match") is mutant("sample-and-match")


def test_unknown_mutant_raises_adapter_not_found_naming_known_mutants() -> None:
    """An unknown mutant name is a clear error that lists the known mutants."""
    with pytest.raises(AdapterNotFound, match=r"no such mutant.*residual-clamped-1e-5"):
        resolve_adapter("mutant/not-a-bug")


def test_cli_unknown_mutant_is_a_usage_error() -> None:
    """``losslessness audit mutant/<unknown>`` exits 2 and names the known mutants."""
    result = CliRunner().invoke(main, ["audit", "--no-progress", "mutant/not-a-bug"])
    assert result.exit_code == 2
    assert "no such mutant" in result.output


def test_cli_audit_of_greedy_mutant_exits_1() -> None:
    """``losslessness audit mutant/greedy-ties-to-highest`` runs the greedy battery and exits
    1, naming the greedy check."""
    result = CliRunner().invoke(main, ["audit", "--no-progress", "mutant/greedy-ties-to-highest"])
    assert result.exit_code == 1, result.output
    assert "greedy" in result.output


def test_list_shows_the_mutant_zoo_table() -> None:
    """``losslessness list`` prints a "Mutant zoo" table with every mutant's name, kind and
    source."""
    result = CliRunner(env={"COLUMNS": "300"}).invoke(main, ["list"])
    assert result.exit_code == 0, result.output
    assert "Mutant zoo" in result.output
    for name, entry in MUTANTS.items():
        assert name in result.output
        assert entry.source in result.output
    assert "control" in result.output
