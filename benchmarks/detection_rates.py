"""Detection and false-alarm rates of our audit and of the peers' tests at equal sample budgets.

For every entry of the mutant zoo (``losslessness.zoo.MUTANTS``: lossy mutants
and lossless controls) and every budget of n verification steps, each method decides on the
same n steps of the entry's own case, over many seeds:

- ``ours``: the chain checks (structure, conditional law at every position including the
  bonus, acceptance, edges, independence; ``run_chain_checks``) at the default family-wise
  false-alarm rate 1e-3, Bonferroni-split over that case's statistical assertions; the greedy
  check for greedy entries;
- the peers' tests of :mod:`benchmarks.peers` (vLLM histogram L2, vLLM chi-square,
  TensorRT-LLM KL, FlashInfer structure).

The budgets of one seed are nested prefixes of one run of ``max(budgets)`` steps (steps are
independent, so a prefix of n steps is distributed as an n-step run); different seeds are
independent runs. The lossless controls are also run over ``--false-alarm-seeds`` seeds at
``--false-alarm-budget`` steps, for the false-alarm rates with Clopper-Pearson intervals.

    PYTHONPATH=. python benchmarks/detection_rates.py          # writes docs/detection-rates.md
    PYTHONPATH=. python benchmarks/detection_rates.py --seeds 5 --false-alarm-seeds 20 \
        --out /tmp/detection-rates.md

Run from the repository root. The default run (``--jobs 2``) took 5 minutes on two cores
shared with other jobs (load average ~3.5); under heavy load (~10) expect up to 30.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import multiprocessing
import platform
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import numpy as np
import scipy.stats
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from statsmodels.stats.proportion import proportion_confint

from benchmarks.peers import (
    flashinfer_structure,
    trtllm_kl,
    vllm_chi_square,
    vllm_histogram_l2,
)
from losslessness.cases import ChainCase, GreedyCase
from losslessness.checks import check_greedy, count_statistical_assertions, run_chain_checks
from losslessness.engine.draw import ProtocolViolation, coerce_output, sample_chain
from losslessness.reference import verify as reference_verify
from losslessness.results import CheckContext, CheckKind, Verdict
from losslessness.samples import ChainSamples
from losslessness.seeding import derive_seed
from losslessness.stats import DEFAULT_FAMILY_WISE_ALPHA
from losslessness.zoo import MUTANTS, Mutant

TREE_BEGIN_MARKER = "<!-- tree-detection-rates: begin (benchmarks/tree_detection_rates.py) -->"
TREE_END_MARKER = "<!-- tree-detection-rates: end -->"
"""The markers around the tree section of the report, which
``benchmarks/tree_detection_rates.py`` writes and this script keeps."""

RUN_SEED = 4
"""Run seed of the measurement (issue 4); every (entry, seed index) seed derives from it."""

DEFAULT_BUDGETS = (1_000, 10_000, 100_000)
"""Verification steps per verdict, up to vLLM's nominal histogram size 1e5 (sampling 1e5
steps per seed dominates the run's cost)."""

DEFAULT_SEEDS = 50
DEFAULT_FALSE_ALARM_SEEDS = 250
"""Per control: the zoo's four controls make 1000 false-alarm verdicts per method."""
POWER = 0.9
"""Design power recorded in our checks' contexts (it sizes nothing here: n is the budget)."""
DESIGN_TV = 0.05
DEFAULT_OUT = Path("docs/detection-rates.md")

METHODS = ("ours", "vllm-histogram-l2", "vllm-chi-square", "trtllm-kl", "flashinfer-structure")
"""Method names, ours first; the peers' are the ``method`` of their PeerVerdict."""

PEERS = METHODS[1:]

Detections = dict[str, bool | None]
"""Method -> detected (None: the method does not apply, e.g. a distribution test on greedy)."""


def prefix(samples: ChainSamples, n_steps: int) -> ChainSamples:
    """The first ``n_steps`` steps of ``samples`` (calls keep their size, so rows paired by the
    independence check still shared a call)."""
    if not 1 <= n_steps <= samples.outputs.shape[1]:
        raise ValueError(f"n_steps: must lie in [1, {samples.outputs.shape[1]}], got {n_steps}")
    return dataclasses.replace(
        samples,
        outputs=samples.outputs[:, :n_steps],
        drafts=samples.drafts[:, :n_steps],
    )


