"""What the property suite's tests share: the budget, the case strategy, running the checks on
one Hypothesis example, and the failure message (check, position, case, seed, replay)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import event, note, settings
from hypothesis import strategies as st

import strategies as project_strategies
from losslessness.adapters import Adapter
from losslessness.cases import ChainCase
from losslessness.checks import run_chain_checks
from losslessness.checks.ids import SUITE_CHECK_ID
from losslessness.engine.draw import sample_chain
from losslessness.reference.block import declared_verification
from losslessness.results import CheckContext, CheckResult, Verdict
from losslessness.seeding import derive_seed
from losslessness.stats import SUITE_FAMILY_WISE_ALPHA

MAX_VOCAB = 300
"""Largest V of a generated chain case: large enough for the residual to spread over far more
than 16 tokens and for hundreds of masses below 1e-3, small enough to sample fast."""

SMALL_VOCAB = 16
"""Cases are drawn half from V in [1, SMALL_VOCAB] (readable, shrink well) and half from
V in (SMALL_VOCAB, MAX_VOCAB] (regimes that need many tokens)."""

MAX_K = 4
"""Largest draft length of a generated chain case."""

MAX_BATCH = 2
"""Most distinct row types in one generated chain case."""

SUITE_DTYPES = (torch.float64, torch.float32)
"""Input dtypes of generated chain cases. The chain protocol's rows sum to 1 within 1e-5
(docs/architecture.md, 'Protocols'), which float16 and bfloat16 rows miss (measured up to 2e-3);
precision checks for those dtypes belong to the GPU/precision battery."""

STEPS_PER_ROW = 4000
"""Verification steps per row type and example."""

CHAIN_ASSERTIONS_PER_EXAMPLE = MAX_BATCH * ((MAX_K + 1) + MAX_K + 1)
"""Statistical assertions one chain example makes at most: per row type, an identity test per
position (k+1), an acceptance test per draft position (k) and one independence test."""

TREE_LAW_CLASSES = 8
"""Most depth-1 classes (distinct tokens of the first accepted node) whose next-token law one
tree example tests, the most reached first."""

TREE_ASSERTIONS_PER_EXAMPLE = 1 + TREE_LAW_CLASSES
"""Statistical assertions one tree example makes at most: the law of the first token at the
root and the law after each of at most :data:`TREE_LAW_CLASSES` depth-1 classes."""

TREE_WITNESS_EXAMPLES = 4
"""Explicit examples the tree test runs besides the generated ones
(:data:`losslessness.suite.tree_support.TREE_WITNESS_CASES`), whatever the profile."""

CHAIN_WITNESS_CASES: tuple[ChainCase, ...] = (
    ChainCase(
        "witness-peaked",
        "V=3 k=2 B=1 witness: q peaked where p is small",
        torch.tensor([[[0.6, 0.3, 0.1], [0.05, 0.5, 0.45], [0.7, 0.2, 0.1]]], dtype=torch.float64),
        torch.tensor([[[0.05, 0.8, 0.15], [0.7, 0.05, 0.25]]], dtype=torch.float64),
        frozenset({"witness"}),
    ),
    ChainCase(
        "witness-tiny-masses",
        "V=32 k=0 B=1 witness: 30 target masses of 1e-5",
        torch.tensor([[[0.6, 0.3997] + [1e-5] * 30]], dtype=torch.float64),
        torch.zeros((1, 0, 32), dtype=torch.float64),
        frozenset({"witness", "skewed"}),
    ),
)
"""Explicit examples of the chain test, run by every profile before the generated ones.

