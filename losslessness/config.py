"""The design every run states: the statistical design (TV, family-wise rate, power, seed) and
what the run covers (checks, cases, step multiplier, chunking, device checks, property suite).

One :class:`RunConfig` serves the audit (a one-shard run of the CI plan's steps) and the nightly
(the same run at a multiple of the CI plan's steps, the step multiplier, in chunks and shards);
:meth:`RunConfig.nightly` gives the nightly's defaults per device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from losslessness.cases import CHAIN_INPUT_DTYPES
from losslessness.stats import DEFAULT_FAMILY_WISE_ALPHA

MIN_CONDITION_VOCAB = 8
"""Smallest ``--vocab-size``: the LM-like cases need a few tokens below the peak."""

DEFAULT_TIMEOUT_S = 300.0
"""Seconds one call of a target may take before it counts as hung (``--timeout``): well above
the slowest legitimate call seen here (the transformers adapter, one batch row at a time, about
7 ms per row on 2 cores, calls of up to a few thousand rows)."""

CHUNK_STEPS = 1 << 14
"""Most verification steps per chain chunk (per row type) of a nightly run."""

DEVICES = ("cpu", "cuda")
"""Devices the device checks run on."""

SUITE_PROFILES = ("dev", "ci", "nightly")
"""Hypothesis profiles of the property suite."""

CLI_FLAGS = {
    "tv": "--tv",
    "family_wise_alpha": "--alpha",
    "power": "--power",
    "seed": "--seed",
    "only": "--only",
    "cases": "--case",
    "max_steps": "--max-steps",
    "steps": "--steps",
    "step_multiplier": "--budget",
    "chunk_steps": "--chunk-steps",
    "timeout_s": "--timeout",
    "targets": "--targets",
    "device": "--device",
    "suite_profile": "--suite-profile",
    "suite_targets": "--suite-targets",
    "early_stop": "--early-stop",
    "time_budget_s": "--time-budget",
    "vocab_size": "--vocab-size",
    "batch_size": "--batch-size",
    "dtype": "--dtype",
    "case_file": "--case-file",
}
"""The command-line flag that sets each :class:`RunConfig` field (the validation errors name
the field; the commands report the flag, :func:`flag_of_error`)."""


def flag_of_error(
    message: str, flags: Mapping[str, str] = CLI_FLAGS
) -> tuple[str | None, str]:
    """Split a :class:`RunConfig` validation or planning message (``"field: what is wrong"``)
    into the command-line flag of its field (None when the field has no flag in ``flags``) and
    the rest, with every other field name it mentions replaced by its flag.

    Args:
        message: the error's text. flags: field -> flag (:data:`CLI_FLAGS`, or a command's
            own where it differs).
    """
    field_name, separator, rest = message.partition(": ")
    flag = flags.get(field_name) if separator else None
    text = rest if flag is not None else message
    for name, other in flags.items():
        text = text.replace(f"with {name} ", f"with {other} ")
    return flag, text


RENAMED_FIELDS = {"budget": "step_multiplier"}
"""Old name -> field of :class:`RunConfig`, for records written before a rename (report schema
version 2 and plan version 4 called the step multiplier ``budget``)."""


@dataclass(frozen=True)
class DeviceDefaults:
    """What a night on one device runs unless told otherwise.

    Attributes:
        step_multiplier: multiple of the CI plan's verification steps the night runs.
        suite_profile: Hypothesis profile of the property suite.
        suite_targets: targets the property suite runs on; None means every night target.
    """

    step_multiplier: float
    suite_profile: str
    suite_targets: tuple[str, ...] | None


DEVICE_DEFAULTS = {
    "cuda": DeviceDefaults(step_multiplier=10.0, suite_profile="nightly", suite_targets=None),
    # Reduced for a CPU machine: the transformers adapter calls one batch row at a time
    # (about 7 ms per verification step on 2 cores), so 10x the CI plan would take hours; and
    # the suite's nightly profile takes about 10 minutes of wall time on the reference alone.
    "cpu": DeviceDefaults(step_multiplier=0.05, suite_profile="ci", suite_targets=("reference",)),
}
"""Nightly defaults by device (step multiplier ``--budget``, suite profile, suite targets). The
CPU defaults are a smoke-sized night; GPU machines run 10x the CI plan."""


@dataclass(frozen=True)
class RunDesign:
    """The statistical design every run states.

    Attributes:
        tv: design TV distance eps: each identity test detects TV >= eps with ``power``.
        family_wise_alpha: probability that a correct target gets any false alarm in the run.
        power: design power 1 - beta.
        seed: the run seed; every case's (chunk's) seed derives from it.

    Raises:
        ValueError: naming the field, for values out of range.
    """

    tv: float = 0.05
    family_wise_alpha: float = DEFAULT_FAMILY_WISE_ALPHA
    power: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.tv <= 1:
            raise ValueError(f"tv: must lie in (0, 1], got {self.tv}")
        if not 0 < self.family_wise_alpha < 1:
            raise ValueError(f"family_wise_alpha: must lie in (0, 1), got {self.family_wise_alpha}")
        if not 0 < self.power < 1:
            raise ValueError(f"power: must lie in (0, 1), got {self.power}")


@dataclass(frozen=True)
class RunConfig(RunDesign):
    """Design of one run: :class:`RunDesign`, then what it covers.

    Attributes:
        only: check ids to run (``law``, ``acceptance``, ``structure``, ``greedy``, ``edge``
            for every ``edge.*``, ``sequence-law``, ``sequence-greedy``, ``drafts-accepted``);
            empty runs all.
        cases: case ids (battery cases, end-to-end target names) to run; empty runs all.
        max_steps: cap on the CI plan's verification steps per case and row type, and on the
            sequences generated per end-to-end target (before ``step_multiplier``).
        steps: when set, every case uses exactly this many steps (every end-to-end target this
            many sequences: replays), overriding the plan and the step multiplier.
        step_multiplier: multiple of the CI plan's steps the run draws (``--budget``; 1 for an
            audit, 10 to 100 on a GPU night, below 1 for smoke runs).
        chunk_steps: most steps per chain chunk; None samples every case in one chunk (the
            audit). Chunks are what shards split; they never change a check's statistics.
        timeout_s: seconds one call of a target may take; a longer call is an ERROR for its
            check and the target's remaining work is skipped (also ERROR).
        targets: target names of a night (empty: every registered adapter that loads); an
            audit names its targets directly.
        device: ``cpu`` or ``cuda``: where the device checks run.
        device_checks: whether the run has a device-check unit (coupling, precision).
        suite: whether the run has property-suite units.
        suite_profile: the suite's Hypothesis profile (``dev``, ``ci``, ``nightly``).
        suite_targets: targets the suite runs on; None means every target with a chain or
            greedy verifier.
        early_stop: sequential LOSSY detection: each chain assertion's level is split
            between an e-process, looked at after every verifier call, and the fixed-n test
            (:data:`~losslessness.stats.sequential.SEQUENTIAL_ALPHA_SHARE`); a case stops as
            soon as an e-value crosses or an exact check fires, and the other cases of its
            target stop with it. False gives the whole level to the fixed-n test and samples
            every planned step (the fixed design).
        time_budget_s: seconds the run may sample for (``--time-budget``): a warm-up measures
            every target's throughput and the design TV is raised until the plan fits
            (:mod:`losslessness.engine.time_budget`); sampling stops at the budget. None: no
            budget.
        vocab_size: build the chain cases at this vocabulary size V (``--vocab-size``,
            :func:`losslessness.batteries.chain.chain_battery_at_vocab`); None: the battery.
        batch_size: rows per verifier call of every chain case (``ChainCase.call_batch_size``)
            and trees per call of every tree case (``--batch-size``); None: each case's own.
        dtype: the input dtype of every chain case (``--dtype``, a key of
            :data:`losslessness.cases.CHAIN_INPUT_DTYPES`); None: each case's own.
        case_file: the path of a TOML case file whose chain, tree and serving cases the run
            adds to the battery's (``--case-file``, docs/case-file.md,
            :mod:`losslessness.batteries.case_file`); None: the battery alone. The plan reads
            it (each shard process again) and carries its cases by value.
        dropped_cases: cases the time budget's fit dropped as too slow (set by the fit, never
            by a user): the planned assertions did not all run, so no target can be LOSSLESS
            (:func:`losslessness.results.design_shortfalls`).

    Raises:
        ValueError: naming the field, for values out of range.
    """

    only: tuple[str, ...] = ()
    cases: tuple[str, ...] = ()
    max_steps: int = 200_000
    steps: int | None = None
    step_multiplier: float = 1.0
    chunk_steps: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    targets: tuple[str, ...] = ()
    device: str = "cpu"
    device_checks: bool = False
    suite: bool = False
    suite_profile: str = "ci"
    suite_targets: tuple[str, ...] | None = None
    early_stop: bool = True
    time_budget_s: float | None = None
    vocab_size: int | None = None
    batch_size: int | None = None
    dtype: str | None = None
    case_file: str | None = None
    dropped_cases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.time_budget_s is not None and not (
            math.isfinite(self.time_budget_s) and self.time_budget_s > 0
        ):
            raise ValueError(
                f"time_budget_s: must be a positive number of seconds, got {self.time_budget_s}"
            )
        if self.time_budget_s is not None and self.steps is not None:
            raise ValueError(
                "time_budget_s: cannot be combined with steps (a run with fixed steps, such as "
                "a replay, draws exactly those; the time budget chooses them)"
            )
        if self.max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1, got {self.max_steps}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps: must be >= 1, got {self.steps}")
        if not (math.isfinite(self.step_multiplier) and self.step_multiplier > 0):
            raise ValueError(
                f"step_multiplier: must be a positive number, got {self.step_multiplier}"
            )
        if self.chunk_steps is not None and self.chunk_steps < 1:
            raise ValueError(f"chunk_steps: must be >= 1, got {self.chunk_steps}")
        if not self.timeout_s > 0:
            raise ValueError(
                f"timeout_s: must be a positive number of seconds, got {self.timeout_s}"
            )
        if self.vocab_size is not None and self.vocab_size < MIN_CONDITION_VOCAB:
            raise ValueError(
                f"vocab_size: must be >= {MIN_CONDITION_VOCAB}, got {self.vocab_size}"
            )
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.dtype is not None and self.dtype not in CHAIN_INPUT_DTYPES:
            raise ValueError(
                f"dtype: must be one of {', '.join(CHAIN_INPUT_DTYPES)}, got {self.dtype!r}"
            )
        if self.case_file is not None and not self.case_file:
            raise ValueError("case_file: must be a path, got an empty string")
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {DEVICES}, got {self.device!r}")
        if self.suite_profile not in SUITE_PROFILES:
            raise ValueError(
                f"suite_profile: must be one of {SUITE_PROFILES}, got {self.suite_profile!r}"
            )

    def selects(self, check_id: str) -> bool:
        """Whether ``check_id`` is among the checks to run (``edge`` selects every ``edge.*``)."""
        return not self.only or any(
            check_id == name or check_id.startswith(name + ".") for name in self.only
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunConfig:
        """The config of a JSON record's ``config`` object (arrays back to tuples; fields under
        an old name of :data:`RENAMED_FIELDS` read as the new one, so earlier nights' records
        still load).

        Raises:
            TypeError: unknown or missing fields. ValueError: values out of range.
        """
        values: dict[str, Any] = {
            RENAMED_FIELDS.get(key, key): tuple(value) if isinstance(value, list) else value
            for key, value in data.items()
        }
        return cls(**values)

    @classmethod
    def nightly(cls, device: str = "cpu", **overrides: Any) -> RunConfig:
        """The nightly config on ``device``: :data:`DEVICE_DEFAULTS` of the device, chunks of
        :data:`CHUNK_STEPS`, device checks and the property suite on, no early stop (every
        planned step is sampled: N shards merge into exactly the one-process run, and trends
        compare full samples), then ``overrides`` (fields given as None keep the default).

        Raises:
            ValueError: unknown device, or a field out of range.
        """
        if device not in DEVICE_DEFAULTS:
            raise ValueError(f"device: must be one of {DEVICES}, got {device!r}")
        defaults = DEVICE_DEFAULTS[device]
        values: dict[str, Any] = {
            "device": device,
            "step_multiplier": defaults.step_multiplier,
            "chunk_steps": CHUNK_STEPS,
            "device_checks": True,
            "suite": True,
            "suite_profile": defaults.suite_profile,
            "suite_targets": defaults.suite_targets,
            "early_stop": False,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


AuditConfig = RunConfig
"""The name the audit's API and records have always used for :class:`RunConfig`."""