def ours_detects(
    samples: ChainSamples,
    target: str,
    seed: int,
    family_wise_alphas: Sequence[float] = (DEFAULT_FAMILY_WISE_ALPHA,),
) -> list[bool]:
    """Our verdict (any check LOSSY) on ``samples`` at each family-wise false-alarm rate.

    The checks run once, at the largest rate; a check LOSSY there is LOSSY at a smaller rate
    a iff it is exact or its p-value is at most a / (the case's statistical assertions): every
    statistical check's verdict is LOSSY exactly when its p-value is at most its level and an
    alpha-free condition holds (acceptance: the rate is higher than sum min(p, q)).

    Args:
        samples: n steps of one case.
        target: the target's name, for the check records.
        seed: recorded in the checks' context.
        family_wise_alphas: rates in (0, 1), each Bonferroni-split over the case's assertions.

    Returns:
        One bool per rate, in order: whether ours reports a loss.
    """
    case = samples.case
    assertions = max(1, count_statistical_assertions(case, samples.steps_per_call))
    largest = max(family_wise_alphas)
    context = CheckContext.for_case(
        target, case, alpha=largest / assertions, power=POWER, tv=DESIGN_TV, seed=seed
    )
    lossy = [r for r in run_chain_checks(samples, context) if r.verdict is Verdict.LOSSY]
    return [
        any(
            r.kind is CheckKind.EXACT or (r.p_value is not None and r.p_value <= a / assertions)
            for r in lossy
        )
        for a in family_wise_alphas
    ]


def verdict(method: str, samples: ChainSamples, target: str, seed: int) -> bool:
    """One method's verdict on chain samples: whether it reports the target as wrong.

    Args:
        method: one of :data:`METHODS`.
        samples: n steps of one case (``[R, n, k+1]`` outputs).
        target: the target's name, for our check records.
        seed: seeds the peers' own randomness (vLLM's reference laws, TensorRT-LLM's plain
            samples) and is recorded in our checks' context.

    Raises:
        ValueError: unknown ``method``.
    """
    case = samples.case
    p = case.target_probs.numpy()
    if method == "ours":
        return ours_detects(samples, target, seed)[0]
    if method == "vllm-histogram-l2":
        return vllm_histogram_l2(samples.outputs, p, seed=seed).detected
    if method == "vllm-chi-square":
        return vllm_chi_square(samples.outputs, p).detected
    if method == "trtllm-kl":
        return trtllm_kl(samples.outputs, p, seed=seed).detected
    if method == "flashinfer-structure":
        return flashinfer_structure(samples.outputs, samples.drafts, case.vocab_size, p).detected
    raise ValueError(f"method: unknown {method!r}; known: {', '.join(METHODS)}")


def chain_verdicts(
    samples: ChainSamples, target: str, seed: int, timings: dict[str, list[float]] | None = None
) -> Detections:
    """Every method's verdict on the same chain samples (see :func:`verdict`); ``timings``, if
    given, gets each method's wall time (s) appended under its name. Ours detects when any
    check is LOSSY (SUBOPTIMAL is not a loss)."""
    detections: Detections = {}
    for method in METHODS:
        began = time.perf_counter()
        detections[method] = verdict(method, samples, target, seed)
        if timings is not None:
            timings[method].append(time.perf_counter() - began)
    return detections


def greedy_verdicts(entry: Mutant) -> Detections:
    """Ours (exact equality with greedy decoding) and FlashInfer's structural test on a greedy
    entry's case; the peers' distribution tests do not apply to a deterministic verifier."""
    case = entry.case
    assert isinstance(case, GreedyCase) and entry.adapter.greedy is not None
    context = CheckContext.for_case(
        entry.adapter.name, case, alpha=DEFAULT_FAMILY_WISE_ALPHA, power=POWER, tv=DESIGN_TV, seed=0
    )
    try:
        raw = entry.adapter.greedy(case.target_logits.clone(), case.draft_token_ids.clone())
        outputs = coerce_output(raw, case.draft_token_ids.shape[0], case.k)
    except ProtocolViolation:
        ours = structure = True
    else:
        ours = check_greedy(outputs, case, context).verdict is Verdict.LOSSY
        structure = flashinfer_structure(
            outputs[None], case.draft_token_ids.numpy()[None], case.vocab_size
        ).detected
    return {
        "ours": ours,
        "vllm-histogram-l2": None,
        "vllm-chi-square": None,
        "trtllm-kl": None,
        "flashinfer-structure": structure,
    }


