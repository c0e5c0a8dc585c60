"""Planning a run: which targets, cases and units it samples, and its error budget, decided
before any sample is drawn.

A run is a fixed grid of *units*, the same however the run is split into shards:

- ``chain``: one chunk of one battery case on one target. A case's verification steps are the
  CI plan's (:func:`plan_case` at the run's per-assertion level) times the step multiplier, cut
  into chunks of at most ``config.chunk_steps`` steps (one chunk when it is None, as in the
  audit);
- ``greedy``: one greedy case on one target (exact, deterministic);
- ``tree``: one tree case of the tree battery on one target's tree verifier: its trees (the CI
  plan's, :func:`losslessness.checks.tree_assertions.tree_steps`, times the step multiplier)
  and every tree check, run in the unit (no count table: the checks' results are the unit's
  record);
- ``greedy-tree``: one greedy tree case on one target (exact, deterministic);
- ``serving``: one serving case (:mod:`losslessness.batteries.serving`) on one target's
  serving verifier, sized on the engine profile the target claims
  (:func:`losslessness.checks.serving.serving_design`), checked in the unit;
- ``seed-contract``: one per serving target, the same seeded requests in many batch
  compositions compared exactly (:mod:`losslessness.engine.seed_contract`; no share of the
  error budget: the check has no false alarms);
- ``end-to-end``: one end-to-end engine of one target (the sequence-law checks);
- ``device``: the coupling and precision checks on the run's device;
- ``suite``: the property suite on one target (a pytest subprocess).

Seeds: a chain case's seed is ``derive_seed(run seed, UnitKind.CHAIN.value, case hash)`` (the
same for every target); chunk 0 is sampled from the case seed itself and chunk j >= 1 from
``derive_seed(case seed, j)``, so a one-chunk run replays with ``--seed S --case C --steps N``.

The family-wise false-alarm rate is one Bonferroni budget: the device checks get the share of
one more target (``alpha / (targets + 1)``) when the run has them; the rest is split evenly
over every statistical assertion of the battery (chain cases, tree cases and sequence-law
tests of every target, and one run-level uniformity test of each target's law p-values).
Chain and tree assertions split their share again: ``sequential_share`` to the e-process that
may stop a lossy target early, the rest to the fixed-n test. The property suite spends its
own documented rate per target.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import importlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from losslessness.adapters import Adapter, EndToEndTarget
from losslessness.batteries import (
    SERVING_CI_MAX_STEPS,
    TREE_CI_MAX_STEPS,
    chain_battery_at_vocab,
    default_chain_battery,
    default_greedy_battery,
    default_greedy_tree_battery,
    default_serving_battery,
    default_tree_battery,
)
from losslessness.batteries.case_file import CaseFile, read_case_file
from losslessness.batteries.serving_tree import (
    SERVING_TREE_CASE_IDS,
    default_serving_tree_battery,
)
from losslessness.batteries.tree import tree_case_in_dtype, tree_cases_at_vocab
from losslessness.cases import ChainCase, GreedyCase, GreedyTreeCase, ServingCase, TreeCase
from losslessness.checks import STATISTICAL_CHAIN_CHECK_IDS, count_statistical_assertions
from losslessness.checks.assertions import case_laws, law_is_statistical
from losslessness.checks.ids import (
    CHAIN_CHECK_IDS,
    DRAFTS_ACCEPTED_CHECK_ID,
    GREEDY_CHECK_ID,
    LAW_CHECK_ID,
    PVALUES_CHECK_ID,
    SEED_CONTRACT_CHECK_ID,
    SEQUENCE_GREEDY_CHECK_ID,
    SEQUENCE_LAW_CHECK_ID,
    SERVING_CHECK_IDS,
    STATISTICAL_SERVING_CHECK_IDS,
    STATISTICAL_TREE_CHECK_IDS,
    TREE_CHECK_IDS,
    TREE_GREEDY_CHECK_ID,
)
from losslessness.checks.serving import serving_assertion_count, serving_design
from losslessness.checks.tree_assertions import tree_assertions, tree_steps
from losslessness.config import RunConfig
from losslessness.engine.draw import rows_per_call
from losslessness.engine.end_to_end import EndToEndPlan, plan_end_to_end
from losslessness.engine.seed_contract import SEED_CONTRACT_CASE_ID
from losslessness.engine.tables import CountTable
from losslessness.reference.block import declared_verification
from losslessness.reference.profiles import get_profile
from losslessness.seeding import derive_seed
from losslessness.stats import ErrorBudget, plan_identity_test
from losslessness.stats.sequential import SEQUENTIAL_ALPHA_SHARE, AlphaSplit, split_alpha
from losslessness.targets import UnavailableTarget, resolve_targets
from losslessness.worker import release_engine

PLAN_VERSION = "5"
"""Version of the plan's description; shards of different versions never merge."""



class UnitKind(str, enum.Enum):
    """Kinds of work unit, in grid order within a target (see the module docstring); the values
    are what plan and shard files hold."""

    CHAIN = "chain"
    GREEDY = "greedy"
    TREE = "tree"
    GREEDY_TREE = "greedy-tree"
    SERVING = "serving"
    SEED_CONTRACT = "seed-contract"
    END_TO_END = "end-to-end"
    DEVICE = "device"
    SUITE = "suite"

    def __str__(self) -> str:
        return self.value