``witness-peaked``: k = 2 at V = 3 with q putting most of its mass where p puts little at both
draft positions, so rejections are frequent and follow an accepted draft of low target weight.
There a correction drawn from the wrong residual after an accepted prefix (block verification's
token-level residual instead of the block residual, vllm-ascend issue 7807) is off at position
1 (p-value 2e-19 at the suite's 4,000 steps), while random cases rarely reach it: the ci
profile's 25 examples missed that mutant.

``witness-tiny-masses``: k = 0 at V = 32 with 30 target masses of 1e-5 (3e-4 in all). A
"numerical safety" floor on the target (every positive mass raised to 1e-3 and renormalised,
as vLLM PR 13933 clamped the residual) moves about 3% of the mass onto them, which the law
check sees at once; random cases reach such a tail only now and then, so whether the ci
profile's derandomised examples found that mutant depended on the hash of the test's source
(found at once at one revision, after ten minutes of Hypothesis's target phase at the next).

Counted in the suite's budget."""

SUITE_ASSERTIONS_PER_EXAMPLE = CHAIN_ASSERTIONS_PER_EXAMPLE + TREE_ASSERTIONS_PER_EXAMPLE
"""Statistical assertions of one example of every statistical suite test (chain and tree): the
union bound splits :data:`SUITE_FAMILY_WISE_ALPHA` over ``max_examples`` times this, whichever
targets a run names, so a run with both a chain and a tree target stays within the budget."""


@dataclass(frozen=True)
class SuiteBudget:
    """The suite's false-alarm budget under the active Hypothesis profile.

    Attributes:
        profile: the settings profile's name.
        max_examples: generated examples per test.
        assertions: ``max_examples * SUITE_ASSERTIONS_PER_EXAMPLE`` (chain and tree tests)
            plus ``TREE_WITNESS_EXAMPLES * TREE_ASSERTIONS_PER_EXAMPLE`` and
            ``len(CHAIN_WITNESS_CASES) * CHAIN_ASSERTIONS_PER_EXAMPLE`` (the explicit
            examples of the tree and chain tests).
        per_assertion_alpha: ``SUITE_FAMILY_WISE_ALPHA / assertions`` (Bonferroni).
    """

    profile: str
    max_examples: int
    assertions: int
    per_assertion_alpha: float


def suite_budget() -> SuiteBudget:
    """The budget for the profile loaded now (call it after the profile is loaded)."""
    max_examples = int(settings().max_examples)
    assertions = (
        max_examples * SUITE_ASSERTIONS_PER_EXAMPLE
        + TREE_WITNESS_EXAMPLES * TREE_ASSERTIONS_PER_EXAMPLE
        + len(CHAIN_WITNESS_CASES) * CHAIN_ASSERTIONS_PER_EXAMPLE
    )
    profile = str(getattr(settings, "_current_profile", None) or "default")
    return SuiteBudget(profile, max_examples, assertions, SUITE_FAMILY_WISE_ALPHA / assertions)


@st.composite
def suite_chain_cases(draw: st.DrawFn) -> ChainCase:
    """A chain case for the suite: V small (readable) or large (many-token regimes), k in
    0..MAX_K, 1..MAX_BATCH row types, each (p_i, q_i) from
    :func:`strategies.target_draft_pairs` and the bonus p_k from
    :func:`strategies.probability_vectors`, all regimes and relations allowed, cast to one of
    :data:`SUITE_DTYPES` (the checks test against the law the cast rows stand for)."""
    large = draw(st.booleans())
    vocab = draw(st.integers(SMALL_VOCAB + 1, MAX_VOCAB) if large else st.integers(1, SMALL_VOCAB))
    k = draw(st.integers(0, MAX_K))
    rows = draw(st.integers(1, MAX_BATCH))
    targets, drafts = [], []
    for _ in range(rows):
        pairs = [draw(project_strategies.target_draft_pairs(vocab)) for _ in range(k)]
        bonus = draw(project_strategies.probability_vectors(vocab))
        targets.append(torch.stack([p for p, _ in pairs] + [bonus]))
        drafts.append(torch.stack([q for _, q in pairs]) if k else torch.zeros((0, vocab)))
    dtype = draw(st.sampled_from(SUITE_DTYPES))
    target_probs = project_strategies.renormalise_then_cast(torch.stack(targets), dtype)
    draft_probs = project_strategies.renormalise_then_cast(torch.stack(drafts), dtype)
    event(f"V {'> ' if large else '<= '}{SMALL_VOCAB}")
    event(f"dtype={str(dtype).removeprefix('torch.')}")
    summary = f"V={vocab} k={k} B={rows}" + ("" if dtype is torch.float64 else f" {dtype}")
    return ChainCase("hypothesis", summary, target_probs, draft_probs)


def _shorten(vector: torch.Tensor, shown: int = 6) -> str:
    values = ", ".join(f"{float(x):.3g}" for x in vector[:shown])
    more = f", ... ({vector.numel()} values)" if vector.numel() > shown else ""
    return f"[{values}{more}]"


def failure_message(case: ChainCase, result: CheckResult, budget: SuiteBudget, replay: str) -> str:
    """The message of a failed assertion: check, position, case (p, q shortened), seed and a
    one-line replay command."""
    lines = [
        f"losslessness: {result.verdict.value} {result.check_id}"
        + (f" at position {result.position}" if result.position is not None else "")
        + (f", row {result.row}" if result.row is not None else "")
        + f" ({case.summary})"
    ]
    if result.p_value is not None and result.kind.value == "statistical":
        lines.append(
            f"  p-value {result.p_value:.3g} <= alpha {result.alpha:.3g} (family-wise "
            f"{SUITE_FAMILY_WISE_ALPHA:g} over {budget.assertions} assertions, profile "
            f"{budget.profile})"
        )
    row = result.row or 0
    position = result.position or 0
    lines.append(f"  p_{position} = {_shorten(case.target_probs[row, position])}")
    if position < case.k:
        lines.append(f"  q_{position} = {_shorten(case.draft_probs[row, position])}")
    lines.append(f"  {result.message}")
    lines.append(f"  seed {result.seed} (derived from the case hash {case.case_hash})")
    lines.append(f"  replay: {replay}")
    return "\n".join(lines)


def run_chain_example(
    adapter: Adapter, case: ChainCase, replay: str, timeout_s: float | None = None
) -> None:
    """Run every chain check on one case and fail on the first LOSSY result; each verifier
    call may take ``timeout_s`` seconds (None: no limit).

    Raises:
        AssertionError: with :func:`failure_message` of the first LOSSY result.
        TargetTimeout: a call took longer than ``timeout_s``.
    """
    assert adapter.chain is not None
    budget = suite_budget()
    seed = derive_seed(0, SUITE_CHECK_ID, case.case_hash)
    note(f"case {case.summary}, hash {case.case_hash}, seed {seed}")
    samples = sample_chain(adapter.chain, case, STEPS_PER_ROW, seed, timeout_s=timeout_s)
    context = CheckContext.for_case(
        adapter.name, case, alpha=budget.per_assertion_alpha, power=0.9, tv=0.1, seed=seed
    )
    results = run_chain_checks(
        samples,
        dataclasses.replace(context, sampling_time_s=samples.wall_time_s),
        declared_verification(adapter.chain),
    )
    for result in results:
        if result.verdict is Verdict.SUBOPTIMAL:
            warnings.warn(
                f"losslessness: SUBOPTIMAL {result.check_id} ({case.summary}): {result.message}",
                stacklevel=2,
            )
    lossy = [result for result in results if result.verdict is Verdict.LOSSY]
    if lossy:
        raise AssertionError(failure_message(case, lossy[0], budget, replay))


def greedy_failure(
    logits: torch.Tensor, drafts: torch.Tensor, expected: np.ndarray, got: np.ndarray, replay: str
) -> str | None:
    """The message for the first row where a greedy verifier differs from the reference, or
    None when every row agrees."""
    differs = np.flatnonzero((expected != got).any(axis=1))
    if differs.size == 0:
        return None
    b = int(differs[0])
    i = int(np.flatnonzero(expected[b] != got[b])[0])
    row = logits[b, min(i, logits.shape[1] - 1)]
    tied = int((row == row.max()).sum())
    return "\n".join(
        [
            f"losslessness: LOSSY greedy at position {i}, row {b} "
            f"(V={logits.shape[2]} k={drafts.shape[1]} B={logits.shape[0]})",
            f"  logits_{i} = {_shorten(row)}"
            + (f" ({tied}-way tie at the maximum)" if tied > 1 else ""),
            f"  drafts {drafts[b].tolist()}: expected {expected[b].tolist()}, "
            f"got {got[b].tolist()}",
            f"  replay: {replay}",
        ]
    )