def sample_entry(entry: Mutant, n_steps: int, seed: int) -> ChainSamples | str:
    """n steps of a chain entry's case, or why none came back (a malformed output or a crash,
    which fails every method's test alike)."""
    assert isinstance(entry.case, ChainCase) and entry.adapter.chain is not None
    try:
        return sample_chain(entry.adapter.chain, entry.case, n_steps, seed)
    except ProtocolViolation as violation:
        return f"malformed output: {violation}"
    except Exception as error:  # a crash fails every test suite; recorded, not hidden
        return f"raised {type(error).__name__}: {error}"


def entry_seed(name: str, index: int, purpose: str) -> int:
    """Seed of seed index ``index`` of entry ``name`` (``purpose``: grid or false-alarm)."""
    return derive_seed(RUN_SEED, "detection-rates", purpose, name, index)


@dataclass
class Tally:
    """Detections out of trials for one (entry, budget, method)."""

    detected: int = 0
    trials: int = 0

    def add(self, detected: bool) -> None:
        """Count one verdict."""
        self.detected += int(detected)
        self.trials += 1

    def merge(self, other: Tally) -> None:
        """Add another tally's counts."""
        self.detected += other.detected
        self.trials += other.trials

    @property
    def rate(self) -> float:
        """Detection rate (NaN without trials)."""
        return self.detected / self.trials if self.trials else math.nan


@dataclass
class Measurement:
    """Everything the report shows.

    Attributes:
        budgets: verification steps per verdict.
        seeds: seeds per (entry, budget) cell.
        false_alarm_seeds, false_alarm_budget: the controls' extended false-alarm run.
        grid: (entry, budget, method) -> tally; greedy entries under budget 0 (deterministic).
        false_alarms: (control, method) -> tally of the extended run.
        timings: (method, budget) -> seconds per verdict.
        failures: (entry, reason) for runs that returned no samples.
        reference_false_alarms: (mutant, budget, peer) -> the peer's alarms on the reference
            verifier on that mutant's own case, for every cell where the peer beats ours.
        wall_time_s: seconds for the whole measurement.
    """

    budgets: tuple[int, ...]
    seeds: int
    false_alarm_seeds: int
    false_alarm_budget: int
    grid: dict[tuple[str, int, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    false_alarms: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    timings: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    failures: list[tuple[str, str]] = field(default_factory=list)
    reference_false_alarms: dict[tuple[str, int, str], Tally] = field(
        default_factory=lambda: defaultdict(Tally)
    )
    wall_time_s: float = 0.0


def _record(
    tallies: dict[tuple[str, int, str], Tally], name: str, budget: int, detections: Detections
) -> None:
    for method, detected in detections.items():
        if detected is not None:
            tallies[name, budget, method].add(detected)


def measure_entry(
    name: str,
    budgets: Sequence[int],
    seeds: int,
    false_alarm_seeds: int,
    false_alarm_budget: int,
) -> Measurement:
    """One zoo entry's grid cells (and, for a control, its extended false-alarm run)."""
    entry = MUTANTS[name]
    measurement = Measurement(tuple(sorted(budgets)), seeds, false_alarm_seeds, false_alarm_budget)
    if isinstance(entry.case, GreedyCase):
        _record(measurement.grid, entry.name, 0, greedy_verdicts(entry))
        return measurement
    largest = max(measurement.budgets)
    for index in range(seeds):
        seed = entry_seed(entry.name, index, "grid")
        samples = sample_entry(entry, largest, seed)
        for budget in measurement.budgets:
            if isinstance(samples, str):
                measurement.failures.append((entry.name, samples))
                _record(measurement.grid, entry.name, budget, dict.fromkeys(METHODS, True))
                continue
            timings: dict[str, list[float]] = defaultdict(list)
            detections = chain_verdicts(prefix(samples, budget), entry.adapter.name, seed, timings)
            _record(measurement.grid, entry.name, budget, detections)
            for method, seconds in timings.items():
                measurement.timings[method, budget] += seconds
    for index in range(0 if entry.lossy else false_alarm_seeds):
        seed = entry_seed(entry.name, index, "false-alarm")
        samples = sample_entry(entry, false_alarm_budget, seed)
        detections = (
            dict.fromkeys(METHODS, True)
            if isinstance(samples, str)
            else chain_verdicts(samples, entry.adapter.name, seed)
        )
        for method, detected in detections.items():
            if detected is not None:
                measurement.false_alarms[entry.name, method].add(detected)
    return measurement


def _merge(into: Measurement, part: Measurement) -> None:
    for key, tally in part.grid.items():
        into.grid[key].merge(tally)
    for fa_key, tally in part.false_alarms.items():
        into.false_alarms[fa_key].merge(tally)
    for time_key, seconds in part.timings.items():
        into.timings[time_key] += seconds
    into.failures += part.failures


def measure(
    entries: Iterable[Mutant],
    budgets: Sequence[int],
    seeds: int,
    false_alarm_seeds: int,
    false_alarm_budget: int,
    jobs: int = 1,
    show_progress: bool = True,
) -> Measurement:
    """Run the whole grid and the controls' false-alarm runs (see the module docstring), one
    entry per task over ``jobs`` processes; the result does not depend on ``jobs``."""
    chosen = list(entries)
    measurement = Measurement(tuple(sorted(budgets)), seeds, false_alarm_seeds, false_alarm_budget)
    began = time.perf_counter()
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} entries"),
        TimeElapsedColumn(),
    )
    arguments = (budgets, seeds, false_alarm_seeds, false_alarm_budget)
    # Fresh interpreters ("spawn"): forking a process whose torch thread pool is running can
    # deadlock the children.
    context = multiprocessing.get_context("spawn")
    with (
        Progress(*columns, disable=not show_progress) as progress,
        concurrent.futures.ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=torch.set_num_threads, initargs=(1,)
        ) as pool,
    ):
        task = progress.add_task("detection rates", total=len(chosen))
        futures = {pool.submit(measure_entry, entry.name, *arguments): entry for entry in chosen}
        parts = {}
        for future in concurrent.futures.as_completed(futures):
            parts[futures[future].name] = future.result()
            progress.update(task, advance=1, description=f"done: {futures[future].name}")
    for entry in chosen:  # merge in zoo order, so that the record does not depend on timing
        _merge(measurement, parts[entry.name])
    measure_reference_false_alarms(measurement)
    measurement.wall_time_s = time.perf_counter() - began
    return measurement


