"""Structure of chain-verifier outputs (exact, every sample; docs/architecture.md, 'What lossless
means', item 1).

Every row must: hold ids in [0, V) followed only by -1 placeholders; emit 1..k+1 tokens;
emit, before its last token, exactly the drafts at those positions (accepted drafts are kept
as drafted); and, when it emits c <= k tokens, end on a token that differs from the draft at
position c-1. That last rule holds for every verifier that decides draft by draft: the token
emitted at the first rejection comes from the residual norm(max(0, p - q)), which has no mass
on a rejected draft (a draft with p < q is the only kind ever rejected), and sample-and-match
emits its sample only when it differs from the draft. A row of k tokens all equal to the drafts
is therefore exact proof of a missing bonus token. Verifiers that decide on the whole block
(block verification, Sun et al. 2024) may legitimately emit the draft as the correction token;
for them the rule is off (``block_decisions``). Zero-probability tokens are checked by the
conditional-law check.
"""

from __future__ import annotations

import time

import numpy as np

from losslessness.checks.ids import STRUCTURE_CHECK_ID
from losslessness.protocol import PLACEHOLDER
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ChainCounts, ChainSamples, chain_counts
from losslessness.stats import exact_check_minimum_detectable_rate


def emitted_counts(outputs: np.ndarray) -> np.ndarray:
    """Number of leading emitted (non-placeholder) tokens in each row.

    Args:
        outputs: ``[..., k+1]`` int64 verifier outputs.

    Returns:
        ``[...]`` int64 in ``[0, k+1]``.
    """
    counts: np.ndarray = np.cumprod(outputs != PLACEHOLDER, axis=-1).sum(axis=-1)
    return counts


def check_structure(
    samples: ChainSamples | ChainCounts, context: CheckContext, block_decisions: bool = False
) -> CheckResult:
    """Exact structural check of every output row of ``samples``.

    Args:
        samples: outputs ``[R, n, k+1]`` and drafts ``[R, n, k]``, raw or counted
            (:class:`~losslessness.samples.ChainCounts`: every row counted as often as it
            occurred).
        context: the case's context.
        block_decisions: the verifier decides the accepted prefix from the whole block (block
            verification), so its correction token may equal the draft: the rule "a replacement
            differs from the rejected draft" is not checked.

    Returns:
        One exact :class:`CheckResult`: LOSSY with the first offending row (lowest row type,
        then earliest step in sampling order) when any row violates the structure, else PASS.
    """
    began = time.perf_counter()
    counted = chain_counts(samples)
    outputs, drafts, weights = counted.outputs, counted.drafts, counted.weights
    vocab = counted.case.vocab_size
    k = counted.case.k
    counts = emitted_counts(outputs)
    positions = np.arange(k + 1)
    emitted = positions < counts[..., None]
    bad_id = emitted & ((outputs < 0) | (outputs >= vocab))
    bad_tail = ~emitted & (outputs != PLACEHOLDER)
    kept = positions[:k] < (counts[..., None] - 1)
    bad_draft = kept & (outputs[..., :k] != drafts)
    last = np.clip(counts - 1, 0, k)[..., None]
    ends_on_draft = (counts >= 1) & (counts <= k)
    if k:
        ends_on_draft &= (
            np.take_along_axis(outputs, last, axis=-1)[..., 0]
            == np.take_along_axis(drafts, np.minimum(last, k - 1), axis=-1)[..., 0]
        )
    ends_on_draft &= not block_decisions
    problems = {
        "token id outside [0, V)": bad_id.any(axis=-1),
        "token after a placeholder -1": bad_tail.any(axis=-1),
        "no token emitted": counts == 0,
        "accepted token differs from the draft": bad_draft.any(axis=-1),
        "rejected draft emitted as its own replacement (all k drafts and no bonus token, when "
        "the row has k tokens)": ends_on_draft,
    }
    violating = np.zeros(counts.shape, dtype=bool)
    for mask in problems.values():
        violating |= mask
    rows_of = {name: int(weights[mask.nonzero()[1]].sum()) for name, mask in problems.items()}
    n = counted.case.n_rows * counted.n_steps
    n_bad = int(weights[violating.nonzero()[1]].sum())
    message = "every row: ids in range, left-aligned, 1..k+1 tokens, accepted prefix == drafts"
    if n_bad:
        kinds = [f"{name} ({rows_of[name]} rows)" for name, mask in problems.items() if mask.any()]
        # The first offending distinct step is also the first in sampling order: each one's
        # first occurrence comes before every occurrence of the steps after it.
        r, distinct = (int(x) for x in np.argwhere(violating)[0])
        message = (
            f"{n_bad} of {n} rows malformed: {'; '.join(kinds)}. First: row type {r}, step "
            f"{int(counted.first_step[distinct])}, drafts {drafts[r, distinct].tolist()} -> "
            f"output {outputs[r, distinct].tolist()}"
        )
    return context.result(
        STRUCTURE_CHECK_ID,
        kind=CheckKind.EXACT,
        n=n,
        statistic=float(n_bad),
        p_value=0.0 if n_bad else 1.0,
        verdict=Verdict.LOSSY if n_bad else Verdict.PASS,
        min_detectable_tv=exact_check_minimum_detectable_rate(n, context.power),
        wall_time_s=time.perf_counter() - began,
        message=message,
        details={"violations": rows_of},
    )


def malformed_output_result(
    context: CheckContext, problem: object, check_id: str = STRUCTURE_CHECK_ID
) -> CheckResult:
    """The result of a case whose sampling stopped at a malformed output (a
    :class:`~losslessness.engine.draw.ProtocolViolation`: wrong shape, dtype or values).

    Args:
        context: the case's context.
        problem: what was malformed (the violation, or its text).
        check_id: the check the output was for (``structure`` for chain verifiers, ``greedy``).

    Returns:
        An exact LOSSY :class:`CheckResult` with p-value 0, ``n`` 0 (no complete sample was
        counted) and an infinite minimum detectable TV; the message is ``malformed output:
        {problem}``.
    """
    return context.result(
        check_id,
        kind=CheckKind.EXACT,
        n=0,
        verdict=Verdict.LOSSY,
        p_value=0.0,
        min_detectable_tv=float("inf"),
        message=f"malformed output: {problem}",
    )