DEVICE_CI_STEPS = 20_000
"""Steps per case and row type of the device checks at step multiplier 1."""

MIN_STEPS = 2000
"""Fewest verification steps per row type in the CI plan, so that exact checks and acceptance
tests see enough samples even where the identity tests need few."""


@dataclass(frozen=True)
class CasePlan:
    """Verification steps one chain case needs at step multiplier 1 (the CI plan).

    Attributes:
        n_steps: steps per row type.
        needed_steps: steps the design (tv, alpha, power) asks for, before the cap.
        capped: True when ``max_steps`` cut ``needed_steps``; the results then report a
            minimum detectable TV above the requested one.
    """

    n_steps: int
    needed_steps: int
    capped: bool


def plan_case(case: ChainCase, tv: float, alpha: float, power: float, max_steps: int) -> CasePlan:
    """Steps needed so that every identity test of ``case`` detects TV >= ``tv``.

    Position i of row r is reached with probability ``reach[r, i]``, so it needs about
    ``n_i / reach[r, i]`` steps (plus three binomial standard deviations) for the ``n_i``
    samples of its identity test (:func:`losslessness.stats.plan_identity_test`); exact checks
    need ``log(1 - power) / log(1 - tv)`` observations; never fewer than :data:`MIN_STEPS`.

    Args:
        case: the case.
        tv: design TV distance in (0, 1].
        alpha: per-assertion significance level.
        power: design power 1 - beta.
        max_steps: cap on the steps per row type.

    Returns:
        :class:`CasePlan`.
    """
    exact_n = math.ceil(math.log1p(-power) / math.log1p(-min(tv, 1 - 1e-12)))
    needed = max(MIN_STEPS, exact_n)
    for laws in case_laws(case):
        for i in range(case.k + 1):
            if not law_is_statistical(laws, i):
                continue
            plan = plan_identity_test(laws.emitted[i].numpy(), tv, alpha, power, max_n=max_steps)
            reach = float(laws.reach[i])
            # The count reaching position i is Binomial(steps, reach); three standard
            # deviations of head-room keep it at or above plan.n in all but ~0.1% of runs.
            needed = max(needed, math.ceil((plan.n + 3 * math.sqrt(plan.n * (1 - reach))) / reach))
    return CasePlan(min(needed, max_steps), needed, needed > max_steps)


