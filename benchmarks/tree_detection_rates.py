"""Detection and false-alarm rates of our tree checks and of the peers' tree tests.

For every tree entry of the mutant zoo (``losslessness.zoo.tree.TREE_ZOO``, in the
zoo as ``mutant/tree-<name>``: lossy mutants and lossless controls) and every budget of n tree
verification steps, each method decides on the entry's own case, over many seeds:

- ``ours``: the tree checks as the audit runs them (``run_tree_checks``: structure, law of the
  next token at every reached node class, acceptance per depth against the exact laws,
  independence of paired trees) at the default family-wise false-alarm rate 1e-3,
  Bonferroni-split over that case's statistical assertions (``tree_assertions(case).count()``);
  the greedy tree check (``check_tree_greedy``) for greedy entries;
- ``sglang-structural`` (:func:`benchmarks.tree_peers.sglang_structural`): SGLang's
  deterministic kernel test (hand-built trees, one-hot targets, exact expected output); it
  needs no samples of the case, so its verdict is one call per seed, shown in every budget
  column;
- ``first-token-chi-square`` (:func:`benchmarks.tree_peers.first_token_chi_square`): Pearson
  chi-square of the first emitted token against p at the root at level 1e-3, on the same n
  steps as ours.

The budgets of one seed are nested prefixes of one run (steps are independent, so a prefix of n
steps is distributed as an n-step run); different seeds are independent runs. The largest
budget costs ten times the next one: ``--seeds-at-largest`` (default: every seed) runs it on
the first seeds only (each of those seeds is one run of the largest budget, the others one run
of the next). The lossless controls are also run over ``--false-alarm-seeds`` seeds at
``--false-alarm-budget`` steps, for the false-alarm rates with Clopper-Pearson intervals.

The steps are drawn in calls of :data:`SAMPLING_BATCH` trees instead of the case's 64 (the
Python overhead per call dominates small calls). Every zoo verifier treats the trees of a call
independently, so the law of the samples is unchanged, and trees ``2m`` and ``2m+1`` of a call
still share their tables, as the independence check assumes; the checks see the case itself
(its hash seeds the pilot that fixes the assertions).

The section is written into ``docs/detection-rates.md`` between the markers
:data:`BEGIN_MARKER` and :data:`END_MARKER` (appended when absent); the rest of the file (the
chain section of ``benchmarks/detection_rates.py``) is left as it is.

    PYTHONPATH=. python benchmarks/tree_detection_rates.py --jobs 1
    PYTHONPATH=. python benchmarks/tree_detection_rates.py --seeds 3 --seeds-at-largest 1 \
        --false-alarm-seeds 10 --out /tmp/detection-rates.md

Run from the repository root.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import multiprocessing
import os
import pickle
import platform
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import numpy as np
import torch

from benchmarks.detection_rates import (
    TREE_BEGIN_MARKER,
    TREE_END_MARKER,
    Tally,
    clopper_pearson,
    format_tally,
    format_tally_ci,
    peer_beats_ours,
)
from benchmarks.tree_peers import (
    FIRST_TOKEN_LEVEL,
    first_token_chi_square,
    sglang_greedy_structural,
    sglang_structural,
)
from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.checks import check_tree_greedy, run_tree_checks
from losslessness.checks.tree_assertions import tree_assertions
from losslessness.engine.draw import (
    ProtocolViolation,
    paired_steps,
    sample_greedy_tree,
    sample_tree,
)
from losslessness.results import CheckContext, CheckKind, Verdict
from losslessness.samples import TreeSamples
from losslessness.seeding import derive_seed
from losslessness.stats import DEFAULT_FAMILY_WISE_ALPHA
from losslessness.zoo import MUTANTS, Mutant
from losslessness.zoo.tree import TREE_ZOO

RUN_SEED = 11
"""Run seed of the measurement (issue 11); every (entry, seed index) seed derives from it."""

DEFAULT_BUDGETS = (1_000, 10_000, 100_000)
DEFAULT_SEEDS = 50
"""Seeds per cell, every budget: one run of 1e5 tree steps takes 0.2-0.4 s with one torch
thread on an idle core (7 s with two threads on the loaded two-core machine, hence
``torch.set_num_threads(1)``)."""
DEFAULT_FALSE_ALARM_SEEDS = 250
"""Per sampled control: the zoo's five make 1250 false-alarm verdicts per method."""
SAMPLING_BATCH = 4096
"""Trees per verifier call while sampling (see the module docstring)."""
POWER = 0.9
"""Design power recorded in our checks' contexts (it sizes nothing here: n is the budget)."""
DESIGN_TV = 0.05
DEFAULT_OUT = Path("docs/detection-rates.md")
BEGIN_MARKER, END_MARKER = TREE_BEGIN_MARKER, TREE_END_MARKER

