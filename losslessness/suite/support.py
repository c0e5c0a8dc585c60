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

SUITE_DTYPES = ("float64", "float32", "bfloat16")
"""Input dtypes of generated chain cases (:attr:`ChainCase.dtype`): the rows are built in
float64 and the verifier receives them cast (:attr:`ChainCase.input_target_probs`); the checks
test against the law of the cast rows (:func:`losslessness.laws.law_after_cast`), so a correct
verifier passes at every dtype and one that is wrong only in one precision fails there."""

CALL_BATCH_MODES = ("full", "full", "one", "distinct", "small")
"""How a generated chain case calls the verifier (:attr:`ChainCase.call_batch_size`), drawn
uniformly (shrinking towards ``full``): ``full`` fills every call with copies of the row types
(hundreds of rows), ``one`` calls one row at a time (B = 1), ``distinct`` calls the row types
once each (B = R: with two row types, every call a batch of distinct rows), ``small`` calls
B in ``[2, SMALL_CALL_BATCH]`` rows of the stream of row types. A verifier can be wrong only
in small batches (a path dispatched on B) or only on batches without duplicate rows."""

SMALL_CALL_BATCH = 15
"""Largest B of the ``small`` call mode: below the 16 rows where engines switch kernels or
CUDA graphs (vllm-ascend PR 13470's padded-batch path)."""

STEPS_PER_ROW = 4000
"""Verification steps per row type and example (fewer when the case's calls are small:
:data:`MAX_CALLS`)."""