@dataclass(frozen=True)
class ChainCasePlan:
    """The chunk grid of one chain case (the same for every target).

    Attributes:
        case_id, case_hash: the case.
        ci_steps: steps per row type of the CI plan (step multiplier 1) at the run's alpha.
        needed_steps: steps the design asked for before the cap.
        capped: the CI plan was capped (its minimum detectable TV exceeds the design TV).
        n_steps: the run's steps per row type: ``ceil(ci_steps * step_multiplier)``
            (``steps`` when the config fixes it).
        chunk_steps: steps per chunk (the last chunk may be shorter).
        steps_per_call: copies of each row type one verifier call carries.
        seed: the case seed (chunk 0's seed).
    """

    case_id: str
    case_hash: str
    ci_steps: int
    needed_steps: int
    capped: bool
    n_steps: int
    chunk_steps: int
    steps_per_call: int
    seed: int

    @property
    def n_chunks(self) -> int:
        """Number of chunks."""
        return -(-self.n_steps // self.chunk_steps)

    def chunk_size(self, chunk: int) -> int:
        """Steps of chunk ``chunk`` (every chunk but the last has ``chunk_steps``).

        Raises:
            ValueError: naming ``chunk`` when out of range.
        """
        if not 0 <= chunk < self.n_chunks:
            raise ValueError(f"chunk: must lie in [0, {self.n_chunks}), got {chunk}")
        return min(self.chunk_steps, self.n_steps - chunk * self.chunk_steps)

    def chunk_seed(self, chunk: int) -> int:
        """Seed of chunk ``chunk``: the case seed for chunk 0, ``derive_seed(seed, j)`` after."""
        return self.seed if chunk == 0 else derive_seed(self.seed, chunk)


@dataclass(frozen=True)
class TreeCasePlan:
    """The trees of one tree case (the same for every target; one unit per target).

    Attributes:
        case_id, case_hash: the case.
        ci_steps: trees of the CI plan (step multiplier 1) at the run's alpha, capped.
        needed_steps: trees the design (tv, alpha, power) asked for, before the caps
            (``max_steps`` and :data:`~losslessness.batteries.tree.TREE_CI_MAX_STEPS`).
        capped: a cap cut ``needed_steps`` (the results report a minimum detectable TV above
            the design TV).
        n_steps: the run's trees: ``ceil(ci_steps * step_multiplier)`` (``steps`` when the
            config fixes it).
        steps_per_call: trees per verifier call (the case's batch size).
        seed: the case seed, ``derive_seed(run seed, UnitKind.TREE.value, case hash)``.
    """

    case_id: str
    case_hash: str
    ci_steps: int
    needed_steps: int
    capped: bool
    n_steps: int
    steps_per_call: int
    seed: int


@dataclass(frozen=True)
class Unit:
    """One indivisible piece of the run's work.

    Attributes:
        index: position in the grid; shard ``i/N`` runs the units with ``index % N == i``.
        kind: which work (:class:`UnitKind`).
        target: the target's name (the device for ``device`` units).
        case_id: the battery case (chain, greedy, tree, greedy-tree) or end-to-end engine,
            else empty.
        chunk: the chunk index (chain), else 0.
        steps: verification steps per row type of the chunk (chain), trees (tree), else 0.
    """

    index: int
    kind: UnitKind
    target: str
    case_id: str = ""
    chunk: int = 0
    steps: int = 0

    @property
    def key(self) -> str:
        """``kind/target/case/chunk``: names the unit in files and errors."""
        return f"{self.kind}/{self.target}/{self.case_id}/{self.chunk}"


@dataclass(frozen=True)
class PlanRecord:
    """Everything of a plan that decides the samples and the error budget, as plain data: what a
    shard file stores, what two shards must share to merge, and what finishing a run reads.

    Attributes:
        plan_version: :data:`PLAN_VERSION`.
        config: the design.
        targets: loaded targets, in grid order: (name, description, declared verification,
            ``"token"`` or ``"block"``).
        unavailable: targets that did not load: (name, reason, named by the user).
        chain_cases: the chunk grid of every chain case, by case id.
        greedy_cases: case hash of every greedy case, by case id.
        tree_cases: the trees of every tree case, by case id.
        greedy_tree_cases: case hash of every greedy tree case, by case id.
        serving_cases: case hash of every serving case, by case id (each serving unit's
            ``steps`` are its rows per kind, sized on its target's engine profile; 0 when the
            target names no known profile).
        n_assertions: statistical assertions of the battery.
        battery_alpha: the battery's family-wise rate (split Bonferroni over ``n_assertions``).
        device_alpha: the device checks' family-wise rate (0 without them).
        device_steps: steps per case of the device checks.
        device_note: why the run has no device unit, when it has none.
        suite_targets: targets the property suite runs on.
        units: the grid.
        sequential_share: share of each chain assertion's level spent on its sequential test
            (0 without early stopping).
        pvalues_targets: targets that get the run-level uniformity test of their law
            p-values (:mod:`losslessness.checks.pvalues`), one assertion each.
        declarations: what each loaded target's adapter declares: (name, the cases it does
            not take or None, its expected verdict or None, why); see
            :class:`~losslessness.adapters.Adapter`.
    """

    plan_version: str
    config: RunConfig
    targets: tuple[tuple[str, str, str], ...]
    unavailable: tuple[tuple[str, str, bool], ...]
    chain_cases: dict[str, ChainCasePlan]
    greedy_cases: dict[str, str]
    tree_cases: dict[str, TreeCasePlan]
    greedy_tree_cases: dict[str, str]
    n_assertions: int
    battery_alpha: float
    device_alpha: float
    device_steps: int
    device_note: str | None
    suite_targets: tuple[str, ...]
    units: tuple[Unit, ...]
    sequential_share: float = 0.0
    pvalues_targets: tuple[str, ...] = ()
    declarations: tuple[tuple[str, str | None, str | None, str | None], ...] = ()
    serving_cases: dict[str, str] = field(default_factory=dict)

    def declared(self, target: str) -> tuple[str | None, str | None, str | None]:
        """(exclusions, expected verdict, reason) ``target``'s adapter declares (all None
        when it declares nothing)."""
        for name, exclusions, expected, reason in self.declarations:
            if name == target:
                return exclusions, expected, reason
        return None, None, None

    @property
    def per_assertion_alpha(self) -> float:
        """Each battery assertion's significance level."""
        return self.battery_alpha / self.n_assertions

    @property
    def alpha_split(self) -> AlphaSplit:
        """A chain or tree assertion's level, split between its sequential and fixed-n tests (the
        end-to-end sequence-law tests have no sequential test: their whole level is fixed-n)."""
        return split_alpha(self.per_assertion_alpha, self.sequential_share)

    def to_json(self) -> dict[str, Any]:
        """The JSON-able form (tuples as lists)."""
        data: dict[str, Any] = dataclasses.asdict(self)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanRecord:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: another plan version, or missing fields.
        """
        if data.get("plan_version") != PLAN_VERSION:
            raise ValueError(
                f"plan: version {data.get('plan_version')!r}, this losslessness reads "
                f"{PLAN_VERSION!r}"
            )
        try:
            return cls(
                plan_version=data["plan_version"],
                config=RunConfig.from_json(data["config"]),
                targets=tuple(
                    (str(name), str(text), str(how)) for name, text, how in data["targets"]
                ),
                unavailable=tuple(
                    (str(name), str(why), bool(named)) for name, why, named in data["unavailable"]
                ),
                chain_cases={
                    case_id: ChainCasePlan(**grid) for case_id, grid in data["chain_cases"].items()
                },
                greedy_cases=dict(data["greedy_cases"]),
                tree_cases={
                    case_id: TreeCasePlan(**grid) for case_id, grid in data["tree_cases"].items()
                },
                greedy_tree_cases=dict(data["greedy_tree_cases"]),
                n_assertions=int(data["n_assertions"]),
                battery_alpha=float(data["battery_alpha"]),
                device_alpha=float(data["device_alpha"]),
                device_steps=int(data["device_steps"]),
                device_note=data["device_note"],
                suite_targets=tuple(data["suite_targets"]),
                units=tuple(
                    Unit(**{**unit, "kind": UnitKind(unit["kind"])}) for unit in data["units"]
                ),
                sequential_share=float(data["sequential_share"]),
                pvalues_targets=tuple(data["pvalues_targets"]),
                declarations=tuple(
                    (str(name), exclusions, expected, reason)
                    for name, exclusions, expected, reason in data.get("declarations", [])
                ),
                serving_cases=dict(data.get("serving_cases", {})),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"plan: not a plan record of version {PLAN_VERSION}: {error}"
            ) from error

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON form."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class WarmUp:
    """What a time budget's warm-up (:mod:`losslessness.engine.time_budget`) drew, kept so
    that the run checks it like its own samples (a verifier wrong only on its first calls
    fails with a time budget as without one).

    Attributes:
        tables: by (target, chain case id), the count tables of the warm-up's calls (their own
            seeds; sizes fixed in advance): joined to the case's table, checked with it.
        violations: by (target, chain case id), a malformed output of a warm-up call (the case
            fails as any malformed output does).
        exact: by (target, unit kind, case id), a greedy or greedy tree unit's one
            deterministic call: its ``[B, k+1]`` int64 outputs (greedy; a tree's tokens and
            accepted nodes for greedy trees), or the
            :class:`~losslessness.engine.draw.ProtocolViolation` it raised. The unit checks this
            call instead of making it again.
    """

    tables: dict[tuple[str, str], list[CountTable]] = field(default_factory=dict)
    violations: dict[tuple[str, str], str] = field(default_factory=dict)
    exact: dict[tuple[str, UnitKind, str], Any] = field(default_factory=dict)


@dataclass
class RunPlan:
    """A plan with what only the planning process holds: the loaded adapters, the battery's
    cases and the end-to-end plans (exact laws).

    Attributes:
        record: the plain-data plan (:class:`PlanRecord`).
        adapters: loaded adapters, in grid order.
        chain_cases, greedy_cases: the battery cases the run samples.
        end_to_end: each target's end-to-end plans, by target name.
        tree_cases, greedy_tree_cases: the tree battery's cases the run samples.
        serving_cases: the serving battery's cases the run samples.
        warm_up: a time budget's warm-up samples (empty without one).
    """

    record: PlanRecord
    adapters: list[Adapter]
    chain_cases: list[ChainCase]
    greedy_cases: list[GreedyCase]
    end_to_end: dict[str, list[EndToEndPlan]] = field(default_factory=dict)
    tree_cases: list[TreeCase] = field(default_factory=list)
    greedy_tree_cases: list[GreedyTreeCase] = field(default_factory=list)
    serving_cases: list[ServingCase] = field(default_factory=list)
    warm_up: WarmUp = field(default_factory=WarmUp)

    @property
    def config(self) -> RunConfig:
        """The design."""
        return self.record.config

    @property
    def units(self) -> tuple[Unit, ...]:
        """The grid."""
        return self.record.units

    @property
    def fingerprint(self) -> str:
        """The plan record's fingerprint."""
        return self.record.fingerprint

    def adapter(self, name: str) -> Adapter:
        """The loaded adapter called ``name``.

        Raises:
            KeyError: no loaded target has that name.
        """
        for adapter in self.adapters:
            if adapter.name == name:
                return adapter
        raise KeyError(f"target: {name!r} is not a loaded target of this plan")

    def planned_steps(self, units: Sequence[Unit] | None = None) -> int:
        """Verification steps (batch rows) and sequences the run's sampled units (or
        ``units``) will draw."""
        cases = {case.case_id: case for case in self.chain_cases}
        greedy = {case.case_id: case for case in self.greedy_cases}
        greedy_trees = {case.case_id: case for case in self.greedy_tree_cases}
        serving = {case.case_id: case for case in self.serving_cases}
        e2e = {
            (name, entry.target.name): entry
            for name, entries in self.end_to_end.items()
            for entry in entries
        }
        total = 0
        for unit in self.units if units is None else units:
            if unit.kind is UnitKind.CHAIN:
                total += unit.steps * cases[unit.case_id].n_rows
            elif unit.kind is UnitKind.GREEDY:
                total += greedy[unit.case_id].batch_size
            elif unit.kind is UnitKind.TREE:
                total += unit.steps
            elif unit.kind is UnitKind.GREEDY_TREE:
                total += greedy_trees[unit.case_id].batch_size
            elif unit.kind is UnitKind.SERVING:
                total += unit.steps * len(serving[unit.case_id].rows)
            elif unit.kind is UnitKind.END_TO_END:
                total += e2e[(unit.target, unit.case_id)].planned_runs
        return total


