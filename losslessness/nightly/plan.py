"""The nightly plan: which targets, cases and chunks one night samples, and its error budget.

A night is a fixed grid of *units*, decided before any sample is drawn and independent of how
the night is split into shards:

- ``chain``: one chunk of one battery case on one target. A case's verification steps are the
  CI plan's (:func:`losslessness.checks.plan_case` at the night's per-assertion level) times
  the budget, cut into chunks of at most :data:`CHUNK_STEPS` steps; chunk ``j`` is sampled from
  ``derive_seed(run seed, "nightly", target, case hash, j)``, so the grid alone decides every
  sample;
- ``greedy``: one greedy case on one target (exact, deterministic);
- ``end-to-end``: the end-to-end engines of one adapter (the sequence-law checks);
- ``device``: :func:`losslessness.engine.device.run_device_checks` on the night's device;
- ``suite``: the property suite on one target (a pytest subprocess).

The family-wise false-alarm rate of the battery and device checks is one Bonferroni budget,
fixed here for the whole night: the device checks get the share of one more target
(``alpha / (targets + 1)``), the rest is split evenly over every statistical assertion of the
battery (chain cases and sequence-law tests of every target). The property suite spends its own
documented rate (:data:`losslessness.suite.SUITE_FAMILY_WISE_ALPHA` per target); by the union
bound the night's total rate is at most the sum of the two, which the report states.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from losslessness.adapters import (
    Adapter,
    AdapterNotFound,
    AdapterUnavailable,
    registered_adapters,
    resolve_adapter,
)
from losslessness.audit import AuditConfig, RunDesign, UnavailableTarget
from losslessness.checks import (
    ChainCase,
    GreedyCase,
    count_statistical_assertions,
    default_chain_battery,
    default_greedy_battery,
    plan_case,
)
from losslessness.checks.sampling import rows_per_call
from losslessness.nightly.shards import UnitRecord
from losslessness.stats import ErrorBudget

PLAN_VERSION = "1"
"""Version of the plan layout; shards of different versions never merge."""

CHUNK_STEPS = 1 << 14
"""Most verification steps per chain chunk (per row type)."""

CI_MAX_STEPS = AuditConfig().max_steps
"""The CI audit's cap on steps per case; the night's cap is this times the budget."""

DEVICE_CI_STEPS = 20_000
"""Steps per case and row type of the device checks at budget 1."""

DEVICES = ("cpu", "cuda")
"""Devices ``--device`` accepts."""

UNIT_KINDS = ("chain", "greedy", "end-to-end", "device", "suite")
"""Kinds of work unit, in grid order within a target."""


@dataclass(frozen=True)
class DeviceDefaults:
    """What a night on one device runs unless told otherwise.

    Attributes:
        budget: multiplier of the CI plan's verification steps.
        suite_profile: Hypothesis profile of the property suite.
        suite_targets: targets the property suite runs on; None means every night target.
    """

    budget: float
    suite_profile: str
    suite_targets: tuple[str, ...] | None


DEVICE_DEFAULTS = {
    "cuda": DeviceDefaults(budget=10.0, suite_profile="nightly", suite_targets=None),
    # Reduced for a CPU machine: the transformers adapter calls one batch row at a time
    # (about 7 ms per verification step on 2 cores), so 10x the CI plan would take hours; and
    # the suite's nightly profile takes about 10 minutes of wall time on the reference alone.
    "cpu": DeviceDefaults(budget=0.05, suite_profile="ci", suite_targets=("reference",)),
}
"""Defaults of :class:`NightlyConfig` fields by device (``--budget``, suite profile, suite
targets). The CPU defaults are a smoke-sized night; GPU machines run 10x the CI plan."""


@dataclass(frozen=True)
class NightlyConfig(RunDesign):
    """Design of one night: :class:`~losslessness.audit.RunDesign` (``tv`` and ``power`` of the
    CI plan the budget multiplies; ``family_wise_alpha`` over the battery and the device checks
    together; ``seed``: every chunk's seed derives from it), then

    Attributes:
        budget: multiplier of the CI plan's verification steps (> 0; 10 to 100 on a GPU
            machine, below 1 for smoke runs).
        device: ``cpu`` or ``cuda``: where the device checks run.
        targets: target names; empty means every registered adapter that loads.
        cases: battery case ids (chain and greedy) to run; empty runs the whole battery.
        device_checks: whether the device checks run (when they import).
        suite: whether the property suite runs.
        suite_profile: its Hypothesis profile (``dev``, ``ci``, ``nightly``).
        suite_targets: targets it runs on; None means every night target with a chain or
            greedy verifier.
        max_chunk_steps: most steps per chain chunk.

    Raises:
        ValueError: naming the field, for values out of range.
    """

    budget: float = DEVICE_DEFAULTS["cuda"].budget
    device: str = "cpu"
    targets: tuple[str, ...] = ()
    cases: tuple[str, ...] = ()
    device_checks: bool = True
    suite: bool = True
    suite_profile: str = "nightly"
    suite_targets: tuple[str, ...] | None = None
    max_chunk_steps: int = CHUNK_STEPS

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"budget: must be a positive number, got {self.budget}")
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {DEVICES}, got {self.device!r}")
        if self.suite_profile not in ("dev", "ci", "nightly"):
            raise ValueError(
                f"suite_profile: must be dev, ci or nightly, got {self.suite_profile!r}"
            )
        if self.max_chunk_steps < 2 or self.max_chunk_steps % 2:
            raise ValueError(
                f"max_chunk_steps: must be an even number >= 2 (steps are paired), "
                f"got {self.max_chunk_steps}"
            )

    @classmethod
    def for_device(cls, device: str = "cpu", **overrides: Any) -> NightlyConfig:
        """The config with :data:`DEVICE_DEFAULTS` of ``device``, then ``overrides`` (fields
        given as None keep the device default).

        Raises:
            ValueError: unknown device, or a field out of range.
        """
        if device not in DEVICE_DEFAULTS:
            raise ValueError(f"device: must be one of {DEVICES}, got {device!r}")
        defaults = DEVICE_DEFAULTS[device]
        values: dict[str, Any] = {
            "device": device,
            "budget": defaults.budget,
            "suite_profile": defaults.suite_profile,
            "suite_targets": defaults.suite_targets,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


@dataclass(frozen=True)
class ChainCasePlan:
    """The chunk grid of one chain case (the same for every target).

    Attributes:
        case_id, case_hash: the case.
        ci_steps: steps per row type the CI audit plans at the night's per-assertion level.
        n_steps: the night's steps per row type: ``ci_steps * budget``, rounded up to even.
        chunk_steps: steps per chunk (the last chunk may be shorter). Even, and at most one
            verifier call's worth (:func:`losslessness.checks.sampling.rows_per_call`), so the
            paired steps of the independence check always shared a call.
        capped: the CI plan was capped (its minimum detectable TV exceeds the design TV).
    """

    case_id: str
    case_hash: str
    ci_steps: int
    n_steps: int
    chunk_steps: int
    capped: bool

    @property
    def n_chunks(self) -> int:
        """Number of chunks."""
        return -(-self.n_steps // self.chunk_steps)

    def chunk_size(self, chunk: int) -> int:
        """Steps of chunk ``chunk`` (every chunk but the last has ``chunk_steps``)."""
        if not 0 <= chunk < self.n_chunks:
            raise ValueError(f"chunk: must lie in [0, {self.n_chunks}), got {chunk}")
        return min(self.chunk_steps, self.n_steps - chunk * self.chunk_steps)


@dataclass(frozen=True)
class Unit:
    """One indivisible piece of the night's work.

    Attributes:
        index: position in the grid; shard ``i/N`` runs the units with ``index % N == i``.
        kind: one of :data:`UNIT_KINDS`.
        target: the target's name (the device for ``device`` units).
        case_id: the battery case (chain, greedy), else empty.
        chunk: the chunk index (chain), else 0.
        steps: verification steps per row type of the chunk (chain), else 0.
    """

    index: int
    kind: str
    target: str
    case_id: str = ""
    chunk: int = 0
    steps: int = 0

    @property
    def key(self) -> str:
        """``kind/target/case/chunk``: names the unit in files and errors."""
        return f"{self.kind}/{self.target}/{self.case_id}/{self.chunk}"

    def record(self) -> UnitRecord:
        """An empty :class:`UnitRecord` of this unit."""
        return UnitRecord(self.index, self.key, self.kind, self.target, self.case_id, self.chunk)


@dataclass
class NightlyPlan:
    """Everything decided before sampling.

    Attributes:
        config: the design.
        targets: adapters that loaded, in grid order.
        unavailable: requested or registered targets that did not load, with reasons.
        chain_cases, greedy_cases: the battery.
        case_plans: chunk grid of each chain case, by case id.
        budget: the battery's Bonferroni split (assertions, family-wise rate).
        device_alpha: family-wise rate given to the device checks (0 without them).
        device_steps: steps per case of the device checks.
        device_note: why there is no device unit, if there is none.
        end_to_end_assertions: statistical assertions of each adapter's end-to-end engines.
        suite_targets: targets the property suite runs on.
        units: the grid.
    """

    config: NightlyConfig
    targets: list[Adapter]
    unavailable: list[UnavailableTarget]
    chain_cases: list[ChainCase]
    greedy_cases: list[GreedyCase]
    case_plans: dict[str, ChainCasePlan]
    budget: ErrorBudget
    device_alpha: float
    device_steps: int
    device_note: str | None
    end_to_end_assertions: dict[str, int]
    suite_targets: list[str]
    units: list[Unit] = field(default_factory=list)

    def adapter(self, name: str) -> Adapter:
        """The loaded adapter called ``name``.

        Raises:
            KeyError: no loaded target has that name.
        """
        for adapter in self.targets:
            if adapter.name == name:
                return adapter
        raise KeyError(f"target: {name!r} is not a loaded target of this plan")

    def describe(self) -> dict[str, Any]:
        """JSON-able description of everything that decides the night's samples and budget;
        two shards merge only when their descriptions are equal."""
        return {
            "plan_version": PLAN_VERSION,
            "config": dataclasses.asdict(self.config),
            "targets": [adapter.name for adapter in self.targets],
            "unavailable": [target.name for target in self.unavailable],
            "chain_cases": {
                case_id: dataclasses.asdict(plan) for case_id, plan in self.case_plans.items()
            },
            "greedy_cases": {case.case_id: case.case_hash for case in self.greedy_cases},
            "n_assertions": self.budget.n_assertions,
            "battery_alpha": self.budget.family_wise_alpha,
            "device_alpha": self.device_alpha,
            "device_steps": self.device_steps,
            "end_to_end_assertions": dict(self.end_to_end_assertions),
            "suite_targets": list(self.suite_targets),
            "units": len(self.units),
        }

    @property
    def fingerprint(self) -> str:
        """SHA-256 of :meth:`describe` as canonical JSON."""
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


DeviceChecks = Callable[..., Any]
"""``run_device_checks(device, n_steps, seed, family_wise_alpha) -> (results, unavailable)``."""


def load_device_checks() -> tuple[DeviceChecks | None, str | None]:
    """``losslessness.engine.device.run_device_checks``, or None and why it is missing."""
    try:
        module = importlib.import_module("losslessness.engine.device")
    except ImportError as error:
        return None, f"losslessness.engine.device does not import: {error}"
    function = getattr(module, "run_device_checks", None)
    if function is None:
        return None, "losslessness.engine.device has no run_device_checks"
    checks: DeviceChecks = function
    return checks, None


def resolve_targets(names: Sequence[str]) -> tuple[list[Adapter], list[UnavailableTarget]]:
    """Load the night's targets: ``names``, or every registered adapter when empty.

    Returns:
        (adapters that loaded, in order; targets that did not, with the reason).

    Raises:
        ValueError: a name that matches nothing (``targets``), or repeated names.
    """
    wanted = list(names) or sorted(registered_adapters())
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"targets: names repeat: {wanted}")
    loaded: list[Adapter] = []
    unavailable: list[UnavailableTarget] = []
    for name in wanted:
        try:
            loaded.append(resolve_adapter(name))
        except AdapterNotFound as error:
            raise ValueError(f"targets: {error}") from error
        except AdapterUnavailable as error:
            unavailable.append(UnavailableTarget(name, str(error)))
    return loaded, unavailable


def _chunk_steps(case: ChainCase, cap: int) -> int:
    per_call = rows_per_call(case)
    if per_call < 2:
        # No two copies of a row share a call: the independence check does not apply, and
        # each chunk is simply ``cap`` steps.
        return cap
    return min(cap, per_call - per_call % 2)


def plan_night(
    config: NightlyConfig,
    targets: Sequence[Adapter],
    unavailable: Sequence[UnavailableTarget] = (),
    device_checks_available: bool = True,
    device_note: str | None = None,
) -> NightlyPlan:
    """Count the night's assertions, split its budget, size every case and lay out the grid.

    Args:
        config: the design.
        targets: loaded adapters (see :func:`resolve_targets`).
        unavailable: targets that did not load (recorded in the plan).
        device_checks_available: whether ``run_device_checks`` can be called.
        device_note: why it cannot, when it cannot.

    Returns:
        :class:`NightlyPlan`.

    Raises:
        ValueError: repeated target names, or unknown case ids.
    """
    names = [adapter.name for adapter in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"targets: names repeat: {names}")
    chain_cases = default_chain_battery()
    greedy_cases = default_greedy_battery()
    if config.cases:
        known = [case.case_id for case in chain_cases]
        known += [case.case_id for case in greedy_cases]
        unknown = sorted(set(config.cases) - set(known))
        if unknown:
            raise ValueError(f"cases: unknown case ids {unknown}; known: {known}")
        chain_cases = [case for case in chain_cases if case.case_id in config.cases]
        greedy_cases = [case for case in greedy_cases if case.case_id in config.cases]
    chain_targets = [adapter for adapter in targets if adapter.chain is not None]
    e2e = {
        adapter.name: sum(not engine.greedy for engine in adapter.end_to_end)
        for adapter in targets
        if adapter.end_to_end
    }
    n_assertions = len(chain_targets) * sum(
        count_statistical_assertions(case) for case in chain_cases
    ) + sum(e2e.values())
    with_device = config.device_checks and device_checks_available
    n_shares = len(targets) + 1
    device_alpha = config.family_wise_alpha / n_shares if with_device else 0.0
    budget = ErrorBudget(max(1, n_assertions), config.family_wise_alpha - device_alpha)
    case_plans = {}
    for case in chain_cases:
        ci = plan_case(case, config.tv, budget.per_assertion_alpha, config.power, CI_MAX_STEPS)
        steps = max(2, math.ceil(ci.n_steps * config.budget))
        steps += steps % 2
        case_plans[case.case_id] = ChainCasePlan(
            case.case_id,
            case.case_hash,
            ci.n_steps,
            steps,
            _chunk_steps(case, config.max_chunk_steps),
            ci.capped,
        )
    if config.suite_targets is None:
        suite_targets = [a.name for a in targets if a.chain is not None or a.greedy is not None]
    else:
        # Suite targets that are not loaded night targets are dropped (the device defaults name
        # ``reference``, which ``--targets`` may leave out); the CLI rejects explicit unknowns.
        suite_targets = [name for name in config.suite_targets if name in names]
    if not config.suite:
        suite_targets = []
    units: list[Unit] = []

    def add(kind: str, target: str, case_id: str = "", chunk: int = 0, steps: int = 0) -> None:
        units.append(Unit(len(units), kind, target, case_id, chunk, steps))

    for adapter in targets:
        if adapter.chain is not None:
            for case in chain_cases:
                grid = case_plans[case.case_id]
                for chunk in range(grid.n_chunks):
                    add("chain", adapter.name, case.case_id, chunk, grid.chunk_size(chunk))
        if adapter.greedy is not None:
            for greedy_case in greedy_cases:
                add("greedy", adapter.name, greedy_case.case_id)
        if adapter.end_to_end:
            add("end-to-end", adapter.name)
    if with_device:
        add("device", config.device)
    for name in suite_targets:
        add("suite", name)
    return NightlyPlan(
        config=config,
        targets=list(targets),
        unavailable=list(unavailable),
        chain_cases=chain_cases,
        greedy_cases=greedy_cases,
        case_plans=case_plans,
        budget=budget,
        device_alpha=device_alpha,
        device_steps=max(1, math.ceil(DEVICE_CI_STEPS * config.budget)),
        device_note=None
        if with_device
        else (device_note if config.device_checks else "device checks not requested"),
        end_to_end_assertions=e2e,
        suite_targets=suite_targets,
        units=units,
    )


def make_plan(config: NightlyConfig) -> NightlyPlan:
    """Resolve the targets, look for the device checks, and plan the night.

    Raises:
        ValueError: unknown or repeated target names, or unknown case ids.
    """
    targets, unavailable = resolve_targets(config.targets)
    _, note = load_device_checks()
    return plan_night(config, targets, unavailable, note is None, note)


__all__ = [
    "CHUNK_STEPS",
    "CI_MAX_STEPS",
    "DEVICES",
    "DEVICE_CI_STEPS",
    "DEVICE_DEFAULTS",
    "PLAN_VERSION",
    "UNIT_KINDS",
    "ChainCasePlan",
    "DeviceDefaults",
    "NightlyConfig",
    "NightlyPlan",
    "Unit",
    "load_device_checks",
    "make_plan",
    "plan_night",
    "resolve_targets",
]