METHODS = ("ours", "sglang-structural", "first-token-chi-square")
"""Method names, ours first."""
PEERS = METHODS[1:]
BUDGET_FREE = ("sglang-structural",)
"""Methods that do not read the case's samples: one verdict per seed, every budget column."""

Detections = dict[str, bool | None]
"""Method -> detected (None: the method does not apply, e.g. a distribution test on greedy)."""


def tree_entries() -> list[Mutant]:
    """The zoo's tree entries, in zoo order (lossy first)."""
    names = {spec.name for spec in TREE_ZOO}
    return [entry for name, entry in MUTANTS.items() if name in names]


def prefix(samples: TreeSamples, n_steps: int) -> TreeSamples:
    """The first ``n_steps`` steps of ``samples``, the pairs of the independence check
    recomputed for them (calls keep their size)."""
    if not 1 <= n_steps <= samples.n_steps:
        raise ValueError(f"n_steps: must lie in [1, {samples.n_steps}], got {n_steps}")
    return dataclasses.replace(
        samples,
        token_ids=samples.token_ids[:n_steps],
        tokens=samples.tokens[:n_steps],
        accepted_nodes=samples.accepted_nodes[:n_steps],
        pairs=paired_steps(n_steps, samples.steps_per_call),
    )


def sample_entry(entry: Mutant, n_steps: int, seed: int) -> TreeSamples | str:
    """n tree steps of a sampled tree entry's case (drawn in calls of :data:`SAMPLING_BATCH`,
    returned with the case itself), or why none came back (a malformed output or a crash,
    which fails every method's test alike)."""
    case = entry.case
    assert isinstance(case, TreeCase) and entry.adapter.tree is not None
    batched = dataclasses.replace(case, batch_size=SAMPLING_BATCH)
    try:
        samples = sample_tree(entry.adapter.tree, batched, n_steps, seed)
    except ProtocolViolation as violation:
        return f"malformed output: {violation}"
    except Exception as error:  # a crash fails every test suite; recorded, not hidden
        return f"raised {type(error).__name__}: {error}"
    return dataclasses.replace(samples, case=case)


def tree_context(target: str, case: TreeCase | GreedyTreeCase, alpha: float, seed: int
                 ) -> CheckContext:
    """The checks' context of ``case`` audited on ``target`` at per-assertion level ``alpha``."""
    return CheckContext(target, case.case_id, case.summary, case.case_hash, alpha, POWER,
                        DESIGN_TV, seed)


def ours_detects(
    samples: TreeSamples,
    target: str,
    seed: int,
    family_wise_alphas: Sequence[float] = (DEFAULT_FAMILY_WISE_ALPHA,),
) -> list[bool]:
    """Our verdict (any tree check LOSSY) on ``samples`` at each family-wise false-alarm rate.

    The checks run once, at the largest rate, each at that rate over the case's statistical
    assertions; a LOSSY check stays LOSSY at a smaller rate a iff it is exact or its p-value is
    at most a / (assertions) (every statistical tree check is LOSSY exactly when its p-value is
    at most its level: identity tests, independence, and the acceptance test whose reported
    p-value is twice its one-sided one, against half the level).

    Args:
        samples: n steps of one tree case.
        target: the target's name, for the check records.
        seed: recorded in the checks' context.
        family_wise_alphas: rates in (0, 1), each Bonferroni-split over the case's assertions.

    Returns:
        One bool per rate, in order: whether ours reports a loss.
    """
    case = samples.case
    assertions = max(1, tree_assertions(case).count())
    largest = max(family_wise_alphas)
    context = tree_context(target, case, largest / assertions, seed)
    lossy = [r for r in run_tree_checks(samples, context) if r.verdict is Verdict.LOSSY]
    return [
        any(
            r.kind is CheckKind.EXACT or (r.p_value is not None and r.p_value <= a / assertions)
            for r in lossy
        )
        for a in family_wise_alphas
    ]