def end_to_end_check_ids(target: EndToEndTarget) -> tuple[str, str]:
    """The check ids an end-to-end target is audited with (its law check, drafts-accepted)."""
    law = SEQUENCE_GREEDY_CHECK_ID if target.greedy else SEQUENCE_LAW_CHECK_ID
    return law, DRAFTS_ACCEPTED_CHECK_ID


def with_call_conditions(cases: Sequence[ChainCase], config: RunConfig) -> list[ChainCase]:
    """``cases`` under the run's call conditions (``--batch-size``, ``--dtype``): each case's
    own where the run sets none. The summary says the conditions; the hash covers them.

    Raises:
        InvalidInputError: a case whose rows do not survive the cast (naming ``target_probs``
            or ``draft_probs``).
    """
    if config.batch_size is None and config.dtype is None:
        return list(cases)
    conditioned = []
    for case in cases:
        batch = case.call_batch_size if config.batch_size is None else config.batch_size
        dtype = case.dtype if config.dtype is None else config.dtype
        extra = f" [B={batch}]" if batch is not None else ""
        extra += f" [{dtype}]" if dtype != "float64" else ""
        conditioned.append(
            dataclasses.replace(
                case, summary=case.summary + extra, call_batch_size=batch, dtype=dtype
            )
        )
    return conditioned