def beaten_cells(m: Measurement) -> list[tuple[str, int, str]]:
    """(lossy chain mutant, budget, peer) where the peer's detection rate is significantly
    above ours (:func:`peer_beats_ours`), in zoo, budget and method order."""
    cells = []
    for name, entry in MUTANTS.items():
        if not entry.lossy or isinstance(entry.case, GreedyCase):
            continue
        for budget in m.budgets:
            ours = m.grid.get((name, budget, "ours"), Tally())
            for method in PEERS:
                peer = m.grid.get((name, budget, method), Tally())
                if peer.trials and ours.trials and peer_beats_ours(ours, peer):
                    cells.append((name, budget, method))
    return cells


def measure_reference_false_alarms(m: Measurement) -> None:
    """For every cell where a peer beats ours, the peer's alarm rate on the reference verifier
    (lossless) on the same mutant's case at the same budget, over ``m.seeds`` seeds: how much
    of the peer's "detection" there is what it does to correct code."""
    for name, budget, method in beaten_cells(m):
        case = MUTANTS[name].case
        assert isinstance(case, ChainCase)
        for index in range(m.seeds):
            seed = entry_seed(name, index, "reference")
            samples = sample_chain(reference_verify, case, budget, seed)
            m.reference_false_alarms[name, budget, method].add(
                verdict(method, samples, "reference", seed)
            )