MAX_CALLS = 500
"""Most verifier calls one chain example makes: a case called in small batches takes
``min(STEPS_PER_ROW, MAX_CALLS * B // R)`` steps per row type (500 at B = 1 and one row
type), so that one example costs at most about half a second of a fast verifier's calls; the
power left is stated by each result's minimum detectable TV, and the witnesses' mutants stay
far above it."""

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
    ChainCase(
        "witness-b1",
        "V=3 k=1 B=1 witness: one row per call, q far from p",
        torch.tensor([[[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]], dtype=torch.float64),
        torch.tensor([[[0.1, 0.2, 0.7]]], dtype=torch.float64),
        frozenset({"witness", "small-batch"}),
        call_batch_size=1,
    ),
    ChainCase(
        "witness-distinct",
        "V=3 k=1 B=2 witness: every call two distinct rows",
        torch.tensor(
            [[[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], [[0.1, 0.2, 0.7], [0.5, 0.4, 0.1]]],
            dtype=torch.float64,
        ),
        torch.tensor([[[0.05, 0.15, 0.8]], [[0.8, 0.15, 0.05]]], dtype=torch.float64),
        frozenset({"witness", "distinct-rows"}),
        call_batch_size=2,
    ),
    ChainCase(
        "witness-float32",
        "V=3 k=1 B=1 witness: float32 inputs, q far from p",
        torch.tensor([[[0.55, 0.35, 0.1], [0.3, 0.3, 0.4]]], dtype=torch.float64),
        torch.tensor([[[0.15, 0.15, 0.7]]], dtype=torch.float64),
        frozenset({"witness", "float32"}),
        dtype="float32",
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

The call-condition witnesses (issue 21): a verifier may be lossy only under one way of being
called, which random draws reach only with the right mode, dtype and rows together.
``witness-b1`` calls one row at a time with q far from p (rejections 60% of steps): a
small-batch path that draws the correction from p instead of the residual (the zoo's
``small-batch-correction-from-target``, vllm-ascend PR 13470) moves 0.14 of the position-0 law (TV).
``witness-distinct`` calls two rows of opposite laws together in every call (every batch
distinct): a verifier that reads p and q of another row when no row repeats (the zoo's
``distinct-rows-index-mixup``, TensorRT-LLM PR 12588) accepts the other row's drafts
(their content order is the reverse of the batch's, so the mix-up swaps them).
``witness-float32`` gives float32 inputs with q far from p: a float32-only correction that
compares the uniform with the unnormalised residual CDF (the zoo's
``float32-residual-unnormalised``, FlashInfer PR 221) puts 0.4 of the correction on the last
token.

Counted in the suite's budget."""

SERVING_MAX_VOCAB = 12
"""Largest V of a generated serving case: an engine profile's law costs about 0.5 ms a
position (its processors run in torch per row), so the serving examples stay small."""

SERVING_MAX_K = 3
"""Largest draft block of a generated serving case."""

SERVING_MAX_KINDS = 3
"""Most row kinds (distinct requests) in one generated serving case."""

SERVING_MAX_COPIES = 2
"""Most rows of each kind per call of a generated serving case (B = kinds x copies)."""

SERVING_STEPS_PER_ROW = 400
"""Rows per kind and serving example: about 1,000 verify positions a kind, which a reference
serving verifier of Python loops over profile laws takes a second or two for; the results
state the TV this n detects (about 0.25 at V = 12), and the witnesses' bugs are far above it."""

SERVING_ASSERTIONS_PER_EXAMPLE = SERVING_MAX_KINDS * ((SERVING_MAX_K + 1) + 1)
"""Statistical assertions one serving example makes at most: per sampled row kind a law test
per position (``num_draft_tokens + 1``) and an acceptance test
(:func:`losslessness.checks.serving.serving_assertion_count`); greedy kinds are exact."""

SERVING_WITNESS_EXAMPLES = 2
"""Explicit cases the serving test runs besides the generated ones
(:data:`losslessness.suite.serving_support.SERVING_WITNESSES`), whatever the profile."""

SERVING_TREE_WITNESS_EXAMPLES = 3
"""Explicit cases the serving tree test runs besides the generated ones
(:data:`losslessness.suite.tree_support.SERVING_TREE_WITNESSES`), whatever the profile."""

SUITE_ASSERTIONS_PER_EXAMPLE = TREE_ASSERTIONS_PER_EXAMPLE + max(
    CHAIN_ASSERTIONS_PER_EXAMPLE, SERVING_ASSERTIONS_PER_EXAMPLE, TREE_ASSERTIONS_PER_EXAMPLE
)
"""Statistical assertions of one example of every statistical suite test one run can collect:
the tree test, and the chain, the serving or the serving tree test (``--losslessness-protocol``
makes ``--losslessness-target`` one of them, never two; the serving tree test makes the tree
test's assertions). The union bound splits
:data:`SUITE_FAMILY_WISE_ALPHA` over ``max_examples`` times this, whichever targets a run
names, so a run with several targets stays within the budget."""


@dataclass(frozen=True)
class SuiteBudget:
    """The suite's false-alarm budget under the active Hypothesis profile.

    Attributes:
        profile: the settings profile's name.
        max_examples: generated examples per test.
        assertions: ``max_examples * SUITE_ASSERTIONS_PER_EXAMPLE`` (the tree test and
            the chain, serving or serving tree test) plus ``TREE_WITNESS_EXAMPLES *
            TREE_ASSERTIONS_PER_EXAMPLE`` and the largest of ``len(CHAIN_WITNESS_CASES) *
            CHAIN_ASSERTIONS_PER_EXAMPLE``, ``SERVING_WITNESS_EXAMPLES *
            SERVING_ASSERTIONS_PER_EXAMPLE`` and ``SERVING_TREE_WITNESS_EXAMPLES *
            TREE_ASSERTIONS_PER_EXAMPLE`` (the explicit examples).
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
        + max(
            len(CHAIN_WITNESS_CASES) * CHAIN_ASSERTIONS_PER_EXAMPLE,
            SERVING_WITNESS_EXAMPLES * SERVING_ASSERTIONS_PER_EXAMPLE,
            SERVING_TREE_WITNESS_EXAMPLES * TREE_ASSERTIONS_PER_EXAMPLE,
        )
    )
    profile = str(getattr(settings, "_current_profile", None) or "default")
    return SuiteBudget(profile, max_examples, assertions, SUITE_FAMILY_WISE_ALPHA / assertions)


@st.composite
def suite_chain_cases(draw: st.DrawFn) -> ChainCase:
    """A chain case for the suite: V small (readable) or large (many-token regimes), k in
    0..MAX_K, 1..MAX_BATCH row types, each (p_i, q_i) from
    :func:`strategies.target_draft_pairs` and the bonus p_k from
    :func:`strategies.probability_vectors`, all regimes and relations allowed, rows in float64;
    then the call conditions: an input dtype from :data:`SUITE_DTYPES` and a call mode from
    :data:`CALL_BATCH_MODES` (:attr:`ChainCase.call_batch_size`). The checks test against the
    law the cast rows stand for (:attr:`ChainCase.laws`)."""
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
    mode = draw(st.sampled_from(CALL_BATCH_MODES))
    call_batch_size = {
        "full": None,
        "one": 1,
        "distinct": rows,
        "small": draw(st.integers(2, SMALL_CALL_BATCH)) if mode == "small" else None,
    }[mode]
    target_probs = project_strategies.renormalise_then_cast(torch.stack(targets), torch.float64)
    draft_probs = project_strategies.renormalise_then_cast(torch.stack(drafts), torch.float64)
    event(f"V {'> ' if large else '<= '}{SMALL_VOCAB}")
    event(f"dtype={dtype}")
    event(f"calls={mode}")
    summary = f"V={vocab} k={k} B={rows}"
    if call_batch_size is not None:
        summary += f", {call_batch_size} row{'s' if call_batch_size > 1 else ''} per call"
    if dtype != "float64":
        summary += f", {dtype} inputs"
    return ChainCase(
        "hypothesis", summary, target_probs, draft_probs,
        call_batch_size=call_batch_size, dtype=dtype,
    )


def _shorten(vector: torch.Tensor, shown: int = 6) -> str:
    values = ", ".join(f"{float(x):.3g}" for x in vector[:shown])
    more = f", ... ({vector.numel()} values)" if vector.numel() > shown else ""
    return f"[{values}{more}]"


def failure_headline(
    result: CheckResult, summary: str, budget: SuiteBudget, row_word: str = "row"
) -> list[str]:
    """The first lines of a failure message, shared by the suite's tests: verdict, check,
    position, ``row_word`` and row, the case's summary; for a statistical assertion its
    p-value against the suite's per-assertion level and budget."""
    lines = [
        f"losslessness: {result.verdict.value} {result.check_id}"
        + (f" at position {result.position}" if result.position is not None else "")
        + (f", {row_word} {result.row}" if result.row is not None else "")
        + f" ({summary})"
    ]
    if result.p_value is not None and result.kind.value == "statistical":
        lines.append(
            f"  p-value {result.p_value:.3g} <= alpha {result.alpha:.3g} (family-wise "
            f"{SUITE_FAMILY_WISE_ALPHA:g} over {budget.assertions} assertions, profile "
            f"{budget.profile})"
        )
    return lines


def failure_message(case: ChainCase, result: CheckResult, budget: SuiteBudget, replay: str) -> str:
    """The message of a failed assertion: check, position, case (p, q shortened), seed and a
    one-line replay command."""
    lines = failure_headline(result, case.summary, budget)
    row = result.row or 0
    position = result.position or 0
    lines.append(f"  p_{position} = {_shorten(case.law_target_probs[row, position])}")
    if position < case.k:
        lines.append(f"  q_{position} = {_shorten(case.law_draft_probs[row, position])}")
    if case.conditions:
        lines.append(
            f"  called with {case.call_batch_size or 'as many as fit'} rows per call, "
            f"{case.dtype} inputs (p and q above: the law of the {case.dtype} rows)"
        )
    lines.append(f"  {result.message}")
    lines.append(f"  seed {result.seed} (derived from the case hash {case.case_hash})")
    lines.append(f"  replay: {replay}")
    return "\n".join(lines)


def example_steps(case: ChainCase) -> int:
    """Verification steps per row type of one chain example: :data:`STEPS_PER_ROW`, or, when
    the case's calls are small, as many as :data:`MAX_CALLS` calls of
    ``case.call_batch_size`` rows carry (at least one call's worth)."""
    if case.call_batch_size is None:
        return STEPS_PER_ROW
    return max(1, min(STEPS_PER_ROW, MAX_CALLS * case.call_batch_size // case.n_rows))


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
    samples = sample_chain(adapter.chain, case, example_steps(case), seed, timeout_s=timeout_s)
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