def case_file_of(config: RunConfig) -> CaseFile | None:
    """The run's case file (``--case-file``), read and validated, or None without one.

    Raises:
        CaseFileError: an unreadable or invalid file (naming ``case_file``, the table and the
            field).
    """
    return None if config.case_file is None else read_case_file(config.case_file)


def select_cases(
    config: RunConfig, adapters: Sequence[Adapter] = ()
) -> tuple[list[ChainCase], list[GreedyCase], dict[str, list[EndToEndTarget]]]:
    """The battery's chain and greedy cases, the case file's chain cases, and each adapter's
    end-to-end targets that the run covers (``config.cases`` and ``config.only``).

    Raises:
        ValueError: naming ``cases``: ids that are neither battery cases, case-file cases nor
            end-to-end targets.
        CaseFileError: an invalid case file, or one whose ids name battery cases or end-to-end
            targets (naming ``case_file``).
    """
    file = case_file_of(config)
    battery = (
        default_chain_battery()
        if config.vocab_size is None
        else list(chain_battery_at_vocab(config.vocab_size))
    )
    greedy = default_greedy_battery()
    e2e_names = {target.name for adapter in adapters for target in adapter.end_to_end}
    if file is not None:
        # Every id --case may name must name one case, whatever the run's conditions.
        reserved = {case.case_id for case in battery} | {case.case_id for case in greedy}
        reserved |= {case.case_id for case in default_chain_battery()}
        reserved |= {case.case_id for case in _tree_battery(config, with_file=False)}
        reserved |= {case.case_id for case in default_tree_battery()}
        reserved |= {case.case_id for case in default_greedy_tree_battery()}
        reserved |= {case.case_id for case in default_serving_battery()}
        reserved |= set(SERVING_TREE_CASE_IDS)
        file.check_reserved(reserved | e2e_names | {SEED_CONTRACT_CASE_ID})
        battery += file.chain_cases()
    chain = with_call_conditions(battery, config)
    if config.cases:
        known = {case.case_id for case in chain} | {case.case_id for case in greedy}
        known |= {case.case_id for case in _tree_battery(config)}
        known |= {case.case_id for case in default_greedy_tree_battery()}
        known |= {case.case_id for case in _serving_battery(config)}
        known |= set(SERVING_TREE_CASE_IDS)
        if file is not None:
            known |= {spec.case_id for spec in file.serving_tree}
        known.add(SEED_CONTRACT_CASE_ID)
        known |= e2e_names
        unknown = sorted(set(config.cases) - known)
        if unknown:
            raise ValueError(f"cases: unknown case ids {unknown}; known: {sorted(known)}")
        chain = [case for case in chain if case.case_id in config.cases]
        greedy = [case for case in greedy if case.case_id in config.cases]
    if not any(config.selects(check_id) for check_id in CHAIN_CHECK_IDS):
        chain = []
    if not config.selects(GREEDY_CHECK_ID):
        greedy = []
    end_to_end = {
        adapter.name: [
            target
            for target in adapter.end_to_end
            if (not config.cases or target.name in config.cases)
            and any(config.selects(check_id) for check_id in end_to_end_check_ids(target))
        ]
        for adapter in adapters
    }
    return chain, greedy, end_to_end


def _tree_battery(config: RunConfig, with_file: bool = True) -> list[TreeCase]:
    """The sampled tree cases under the run's conditions: the battery's (rebuilt at
    ``--vocab-size``) and, ``with_file``, the case file's; p and q in float32 under ``--dtype
    float32`` (ids suffixed ``-float32``), ``--batch-size`` trees per call."""
    tree = (
        default_tree_battery()
        if config.vocab_size is None
        else tree_cases_at_vocab(config.vocab_size)
    )
    file = case_file_of(config) if with_file else None
    if file is not None:
        tree += file.tree_cases()
    if config.dtype == "float32":
        tree = [tree_case_in_dtype(case, torch.float32) for case in tree]
    return _trees_per_call(tree, config)


def _trees_per_call(cases: list[TreeCase], config: RunConfig) -> list[TreeCase]:
    """``cases`` with ``--batch-size`` trees per call, when given (the summary says so)."""
    if config.batch_size is None:
        return cases
    return [
        dataclasses.replace(
            case, summary=f"{case.summary} [B={config.batch_size}]", batch_size=config.batch_size
        )
        for case in cases
    ]


def _serving_battery(config: RunConfig) -> list[ServingCase]:
    """The serving battery's cases and the case file's."""
    file = case_file_of(config)
    return default_serving_battery() + ([] if file is None else file.serving_cases())