def clopper_pearson(detected: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval for a rate (statsmodels ``proportion_confint``)."""
    low, high = proportion_confint(detected, trials, alpha=1 - level, method="beta")
    return float(low), float(high)


def peer_beats_ours(ours: Tally, peer: Tally, level: float = 0.05) -> bool:
    """Whether the peer's detection rate is significantly above ours (one-sided Fisher exact
    test at ``level`` on the 2x2 table of detections)."""
    table = [
        [peer.detected, peer.trials - peer.detected],
        [ours.detected, ours.trials - ours.detected],
    ]
    return bool(scipy.stats.fisher_exact(table, alternative="greater").pvalue < level)


_SMALL_N = (
    "The peer's detections at this budget are what it does to correct code (compare its rate "
    "on the reference verifier on this very case, above): the vLLM histogram ratio cannot reach 20 "
    "below about 4e3 steps, since the distance to p shrinks like sqrt(n) and sqrt(1000 / 10) "
    "= 10, and TensorRT-LLM's KL is NaN whenever a token with p > 0 goes unobserved. Ours spends "
    "1e-3 per verdict and detects as soon as the evidence exists."
)

EXPLANATIONS: dict[str, str] = {
    "residual-clamped-1e-5": (
        f"{_SMALL_N} Here the evidence is rare: the 1e-5 floor moves about V * 1e-5 of the "
        "residual's mass, so on the tokens with p > 0 the emitted laws are within TV ~1e-3 of "
        "p (no identity test detects that at 1e3 steps), and the loss shows only when a token "
        "with p = 0 is emitted after a rejection, which our exact zero-probability check "
        "catches on the first occurrence. Our detection rate is the probability that one "
        "occurs in n steps ({{ rates('ours') }}): no test that keeps its false-alarm "
        "rate can do better on these samples. Nothing to improve; the trade-off is the peer's "
        "false-alarm rate."
    ),
    "uniform-includes-zero": (
        f"{_SMALL_N} The mutant accepts a draft with p = 0 only when its bfloat16 coin is "
        "exactly 0 (about 2e-3 per coin), so the evidence is again a rare impossible token, "
        "caught exactly on its first occurrence ({{ rates('ours') }}). The calibrated "
        "peers never detect it: the vLLM chi-square test merges the zero-probability tokens "
        "into a bin whose expected count is below 5 and drops it, and TensorRT-LLM's KL "
        "ignores tokens with p = 0."
    ),
    "residual-zeroes-rejected-token": (
        f"{_SMALL_N} This mutant's deviation is a law deviation (the residual is p with the "
        "rejected token zeroed instead of norm(max(0, p - q))), of TV small enough that our "
        "identity tests, each at 1e-3 split over the case's 6 assertions, detect it "
        "at rates {{ rates('ours') }}. The calibrated peers do worse on the same samples (vLLM "
        "chi-square {{ rates('vllm-chi-square') }}: its 10-sigma threshold is far stricter "
        "than our per-assertion level; TensorRT-LLM {{ rates('trtllm-kl') }}, from position 0 "
        "only). Raising our level would raise our "
        "power and our false-alarm rate together; the budget is the user's `--alpha`."
    ),
    "padded-vocab-not-truncated": (
        f"{_SMALL_N} The mutant emits an id >= V (a padded lane) in about 0.3% of corrections "
        "and bonus tokens; our structure check catches the first one exactly "
        "({{ rates('ours') }}). TensorRT-LLM's test ignores such ids (they fall outside its "
        "histogram bins): its detections at 1e3 are its false alarms on this V = 50 case."
    ),
}
"""Mutant -> why a peer beats ours there and the trade-off, written from the measured run
(``docs/detection-rates.md``); a mutant without an entry is reported as unexplained."""

METHOD_DESCRIPTIONS = {
    "ours": (
        "Structure (exact), conditional law of the emitted token at every position including "
        "the bonus (Cressie-Read identity test, cells below expected 20 pooled, zero-probability "
        "tokens exact), acceptance rate vs sum min(p, q) (exact binomial), exact edge cases, "
        "independence of identical rows in one call; family-wise false-alarm rate 1e-3 split "
        "Bonferroni over the case's statistical assertions. Greedy: token-for-token equality "
        "with argmax decoding.",
        "this project (`losslessness/checks`, docs/architecture.md, 'What lossless means')",
    ),
    "vllm-histogram-l2": (
        "Pooled histogram of the tokens emitted at draft positions 0..k-1 (bonus dropped); its "
        "L2 distance to the expected law must shrink 20x more than its distance to 100 random "
        "softmax(U[0,1)) laws between the first (10) and the last (n) sample size. No stated "
        "false-alarm rate.",
        "[vllm tests/v1/sample/test_rejection_sampler.py]"
        "(https://github.com/vllm-project/vllm/blob/main/tests/v1/sample/test_rejection_sampler.py)"
        " `test_rejection_sampling_approximates_target_distribution`",
    ),
    "vllm-chi-square": (
        "Pearson chi-square of the emitted token at every position (bonus included) against "
        "p_i, cells with expected count < 5 merged (the merged bin dropped if below 5), fail iff "
        "chi2 >= df + 10 sqrt(2 df) at any position. No Bonferroni split, no stated rate.",
        "[vLLM PR 38496](https://github.com/vllm-project/vllm/pull/38496) "
        "`_assert_distribution_match` (test of the model-runner-v2 "
        "`probabilistic_rejection_sample` kernel)",
    ),
    "trtllm-kl": (
        "First emitted token only: abs(KL(p, histogram of spec output) - KL(p, histogram of n "
        "plain samples from p)) < 0.01; an unobserved token with p > 0 makes both KLs infinite "
        "and the difference NaN, which fails.",
        "[TensorRT-LLM PR 6542](https://github.com/NVIDIA/TensorRT-LLM/pull/6542), "
        "`tests/unittest/_torch/speculative/test_torch_rejection_sampling.py`",
    ),
    "flashinfer-structure": (
        "Output validity only: ids < V, mismatches with the draft contiguous and followed by -1, "
        "at least one token; with one-hot targets, the exact deterministic output. Never looks "
        "at a distribution.",
        "[flashinfer tests/test_sampling.py]"
        "(https://github.com/flashinfer-ai/flashinfer/blob/main/tests/test_sampling.py) "
        "`test_chain_speculative_sampling`",
    ),
}

TEMPLATE = """\
# Detection and false-alarm rates: our audit vs the peers' tests