def verdict(method: str, samples: TreeSamples, target: str, seed: int) -> bool:
    """One sample-reading method's verdict on tree samples: whether it reports the target wrong.

    Args:
        method: ``ours`` or ``first-token-chi-square``.
        samples: n steps of one tree case.
        target: the target's name, for our check records.
        seed: recorded in our checks' context.

    Raises:
        ValueError: unknown ``method`` (or one that does not read samples).
    """
    if method == "ours":
        return ours_detects(samples, target, seed)[0]
    if method == "first-token-chi-square":
        p = samples.case.root_target.to(torch.float64).numpy()
        return first_token_chi_square(samples.tokens[:, 0], p).detected
    raise ValueError(f"method: {method!r} does not read samples; those that do: ours, "
                     "first-token-chi-square")


def structural_verdict(entry: Mutant, seed: int) -> bool:
    """SGLang's structural test on a sampled entry, its coins from a generator seeded ``seed``,
    under the draft scheme of the entry's own case."""
    case = entry.case
    assert isinstance(case, TreeCase) and entry.adapter.tree is not None
    generator = torch.Generator().manual_seed(derive_seed(seed, "sglang-structural"))
    return sglang_structural(entry.adapter.tree, case.draft_scheme, generator).detected


def greedy_verdicts(entry: Mutant) -> Detections:
    """Ours (``check_tree_greedy`` on the entry's case: LOSSY counts, SUBOPTIMAL does not) and
    SGLang's structural test on a greedy tree entry; the chi-square does not apply."""
    case = entry.case
    assert isinstance(case, GreedyTreeCase) and entry.adapter.greedy_tree is not None
    context = tree_context(entry.adapter.name, case, DEFAULT_FAMILY_WISE_ALPHA, 0)
    try:
        tokens, nodes = sample_greedy_tree(entry.adapter.greedy_tree, case)
        ours = check_tree_greedy(tokens, nodes, case, context).verdict is Verdict.LOSSY
    except Exception:  # a malformed output or a crash is LOSSY in the audit
        ours = True
    return {
        "ours": ours,
        "sglang-structural": sglang_greedy_structural(entry.adapter.greedy_tree).detected,
        "first-token-chi-square": None,
    }


def entry_seed(name: str, index: int, purpose: str) -> int:
    """Seed of seed index ``index`` of entry ``name`` (``purpose``: grid or false-alarm)."""
    return derive_seed(RUN_SEED, "tree-detection-rates", purpose, name, index)