def select_tree_cases(config: RunConfig) -> tuple[list[TreeCase], list[GreedyTreeCase]]:
    """The tree battery's and the case file's tree cases and the greedy tree cases the run
    covers (``config.cases`` and ``config.only``); under ``--vocab-size`` the battery's sampled
    tree shapes rebuilt at that V (:func:`~losslessness.batteries.tree.tree_cases_at_vocab`),
    under ``--dtype float32`` every tree case's p and q given in float32 (the file's too), under
    ``--batch-size`` that many trees per call. Unknown ids are
    :func:`select_cases`'s to reject.

    Raises:
        ValueError: naming ``dtype`` for bfloat16, which tree inputs do not take (a bfloat16
            row misses the tree protocol's row-sum tolerance).
    """
    tree = _tree_battery(config)
    greedy_tree = default_greedy_tree_battery()
    if config.cases:
        tree = [case for case in tree if case.case_id in config.cases]
        greedy_tree = [case for case in greedy_tree if case.case_id in config.cases]
    if not any(config.selects(check_id) for check_id in TREE_CHECK_IDS):
        tree = []
    if not config.selects(TREE_GREEDY_CHECK_ID):
        greedy_tree = []
    return tree, greedy_tree


def select_serving_cases(config: RunConfig) -> list[ServingCase]:
    """The serving battery's and the case file's serving cases the run covers
    (``config.cases`` and ``config.only``); unknown ids are :func:`select_cases`'s to
    reject."""
    cases = _serving_battery(config)
    if config.cases:
        cases = [case for case in cases if case.case_id in config.cases]
    if not any(config.selects(check_id) for check_id in SERVING_CHECK_IDS):
        return []
    return cases


def select_serving_tree_cases(config: RunConfig, adapter: Adapter) -> list[TreeCase]:
    """The serving tree battery built for ``adapter``'s engine profile
    (:func:`~losslessness.batteries.serving_tree.default_serving_tree_battery`) and the case
    file's serving tree cases built for it, their logits in ``--dtype`` when given (float32,
    or the file table's own, by default), ``--batch-size`` trees per call, that the run
    covers (``config.cases`` and ``config.only``); unknown ids are :func:`select_cases`'s to
    reject.

    Raises:
        ValueError: naming the target when it names no engine profile, or an unknown one.
        CaseFileError: a case file's serving tree case whose request the profile does not
            implement (naming the table).
    """
    if not adapter.engine_profile:
        raise ValueError(
            f"targets: {adapter.name} is a serving tree target without an engine profile: set "
            "its engine_profile attribute or pass --engine-profile"
        )
    try:
        cases = default_serving_tree_battery(adapter.engine_profile, config.dtype or "float32")
    except ValueError as error:
        raise ValueError(f"targets: {adapter.name}: {error}") from None
    file = case_file_of(config)
    if file is not None:
        cases += file.serving_tree_cases(adapter.engine_profile, config.dtype)
    cases = _trees_per_call(cases, config)
    if config.cases:
        cases = [case for case in cases if case.case_id in config.cases]
    if not any(config.selects(check_id) for check_id in TREE_CHECK_IDS):
        return []
    return cases


def _serving_steps(adapter: Adapter, case: ServingCase, config: RunConfig, alpha: float) -> int:
    """Rows per kind of ``case`` on ``adapter``'s engine profile (0 without a known profile: the
    unit then reports why as an ERROR)."""
    if config.steps is not None:
        return config.steps
    try:
        profile = get_profile(adapter.engine_profile or "")
        cap = min(config.max_steps, case.max_steps or SERVING_CI_MAX_STEPS)
        design = serving_design(case, profile, config.tv, alpha, config.power, cap, MIN_STEPS)
    except ValueError:
        return 0
    return max(1, math.ceil(design.steps * config.step_multiplier))


def _tree_case_plan(case: TreeCase, config: RunConfig, alpha: float) -> TreeCasePlan:
    cap = min(config.max_steps, TREE_CI_MAX_STEPS)
    ci_steps, needed = tree_steps(case, config.tv, alpha, config.power, cap, MIN_STEPS)
    capped = needed > cap
    if config.steps is not None:
        ci_steps = needed = n_steps = config.steps
        capped = False
    else:
        n_steps = max(1, math.ceil(ci_steps * config.step_multiplier))
    return TreeCasePlan(
        case_id=case.case_id,
        case_hash=case.case_hash,
        ci_steps=ci_steps,
        needed_steps=needed,
        capped=capped,
        n_steps=n_steps,
        steps_per_call=case.batch_size,
        seed=derive_seed(config.seed, UnitKind.TREE.value, case.case_hash),
    )


def _chain_case_plan(case: ChainCase, config: RunConfig, alpha: float) -> ChainCasePlan:
    ci = plan_case(case, config.tv, alpha, config.power, config.max_steps)
    if config.steps is not None:
        ci = CasePlan(config.steps, config.steps, False)
        n_steps = config.steps
    else:
        n_steps = max(1, math.ceil(ci.n_steps * config.step_multiplier))
    return ChainCasePlan(
        case_id=case.case_id,
        case_hash=case.case_hash,
        ci_steps=ci.n_steps,
        needed_steps=ci.needed_steps,
        capped=ci.capped,
        n_steps=n_steps,
        chunk_steps=min(config.chunk_steps or n_steps, n_steps),
        steps_per_call=rows_per_call(case),
        seed=derive_seed(config.seed, UnitKind.CHAIN.value, case.case_hash),
    )