Generated by `benchmarks/detection_rates.py` ({{ command }}) on {{ started }}, run seed
{{ run_seed }}, in {{ "%.0f" | format(m.wall_time_s) }} s on {{ machine }}. Do not edit by hand:
re-run the script.

Every method decides on the **same** n verification steps of each zoo entry's own case
(`losslessness.zoo`; the entry's `case` is where its mechanism acts). Budgets
{{ m.budgets | join(", ") }} steps are nested prefixes of one run per seed;
{{ m.seeds }} independent seeds per cell. A cell reads `rate (detections/trials)`. For lossy
mutants this is the detection rate (power); for the lossless controls it is the false-alarm
rate. Greedy entries are deterministic: one verdict, shown in every budget column; the
distribution tests do not apply (`n/a`).

## Summary

Lossy mutants detected in at least 90% of runs (of {{ lossy_count }}; greedy ones count where
the method applies) and false-alarm rate on the lossless controls, per budget:

| method | {% for budget in m.budgets %}n = {{ budget }} | {% endfor %}
|---|{% for budget in m.budgets %}---|{% endfor %}
{% for method in methods -%}
| `{{ method }}` |{% for budget in m.budgets %} {{ summary(method, budget) }} |{% endfor %}
{% endfor %}
## Methods

| method | what it tests | source |
|---|---|---|
{% for name, (what, source) in descriptions.items() -%}
| `{{ name }}` | {{ what }} | {{ source }} |
{% endfor %}
{% for budget in m.budgets %}
## Detection rates at n = {{ budget }} verification steps

| entry | kind | {% for method in methods %}`{{ method }}` | {% endfor %}
|---|---|{% for method in methods %}---|{% endfor %}
{% for entry in entries -%}
| [{{ entry.name }}]({{ entry.source }}) | {{ kind(entry) }} |
{%- for method in methods %} {{ cell(entry, budget, method) }} |{% endfor %}
{% endfor %}
{% endfor %}
## False-alarm rates on the lossless controls

From the grid ({{ m.seeds }} seeds per control and budget), all controls pooled, with 95%
Clopper-Pearson intervals:

| method | {% for budget in m.budgets %}n = {{ budget }} | {% endfor %}
|---|{% for budget in m.budgets %}---|{% endfor %}
{% for method in chain_methods -%}
| `{{ method }}` | {% for budget in m.budgets %}{{ pooled(method, budget) }} | {% endfor %}
{% endfor %}
Extended run: {{ m.false_alarm_seeds }} seeds per control at n = {{ m.false_alarm_budget }}
(the smallest budget, to keep the cost down). Our nominal rate is 1e-3 per verdict (the
family-wise budget of one case), so {{ m.false_alarm_seeds }} seeds per control can only bound
it: the interval, not the point estimate, is the result.

| method | {% for control in controls %}{{ control.name }} | {% endfor %}all controls (95% CI) |
|---|{% for control in controls %}---|{% endfor %}---|
{% for method in chain_methods -%}
| `{{ method }}` |
{%- for control in controls %} {{ extended(control.name, method) }} |{% endfor %}
{{- " " ~ extended_pooled(method) }} |
{% endfor %}
## Time per verdict

Mean wall time of one verdict on the same samples (sampling excluded; it is shared), measured
during this run on a shared machine; `benchmarks/test_bench_methods.py` measures it with
pytest-benchmark at n = 1e4.

| method | {% for budget in m.budgets %}n = {{ budget }} | {% endfor %}
|---|{% for budget in m.budgets %}---|{% endfor %}
{% for method in chain_methods -%}
| `{{ method }}` | {% for budget in m.budgets %}{{ timing(method, budget) }} | {% endfor %}
{% endfor %}
## Where a peer beats us

Cells where a peer's detection rate on a lossy mutant is significantly above ours (one-sided
Fisher exact test, p < 0.05), with that peer's false-alarm rate at the same budget on the
controls (from the grid) and on the (lossless) reference verifier run on the mutant's own case:
a detection rate is only worth as much as the false-alarm rate it comes with.
{% if not beaten %}
None: at every budget and on every lossy mutant, no peer's detection rate is significantly
above ours.
{% endif %}
{% for name, rows in beaten.items() %}
### {{ name }}