@dataclass
class Measurement:
    """Everything the report shows.

    Attributes:
        budgets: verification steps per verdict, increasing.
        seeds: budget -> seeds of its cells.
        false_alarm_seeds, false_alarm_budget: the controls' extended false-alarm run.
        grid: (entry, budget, method) -> tally; greedy entries under budget 0 (deterministic).
        false_alarms: (control, method) -> tally of the extended run.
        timings: (method, budget) -> seconds per verdict.
        sampling_s: budget -> seconds per sampled run of that many steps.
        failures: (entry, reason) for runs that returned no samples.
        wall_time_s: seconds for the whole measurement.
    """

    budgets: tuple[int, ...]
    seeds: dict[int, int]
    false_alarm_seeds: int
    false_alarm_budget: int
    grid: dict[tuple[str, int, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    false_alarms: dict[tuple[str, str], Tally] = field(default_factory=lambda: defaultdict(Tally))
    timings: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    sampling_s: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    failures: list[tuple[str, str]] = field(default_factory=list)
    wall_time_s: float = 0.0


def seeds_per_budget(budgets: Sequence[int], seeds: int, seeds_at_largest: int) -> dict[int, int]:
    """Budget -> seeds: ``seeds`` for all but the largest, ``min(seeds, seeds_at_largest)`` for
    the largest (a single budget gets ``seeds``)."""
    ordered = sorted(budgets)
    counts = dict.fromkeys(ordered, seeds)
    if len(ordered) > 1:
        counts[ordered[-1]] = min(seeds, seeds_at_largest)
    return counts


def measure_entry(
    name: str,
    budgets: Sequence[int],
    seeds: Mapping[int, int],
    false_alarm_seeds: int,
    false_alarm_budget: int,
) -> Measurement:
    """One tree entry's grid cells (and, for a sampled control, its extended false-alarm run)."""
    entry = MUTANTS[name]
    ordered = tuple(sorted(budgets))
    measurement = Measurement(ordered, dict(seeds), false_alarm_seeds, false_alarm_budget)
    if isinstance(entry.case, GreedyTreeCase):
        for method, detected in greedy_verdicts(entry).items():
            if detected is not None:
                measurement.grid[name, 0, method].add(detected)
        return measurement
    assert isinstance(entry.case, TreeCase)
    tree_assertions(entry.case)  # the pilot and exact laws, once per case, outside the timings
    for index in range(max(seeds.values())):
        seed = entry_seed(name, index, "grid")
        used = [budget for budget in ordered if index < seeds[budget]]
        began = time.perf_counter()
        samples = sample_entry(entry, max(used), seed)
        measurement.sampling_s[max(used)].append(time.perf_counter() - began)
        began = time.perf_counter()
        structural = structural_verdict(entry, seed)
        structural_s = time.perf_counter() - began
        for budget in used:
            measurement.grid[name, budget, "sglang-structural"].add(structural)
            measurement.timings["sglang-structural", budget].append(structural_s)
            if isinstance(samples, str):
                measurement.failures.append((name, samples))
                for method in METHODS:
                    if method not in BUDGET_FREE:
                        measurement.grid[name, budget, method].add(True)
                continue
            part = prefix(samples, budget)
            for method in METHODS:
                if method in BUDGET_FREE:
                    continue
                began = time.perf_counter()
                detected = verdict(method, part, entry.adapter.name, seed)
                measurement.timings[method, budget].append(time.perf_counter() - began)
                measurement.grid[name, budget, method].add(detected)
    for index in range(0 if entry.lossy else false_alarm_seeds):
        seed = entry_seed(name, index, "false-alarm")
        samples = sample_entry(entry, false_alarm_budget, seed)
        measurement.false_alarms[name, "sglang-structural"].add(structural_verdict(entry, seed))
        for method in METHODS:
            if method in BUDGET_FREE:
                continue
            detected = True if isinstance(samples, str) else verdict(
                method, samples, entry.adapter.name, seed)
            measurement.false_alarms[name, method].add(detected)
    return measurement


def _merge(into: Measurement, part: Measurement) -> None:
    for key, tally in part.grid.items():
        into.grid[key].merge(tally)
    for fa_key, tally in part.false_alarms.items():
        into.false_alarms[fa_key].merge(tally)
    for time_key, seconds in part.timings.items():
        into.timings[time_key] += seconds
    for budget, seconds in part.sampling_s.items():
        into.sampling_s[budget] += seconds
    into.failures += part.failures


def measure(
    entries: Iterable[Mutant],
    budgets: Sequence[int],
    seeds: Mapping[int, int],
    false_alarm_seeds: int,
    false_alarm_budget: int,
    jobs: int = 1,
    show_progress: bool = True,
) -> Measurement:
    """Run the whole grid and the controls' false-alarm runs (see the module docstring), one
    entry per task; ``jobs`` > 1 spreads entries over processes (the result does not depend on
    ``jobs``), ``jobs`` = 1 runs them in this process."""
    chosen = list(entries)
    ordered = tuple(sorted(budgets))
    measurement = Measurement(ordered, dict(seeds), false_alarm_seeds, false_alarm_budget)
    began = time.perf_counter()
    arguments = (ordered, dict(seeds), false_alarm_seeds, false_alarm_budget)
    parts: dict[str, Measurement] = {}

    def report(name: str) -> None:
        if show_progress:
            print(f"[{time.perf_counter() - began:7.1f} s] done: {name} "
                  f"({len(parts)}/{len(chosen)})", flush=True)

    if jobs <= 1:
        # One intra-op thread, as in the workers: on a shared machine torch's spinning threads
        # slow the small tensor ops of the tree walks by an order of magnitude.
        torch.set_num_threads(1)
        for entry in chosen:
            parts[entry.name] = measure_entry(entry.name, *arguments)
            report(entry.name)
    else:
        # Fresh interpreters ("spawn"): forking a process whose torch thread pool is running
        # can deadlock the children.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=jobs, mp_context=context, initializer=torch.set_num_threads,
            initargs=(1,),
        ) as pool:
            futures = {pool.submit(measure_entry, e.name, *arguments): e for e in chosen}
            for future in concurrent.futures.as_completed(futures):
                parts[futures[future].name] = future.result()
                report(futures[future].name)
    for entry in chosen:  # merge in zoo order, so that the record does not depend on timing
        _merge(measurement, parts[entry.name])
    measurement.wall_time_s = time.perf_counter() - began
    return measurement


METHOD_DESCRIPTIONS = {
    "ours": (
        "Structure of every output (exact); law of the next emitted token at every class of "
        "reached nodes (Cressie-Read identity test, classes reached in >= 20% of a fixed "
        "reference pilot, the rarer classes pooled into one test of their tokens' randomized "
        "PIT, tokens with p = 0 exact at every class); share of steps reaching "
        "each depth vs the scheme's exact law, and depth 1 vs the optimal-transport bound "
        "(exact binomial); independence of paired trees of one call; family-wise false-alarm "
        "rate 1e-3 split Bonferroni over the case's statistical assertions. Greedy: exact "
        "agreement with greedy decoding along every tree (`check_tree_greedy`; SUBOPTIMAL, "
        "fewer accepted tokens, is not a loss).",
        "this project (`losslessness/checks/tree_*.py`)",
    ),
    "sglang-structural": (
        "Two hand-built trees (V = 20), one-hot targets (softmax of logits 1 and 10 at "
        "temperature 0.01), random coins, exact expected emitted tokens and accepted nodes; "
        "fails iff the output differs. Draft probabilities uniform (SGLang's target-only "
        "kernel ignores them; the protocol needs a distribution); the entry's own draft "
        "scheme. Deterministic for a lossless verifier: no samples, no budget.",
        "[sglang sgl-kernel/tests/test_speculative_sampling.py]"
        "(https://github.com/sgl-project/sglang/blob/main/sgl-kernel/tests/"
        "test_speculative_sampling.py) `test_tree_speculative_sampling_target_only`",
    ),
    "first-token-chi-square": (
        f"Pearson chi-square of the first emitted token (the accepted root child's token, or "
        f"the root's final token) against p at the root, cells with expected count < 5 "
        f"merged, at level {FIRST_TOKEN_LEVEL:g} (one assertion); an emitted token with p = 0 "
        f"fails it when its merged bin expects nothing. Sees neither deeper nodes nor "
        f"acceptance.",
        "the textbook goodness-of-fit test of a sampler (`benchmarks/tree_peers.py`)",
    ),
}

EXPLANATIONS: dict[str, str] = {}
"""Lossy mutant -> why a peer beats ours there, written from a measured run; a mutant without
an entry is reported as unexplained."""

TEMPLATE = """\
## Tree verification: detection rates

Generated by `benchmarks/tree_detection_rates.py` ({{ command }}) on {{ started }}, run seed
{{ run_seed }}, in {{ "%.0f" | format(m.wall_time_s) }} s on {{ machine }}. Do not edit by hand:
re-run the script (it replaces only this section, between its marker comments).

Every method decides on each tree entry of the zoo (`losslessness.zoo.tree`,
`mutant/tree-<name>`) on that entry's own case. Budgets {{ m.budgets | join(", ") }} tree
verification steps are nested prefixes of one run per seed; {{ seeds_text }}. A cell reads
`rate (detections/trials)`: the detection rate (power) for lossy mutants, the false-alarm rate
for the lossless controls. The steps are drawn in calls of {{ batch }} trees (the cases' calls
carry 64): every zoo verifier treats the trees of a call independently, so the samples' law is
the same, and the checks see the case itself. `sglang-structural` reads no samples (its inputs
are fixed): one verdict per seed, shown in every budget column. Greedy entries are
deterministic: one verdict, shown in every budget column; the chi-square does not apply (`n/a`).
{% if largest_note %}
{{ largest_note }}
{% endif %}
### Tree summary

Lossy tree mutants detected in at least 90% of runs (of {{ lossy_count }}; greedy ones count
where the method applies) and false-alarm rate on the sampled lossless controls, per budget:

| method | {% for budget in m.budgets %}n = {{ budget }} | {% endfor %}
|---|{% for budget in m.budgets %}---|{% endfor %}
{% for method in methods -%}
| `{{ method }}` |{% for budget in m.budgets %} {{ summary(method, budget) }} |{% endfor %}
{% endfor %}
### Tree methods

| method | what it tests | source |
|---|---|---|
{% for name, (what, source) in descriptions.items() -%}
| `{{ name }}` | {{ what }} | {{ source }} |
{% endfor %}
What each peer cannot see, by construction (not measured): with one-hot targets every
lossless rule, and every wrong rule that is right whenever p puts all its mass on one token,
gives the same output, so `sglang-structural` sees only mechanisms that change the output on
one-hot targets (a final token drawn from the wrong row, a wrong child followed); since it
compares the accepted nodes too, it also fails a lossless verifier that accepts fewer drafts.
`first-token-chi-square` reads one token per step, emitted at the root: a mechanism acting
only at deeper nodes leaves it unchanged.
{% for budget in m.budgets %}
### Tree detection rates at n = {{ budget }} verification steps

| entry | kind | scheme | {% for method in methods %}`{{ method }}` | {% endfor %}
|---|---|---|{% for method in methods %}---|{% endfor %}
{% for entry in entries -%}
| [{{ entry.name }}]({{ entry.source }}) | {{ kind(entry) }} | {{ scheme(entry) }} |
{%- for method in methods %} {{ cell(entry, budget, method) }} |{% endfor %}
{% endfor %}
{% endfor %}
### False-alarm rates on the lossless tree controls

From the grid, the sampled controls pooled, with 95% Clopper-Pearson intervals:

| method | {% for budget in m.budgets %}n = {{ budget }} | {% endfor %}
|---|{% for budget in m.budgets %}---|{% endfor %}
{% for method in methods -%}
| `{{ method }}` | {% for budget in m.budgets %}{{ pooled(method, budget) }} | {% endfor %}
{% endfor %}
Extended run: {{ m.false_alarm_seeds }} seeds per sampled control at n =
{{ m.false_alarm_budget }}. Our nominal rate is 1e-3 per verdict (the family-wise budget of
one case), the chi-square's 1e-3 (one test): {{ m.false_alarm_seeds }} seeds per control can
only bound them; the interval, not the point estimate, is the result.

| method | {% for control in controls %}{{ control.name }} | {% endfor %}all controls (95% CI) |
|---|{% for control in controls %}---|{% endfor %}---|
{% for method in methods -%}
| `{{ method }}` |
{%- for control in controls %} {{ extended(control.name, method) }} |{% endfor %}
{{- " " ~ extended_pooled(method) }} |
{% endfor %}
{% if greedy_controls %}
The greedy controls ({{ greedy_controls | join(", ") }}) are deterministic, one verdict each
(in the tables above), not counted in the rates above: {{ greedy_alarms }}.
{% endif %}
### Tree time per verdict

Mean wall time of one verdict (sampling excluded; it is shared by the methods that read
samples), measured during this run on a shared machine; sampling one run took on average
{{ sampling }}.

| method | {% for budget in m.budgets %}n = {{ budget }} | {% endfor %}
|---|{% for budget in m.budgets %}---|{% endfor %}
{% for method in methods -%}
| `{{ method }}` | {% for budget in m.budgets %}{{ timing(method, budget) }} | {% endfor %}
{% endfor %}
### Where a tree peer beats us

Cells where a peer's detection rate on a lossy tree mutant is significantly above ours
(one-sided Fisher exact test, p < 0.05), with that peer's false-alarm rate at the same budget
on the controls (from the grid).
{% if not beaten %}
None: at every budget and on every lossy tree mutant, no peer's detection rate is
significantly above ours.
{% endif %}
{% for name, rows in beaten.items() %}
#### {{ name }}

{% for row in rows -%}
- n = {{ row.budget }}: `{{ row.method }}` {{ row.peer }} vs ours {{ row.ours }}; its
  false-alarm rate on the controls at this budget {{ row.false_alarm }}.
{% endfor %}
{{ explanation(name) }}
{% endfor %}
{% if failures %}
### Tree runs that returned no samples

Counted as detected by every method that reads samples (a malformed output or a crash fails
every test suite):

{% for name, reason in failures -%}
- {{ name }}: {{ reason }}
{% endfor %}
{% endif %}
"""


def beaten_cells(m: Measurement, entries: Sequence[Mutant]) -> list[tuple[str, int, str]]:
    """(lossy sampled tree mutant, budget, peer) where the peer's detection rate is significantly
    above ours (:func:`peer_beats_ours`), in entry, budget and method order."""
    cells = []
    for entry in entries:
        if not entry.lossy or isinstance(entry.case, GreedyTreeCase):
            continue
        for budget in m.budgets:
            ours = m.grid.get((entry.name, budget, "ours"), Tally())
            for method in PEERS:
                peer = m.grid.get((entry.name, budget, method), Tally())
                if peer.trials and ours.trials and peer_beats_ours(ours, peer):
                    cells.append((entry.name, budget, method))
    return cells


def render_markdown(m: Measurement, entries: Sequence[Mutant], command: str, started: str) -> str:
    """The Markdown tree section of a measurement (jinja2 template :data:`TEMPLATE`), without
    its markers."""
    controls = [e for e in entries if not e.lossy and isinstance(e.case, TreeCase)]
    greedy_controls = [e.name for e in entries
                       if not e.lossy and isinstance(e.case, GreedyTreeCase)]

    def budget_key(entry: Mutant, budget: int) -> int:
        return 0 if isinstance(entry.case, GreedyTreeCase) else budget

    def cell(entry: Mutant, budget: int, method: str) -> str:
        return format_tally(m.grid.get((entry.name, budget_key(entry, budget), method), Tally()))

    def pooled_tally(method: str, budget: int) -> Tally:
        total = Tally()
        for control in controls:
            total.merge(m.grid.get((control.name, budget, method), Tally()))
        return total

    def extended_pooled(method: str) -> str:
        total = Tally()
        for control in controls:
            total.merge(m.false_alarms.get((control.name, method), Tally()))
        return format_tally_ci(total)

    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    beaten: dict[str, list[dict[str, str]]] = defaultdict(list)
    for name, budget, method in beaten_cells(m, entries):
        beaten[name].append(
            {
                "budget": str(budget),
                "method": method,
                "peer": format_tally(m.grid[name, budget, method]),
                "ours": format_tally(m.grid[name, budget, "ours"]),
                "false_alarm": format_tally_ci(pooled_tally(method, budget)),
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

    greedy_alarms = "; ".join(
        f"`{method}` alarms on "
        f"{sum(m.grid.get((name, 0, method), Tally()).detected for name in greedy_controls)} "
        f"of {len(greedy_controls)}"
        for method in METHODS
        if any(m.grid.get((name, 0, method), Tally()).trials for name in greedy_controls)
    )
    counts = sorted(set(m.seeds.values()), reverse=True)
    if len(counts) == 1:
        seeds_text = f"{counts[0]} independent seeds per cell"
    else:
        seeds_text = "independent seeds per cell: " + ", ".join(
            f"{m.seeds[budget]} at n = {budget}" for budget in m.budgets
        )
    largest = m.budgets[-1]
    largest_note = ""
    if m.seeds[largest] < max(m.seeds.values()):
        largest_note = (
            f"n = {largest} runs on {m.seeds[largest]} seeds only (one run of {largest} tree "
            f"steps took {np.mean(m.sampling_s[largest]):.1f} s per entry on average here); "
            f"its rates are coarse (a rate of 1.00 on {m.seeds[largest]} "
            f"seeds bounds the true one only above "
            f"{clopper_pearson(m.seeds[largest], m.seeds[largest])[0]:.2f} at 95%)."
            if m.sampling_s.get(largest) else ""
        )
    sampling = ", ".join(
        f"{float(np.mean(m.sampling_s[budget])):.1f} s at n = {budget}"
        for budget in m.budgets if m.sampling_s.get(budget)
    )
    return environment.from_string(TEMPLATE).render(
        m=m,
        command=command,
        started=started,
        run_seed=RUN_SEED,
        machine=(f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores shared with "
                 f"other jobs, torch {torch.__version__}"),
        descriptions=METHOD_DESCRIPTIONS,
        methods=METHODS,
        entries=entries,
        controls=controls,
        greedy_controls=greedy_controls,
        greedy_alarms=greedy_alarms,
        kind=lambda e: (
            ("lossy" if e.lossy else "control")
            + (" (greedy)" if isinstance(e.case, GreedyTreeCase) else "")
        ),
        scheme=lambda e: "greedy" if isinstance(e.case, GreedyTreeCase) else e.case.draft_scheme,
        cell=cell,
        pooled=lambda method, budget: format_tally_ci(pooled_tally(method, budget)),
        extended=lambda name, method: format_tally(m.false_alarms.get((name, method), Tally())),
        extended_pooled=extended_pooled,
        timing=timing,
        sampling=sampling,
        beaten=dict(beaten),
        explanation=explanation,
        summary=summary,
        seeds_text=seeds_text,
        largest_note=largest_note,
        batch=SAMPLING_BATCH,
        lossy_count=sum(e.lossy for e in entries),
        failures=sorted(set(m.failures)),
    )


def splice_section(document: str, section: str) -> str:
    """``document`` with the text between :data:`BEGIN_MARKER` and :data:`END_MARKER`
    replaced by ``section`` (markers kept), or with the marked section appended at the end when
    the markers are absent; everything outside the markers is kept byte for byte.

    Raises:
        ValueError: naming ``document``, when it holds one marker without the other, or the end
            marker before the begin marker.
    """
    begin = document.find(BEGIN_MARKER)
    end = document.find(END_MARKER)
    block = f"{BEGIN_MARKER}\n\n{section.strip()}\n\n{END_MARKER}\n"
    if begin < 0 and end < 0:
        separator = "" if not document or document.endswith("\n\n") else (
            "\n" if document.endswith("\n") else "\n\n")
        return document + separator + block
    if begin < 0 or end < 0 or end < begin:
        raise ValueError("document: the tree section's markers are unbalanced or out of order")
    tail = document[end + len(END_MARKER):]
    return document[:begin] + block + tail.lstrip("\n")


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, run the measurement, write the tree section of the Markdown report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS))
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="seeds per cell")
    parser.add_argument("--seeds-at-largest", type=int, default=None,
                        help="seeds of the largest budget's cells (default: --seeds)")
    parser.add_argument(
        "--false-alarm-seeds",
        type=int,
        default=DEFAULT_FALSE_ALARM_SEEDS,
        help="seeds per sampled control for the extended false-alarm run",
    )
    parser.add_argument(
        "--false-alarm-budget", type=int, default=None, help="steps per false-alarm verdict"
    )
    tree_names = [entry.name for entry in tree_entries()]
    parser.add_argument("--entries", nargs="*", default=None,
                        help="tree zoo names (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one entry each)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--save", type=Path, default=None,
                        help="also pickle the measurement here (for --render-from)")
    parser.add_argument("--render-from", type=Path, default=None,
                        help="render a measurement saved by --save instead of measuring")
    arguments = parser.parse_args(argv)
    if arguments.render_from is not None:
        with arguments.render_from.open("rb") as handle:
            saved = pickle.load(handle)  # a file this script wrote (--save)
        write_section(arguments.out, saved["measurement"],
                      [MUTANTS[name] for name in saved["entries"]], saved["command"],
                      saved["started"])
        return
    if any(budget < 1 for budget in arguments.budgets):
        parser.error("--budgets: every budget must be >= 1")
    if arguments.seeds_at_largest is None:
        arguments.seeds_at_largest = arguments.seeds
    if arguments.seeds < 1 or arguments.seeds_at_largest < 1 or arguments.false_alarm_seeds < 0:
        parser.error("--seeds and --seeds-at-largest must be >= 1, --false-alarm-seeds >= 0")
    unknown = sorted(set(arguments.entries or ()) - set(tree_names))
    if unknown:
        parser.error(f"--entries: unknown {unknown}; known: {', '.join(tree_names)}")
    entries = [MUTANTS[name] for name in (arguments.entries or tree_names)]
    false_alarm_budget = arguments.false_alarm_budget or min(arguments.budgets)
    seeds = seeds_per_budget(arguments.budgets, arguments.seeds, arguments.seeds_at_largest)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(
        f"run seed {RUN_SEED}; budgets {sorted(arguments.budgets)}; seeds {seeds}; "
        f"{arguments.false_alarm_seeds} false-alarm seeds per control at n = {false_alarm_budget}"
    )
    measurement = measure(
        entries,
        arguments.budgets,
        seeds,
        arguments.false_alarm_seeds,
        false_alarm_budget,
        jobs=arguments.jobs,
        show_progress=not arguments.no_progress,
    )
    command = (
        f"`PYTHONPATH=. python benchmarks/tree_detection_rates.py --budgets "
        f"{' '.join(map(str, measurement.budgets))} --seeds {arguments.seeds} "
        f"--seeds-at-largest {arguments.seeds_at_largest} "
        f"--false-alarm-seeds {arguments.false_alarm_seeds} "
        f"--false-alarm-budget {false_alarm_budget} --jobs {arguments.jobs}"
        + (f" --entries {' '.join(arguments.entries)}" if arguments.entries else "")
        + "`"
    )
    if arguments.save is not None:
        with arguments.save.open("wb") as handle:
            pickle.dump({"measurement": measurement, "entries": [e.name for e in entries],
                         "command": command, "started": started}, handle)
    write_section(arguments.out, measurement, entries, command, started)


def write_section(
    out: Path, measurement: Measurement, entries: Sequence[Mutant], command: str, started: str
) -> None:
    """Render ``measurement`` and splice it into ``out`` (:func:`splice_section`), creating
    the file when absent."""
    text = render_markdown(measurement, entries, command, started)
    section = "\n".join(line.rstrip() for line in text.splitlines())
    out.parent.mkdir(parents=True, exist_ok=True)
    existing = out.read_text() if out.exists() else ""
    out.write_text(splice_section(existing, section))
    print(f"wrote the tree section of {out} (measured in {measurement.wall_time_s:.0f} s)")


if __name__ == "__main__":
    main()