def plan_run(
    config: RunConfig,
    targets: Sequence[Adapter | UnavailableTarget],
    device_note: str | None = None,
) -> RunPlan:
    """Count the run's assertions, split its budget, size every case and lay out the grid.

    Args:
        config: the design.
        targets: loaded adapters and targets that did not load (recorded).
        device_note: why the device checks cannot run here, when they cannot (None: they can).

    Returns:
        :class:`RunPlan`.

    Raises:
        ValueError: repeated target names, unknown case ids (naming ``cases``), bfloat16
            inputs with a tree target (naming ``dtype``), or serving tree targets without an
            engine profile or of different profiles (naming ``targets``).
    """
    adapters = [target for target in targets if isinstance(target, Adapter)]
    unavailable = [target for target in targets if isinstance(target, UnavailableTarget)]
    names = [adapter.name for adapter in adapters]
    if len(set(names)) != len(names):
        raise ValueError(f"targets: names repeat: {names}")
    chain, greedy, end_to_end = select_cases(config, adapters)
    chain_targets = [adapter for adapter in adapters if adapter.chain is not None]
    if not chain_targets:
        chain = []
    if not any(adapter.greedy is not None for adapter in adapters):
        greedy = []
    tree, greedy_tree = (
        select_tree_cases(config)
        if any(a.tree is not None or a.greedy_tree is not None for a in adapters)
        else ([], [])
    )
    serving_targets = [adapter for adapter in adapters if adapter.serving is not None]
    serving = select_serving_cases(config) if serving_targets else []
    tree_targets = [adapter for adapter in adapters if adapter.tree is not None]
    if not tree_targets:
        tree = []
    serving_trees = {
        adapter.name: select_serving_tree_cases(config, adapter)
        for adapter in adapters
        if adapter.serving_tree is not None
    }
    serving_tree_cases: dict[str, TreeCase] = {}
    for name, built in serving_trees.items():
        for built_case in built:
            known = serving_tree_cases.setdefault(built_case.case_id, built_case)
            if known.case_hash != built_case.case_hash:
                raise ValueError(
                    f"targets: serving tree case {built_case.case_id} differs between the "
                    f"engine profiles of the run's serving tree targets ({name}: "
                    f"{built_case.summary}); audit targets of different profiles in separate runs"
                )
    if tree and config.dtype == "bfloat16":
        raise ValueError(
            "dtype: bfloat16 is not taken by tree cases (a bfloat16 row misses the tree "
            "protocol's row-sum tolerance of 1e-5); use float32 or float64 with tree targets"
        )
    if not any(adapter.greedy_tree is not None for adapter in adapters):
        greedy_tree = []
    selected = tuple(c for c in STATISTICAL_CHAIN_CHECK_IDS if config.selects(c))
    n_assertions = len(chain_targets) * sum(
        count_statistical_assertions(case, rows_per_call(case), selected)
        for case in chain
        if selected
    )
    selected_tree = tuple(c for c in STATISTICAL_TREE_CHECK_IDS if config.selects(c))
    if selected_tree:
        n_assertions += len(tree_targets) * sum(
            tree_assertions(case).count(selected_tree) for case in tree
        )
        n_assertions += sum(
            tree_assertions(case).count(selected_tree)
            for cases in serving_trees.values()
            for case in cases
        )
    if any(config.selects(c) for c in STATISTICAL_SERVING_CHECK_IDS):
        n_assertions += len(serving_targets) * sum(
            serving_assertion_count(case) for case in serving
        )
    if config.selects(SEQUENCE_LAW_CHECK_ID):
        # One identity test per sampled end-to-end target; greedy and drafts-accepted are exact.
        n_assertions += sum(not t.greedy for entries in end_to_end.values() for t in entries)
    # The run-level test of a target's law p-values: one assertion per target that makes law
    # or sequence-law tests (it is SKIPPED when too few come out usable, and still counted).
    pvalues_targets = tuple(
        adapter.name
        for adapter in adapters
        if config.selects(PVALUES_CHECK_ID)
        and (
            (adapter.chain is not None and chain and config.selects(LAW_CHECK_ID))
            or (
                config.selects(SEQUENCE_LAW_CHECK_ID)
                and any(not t.greedy for t in end_to_end.get(adapter.name, []))
            )
        )
    )
    n_assertions += len(pvalues_targets)
    with_device = config.device_checks and device_note is None
    device_alpha = config.family_wise_alpha / (len(adapters) + 1) if with_device else 0.0
    budget = ErrorBudget(max(1, n_assertions), config.family_wise_alpha - device_alpha)
    alpha = budget.per_assertion_alpha
    share = SEQUENTIAL_ALPHA_SHARE if config.early_stop else 0.0
    chain_alpha = split_alpha(alpha, share).fixed
    case_plans = {case.case_id: _chain_case_plan(case, config, chain_alpha) for case in chain}
    tree_plans = {
        case.case_id: _tree_case_plan(case, config, chain_alpha)
        for case in (*tree, *serving_tree_cases.values())
    }
    e2e_plans: dict[str, list[EndToEndPlan]] = {}
    for adapter in adapters:
        if adapter.name in end_to_end:
            # Planning asks each engine for its law: one engine at a time holds memory.
            try:
                e2e_plans[adapter.name] = [
                    plan_end_to_end(target, config, alpha) for target in end_to_end[adapter.name]
                ]
            finally:
                release_engine(adapter)
    if not config.suite:
        suite_targets: list[str] = []
    elif config.suite_targets is None:
        suite_targets = [a.name for a in adapters if a.chain is not None or a.greedy is not None]
    else:
        # Suite targets that are not loaded run targets are dropped (the device defaults name
        # ``reference``, which ``--targets`` may leave out); the CLI rejects explicit unknowns.
        suite_targets = [name for name in config.suite_targets if name in names]
    units: list[Unit] = []

    def add(kind: UnitKind, target: str, case_id: str = "", chunk: int = 0, steps: int = 0) -> None:
        units.append(Unit(len(units), kind, target, case_id, chunk, steps))

    for adapter in adapters:
        if adapter.chain is not None:
            for case in chain:
                grid = case_plans[case.case_id]
                for chunk in range(grid.n_chunks):
                    add(UnitKind.CHAIN, adapter.name, case.case_id, chunk, grid.chunk_size(chunk))
        if adapter.greedy is not None:
            for greedy_case in greedy:
                add(UnitKind.GREEDY, adapter.name, greedy_case.case_id)
        if adapter.tree is not None:
            for tree_case in tree:
                steps = tree_plans[tree_case.case_id].n_steps
                add(UnitKind.TREE, adapter.name, tree_case.case_id, 0, steps)
        for serving_tree_case in serving_trees.get(adapter.name, []):
            steps = tree_plans[serving_tree_case.case_id].n_steps
            add(UnitKind.TREE, adapter.name, serving_tree_case.case_id, 0, steps)
        if adapter.greedy_tree is not None:
            for greedy_tree_case in greedy_tree:
                add(UnitKind.GREEDY_TREE, adapter.name, greedy_tree_case.case_id)
        if adapter.serving is not None:
            for serving_case in serving:
                # No sequential test watches a serving case: its whole level is fixed-n.
                steps = _serving_steps(adapter, serving_case, config, alpha)
                add(UnitKind.SERVING, adapter.name, serving_case.case_id, 0, steps)
            if config.selects(SEED_CONTRACT_CHECK_ID) and (
                not config.cases or SEED_CONTRACT_CASE_ID in config.cases
            ):
                add(UnitKind.SEED_CONTRACT, adapter.name, SEED_CONTRACT_CASE_ID)
        for entry in e2e_plans.get(adapter.name, []):
            add(UnitKind.END_TO_END, adapter.name, entry.target.name)
    if with_device:
        add(UnitKind.DEVICE, config.device)
    for name in suite_targets:
        add(UnitKind.SUITE, name)
    record = PlanRecord(
        plan_version=PLAN_VERSION,
        config=config,
        targets=tuple(
            (a.name, a.description, declared_verification(a.chain)) for a in adapters
        ),
        unavailable=tuple((t.name, t.reason, t.named) for t in unavailable),
        chain_cases=case_plans,
        greedy_cases={case.case_id: case.case_hash for case in greedy},
        tree_cases=tree_plans,
        greedy_tree_cases={case.case_id: case.case_hash for case in greedy_tree},
        serving_cases={case.case_id: case.case_hash for case in serving},
        n_assertions=budget.n_assertions,
        battery_alpha=budget.family_wise_alpha,
        device_alpha=device_alpha,
        device_steps=max(1, math.ceil(DEVICE_CI_STEPS * config.step_multiplier)),
        device_note=None
        if with_device
        else (device_note if config.device_checks else "device checks not requested"),
        suite_targets=tuple(suite_targets),
        units=tuple(units),
        sequential_share=share,
        pvalues_targets=pvalues_targets,
        declarations=tuple(
            (a.name, a.exclusions, a.expected_verdict, a.expected_reason)
            for a in adapters
            if a.exclusions is not None or a.expected_verdict is not None
        ),
    )
    return RunPlan(
        record, adapters, chain, greedy, e2e_plans, [*tree, *serving_tree_cases.values()],
        greedy_tree, serving,
    )