{% for row in rows -%}
- n = {{ row.budget }}: `{{ row.method }}` {{ row.peer }} vs ours {{ row.ours }}. At this budget
  `{{ row.method }}` alarms on the lossless controls in {{ row.false_alarm }}, and on the
  reference verifier run on this mutant's own case in {{ row.reference }}.
{% endfor %}
{{ explanation(name) }}
{% endfor %}
{% if m.failures %}
## Runs that returned no samples

Counted as detected by every method (a malformed output or a crash fails every test suite):

{% for name, reason in failures -%}
- {{ name }}: {{ reason }}
{% endfor %}
{% endif %}
"""


def format_tally(tally: Tally) -> str:
    """``rate (detected/trials)``, or ``n/a`` without trials."""
    if not tally.trials:
        return "n/a"
    return f"{tally.rate:.2f} ({tally.detected}/{tally.trials})"


def format_tally_ci(tally: Tally) -> str:
    """``detected/trials = rate [95% Clopper-Pearson interval]``, or ``n/a``."""
    if not tally.trials:
        return "n/a"
    low, high = clopper_pearson(tally.detected, tally.trials)
    return f"{tally.detected}/{tally.trials} = {tally.rate:.3g} [{low:.2g}, {high:.2g}]"


def render_markdown(m: Measurement, entries: Sequence[Mutant], command: str, started: str) -> str:
    """The Markdown report of a measurement (jinja2 template :data:`TEMPLATE`)."""
    controls = [e for e in entries if not e.lossy and isinstance(e.case, ChainCase)]
    chain_methods = list(METHODS)

    def budget_key(entry: Mutant, budget: int) -> int:
        return 0 if isinstance(entry.case, GreedyCase) else budget

    def cell(entry: Mutant, budget: int, method: str) -> str:
        return format_tally(m.grid.get((entry.name, budget_key(entry, budget), method), Tally()))

    def pooled_tally(method: str, budget: int) -> Tally:
        total = Tally()
        for control in controls:
            tally = m.grid.get((control.name, budget, method), Tally())
            total.detected += tally.detected
            total.trials += tally.trials
        return total

    def extended_pooled(method: str) -> str:
        total = Tally()
        for control in controls:
            tally = m.false_alarms.get((control.name, method), Tally())
            total.detected += tally.detected
            total.trials += tally.trials
        return format_tally_ci(total)

    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    beaten: dict[str, list[dict[str, str]]] = defaultdict(list)
    for name, budget, method in beaten_cells(m):
        beaten[name].append(
            {
                "budget": str(budget),
                "method": method,
                "peer": format_tally(m.grid[name, budget, method]),
                "ours": format_tally(m.grid[name, budget, "ours"]),
                "false_alarm": format_tally_ci(pooled_tally(method, budget)),
                "reference": format_tally(
                    m.reference_false_alarms.get((name, budget, method), Tally())
                ),
            }
        )

    def explanation(name: str) -> str:
        def rates(method: str) -> str:
            return ", ".join(
                f"{m.grid[name, budget, method].rate:.2f} at n = {budget}"
                for budget in m.budgets
                if m.grid.get((name, budget, method), Tally()).trials
            )

        text = EXPLANATIONS.get(name, "(No explanation recorded for this mutant.)")
        return environment.from_string(text).render(rates=rates)

    lossy = [e for e in entries if e.lossy]

    def summary(method: str, budget: int) -> str:
        detected = sum(
            m.grid.get((e.name, budget_key(e, budget), method), Tally()).rate >= 0.9 for e in lossy
        )
        return f"{detected} detected; {format_tally(pooled_tally(method, budget))} false alarms"

    def timing(method: str, budget: int) -> str:
        values = m.timings.get((method, budget), [])
        return f"{1e3 * float(np.mean(values)):.2f} ms" if values else "n/a"

    return environment.from_string(TEMPLATE).render(
        m=m,
        command=command,
        started=started,
        run_seed=RUN_SEED,
        machine=f"{platform.machine()} {platform.system()}, torch {torch.__version__}",
        descriptions=METHOD_DESCRIPTIONS,
        methods=METHODS,
        chain_methods=chain_methods,
        entries=entries,
        controls=controls,
        kind=lambda e: (
            ("lossy" if e.lossy else "control")
            + (" (greedy)" if isinstance(e.case, GreedyCase) else "")
        ),
        cell=cell,
        pooled=lambda method, budget: format_tally_ci(pooled_tally(method, budget)),
        extended=lambda name, method: format_tally(m.false_alarms.get((name, method), Tally())),
        extended_pooled=extended_pooled,
        timing=timing,
        beaten=dict(beaten),
        explanation=explanation,
        summary=summary,
        lossy_count=sum(e.lossy for e in entries),
        failures=sorted(set(m.failures)),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, run the measurement, write the Markdown report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS))
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeds per cell")
    parser.add_argument(
        "--false-alarm-seeds",
        type=int,
        default=DEFAULT_FALSE_ALARM_SEEDS,
        help="seeds per control for the extended false-alarm run",
    )
    parser.add_argument(
        "--false-alarm-budget", type=int, default=None, help="steps per false-alarm verdict"
    )
    parser.add_argument("--entries", nargs="*", default=None, help="zoo names (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one entry each)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-progress", action="store_true")
    arguments = parser.parse_args(argv)
    if any(budget <= 10 for budget in arguments.budgets):
        parser.error(
            "--budgets: every budget must exceed 10 (vLLM's histogram test needs two sizes)"
        )
    if arguments.seeds < 1 or arguments.false_alarm_seeds < 0:
        parser.error("--seeds must be >= 1 and --false-alarm-seeds >= 0")
    unknown = sorted(set(arguments.entries or ()) - set(MUTANTS))
    if unknown:
        parser.error(f"--entries: unknown {unknown}; known: {', '.join(MUTANTS)}")
    # The zoo's tree entries have their own script (benchmarks/tree_detection_rates.py).
    chain_names = [n for n, e in MUTANTS.items() if isinstance(e.case, (ChainCase, GreedyCase))]
    entries = [MUTANTS[name] for name in (arguments.entries or chain_names)]
    false_alarm_budget = arguments.false_alarm_budget or min(arguments.budgets)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(
        f"run seed {RUN_SEED}; budgets {arguments.budgets}; {arguments.seeds} seeds per cell; "
        f"{arguments.false_alarm_seeds} false-alarm seeds per control at n = {false_alarm_budget}"
    )
    measurement = measure(
        entries,
        arguments.budgets,
        arguments.seeds,
        arguments.false_alarm_seeds,
        false_alarm_budget,
        jobs=arguments.jobs,
        show_progress=not arguments.no_progress,
    )
    command = (
        f"`--budgets {' '.join(map(str, measurement.budgets))} --seeds {arguments.seeds} "
        f"--false-alarm-seeds {arguments.false_alarm_seeds} "
        f"--false-alarm-budget {false_alarm_budget}`"
    )
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    text = render_markdown(measurement, entries, command, started)
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    # Keep the tree section that benchmarks/tree_detection_rates.py wrote (from its marker on).
    old = arguments.out.read_text() if arguments.out.exists() else ""
    if TREE_BEGIN_MARKER in old:
        text += "\n" + old[old.index(TREE_BEGIN_MARKER) :]
    arguments.out.write_text(text)
    print(f"wrote {arguments.out} in {measurement.wall_time_s:.0f} s")


if __name__ == "__main__":
    main()