DEVICE_CHECKS_MODULE = "losslessness.engine.device"
"""Where the device-check unit's ``run_device_checks`` lives (imported on use: torch CUDA
and the GPU adapters load there)."""


def load_device_checks() -> tuple[Callable[..., Any] | None, str | None]:
    """``run_device_checks`` of :data:`DEVICE_CHECKS_MODULE`, or None and why it is missing."""
    try:
        module = importlib.import_module(DEVICE_CHECKS_MODULE)
    except ImportError as error:
        return None, f"{DEVICE_CHECKS_MODULE} does not import: {error}"
    function = getattr(module, "run_device_checks", None)
    if function is None:
        return None, f"{DEVICE_CHECKS_MODULE} has no run_device_checks"
    checks: Callable[..., Any] = function
    return checks, None


def make_plan(config: RunConfig, greedy: bool = False) -> RunPlan:
    """Resolve ``config.targets`` (every registered adapter when empty), look for the device
    checks when the config asks for them, and plan the run.

    Raises:
        ValueError: unknown or repeated target names, or unknown case ids.
    """
    note = load_device_checks()[1] if config.device_checks else None
    return plan_run(config, resolve_targets(config.targets, greedy=greedy), note)


__all__ = [
    "DEVICE_CHECKS_MODULE",
    "DEVICE_CI_STEPS",
    "MIN_STEPS",
    "PLAN_VERSION",
    "CasePlan",
    "ChainCasePlan",
    "PlanRecord",
    "RunPlan",
    "TreeCasePlan",
    "Unit",
    "UnitKind",
    "WarmUp",
    "case_file_of",
    "end_to_end_check_ids",
    "load_device_checks",
    "make_plan",
    "plan_case",
    "plan_run",
    "select_cases",
    "select_serving_cases",
    "select_tree_cases",
]
