"""Greedy exactness (docs/architecture.md, 'What lossless means', item 6): token-for-token
equality with the reference greedy verifier, ties included (the lowest index wins, as
``torch.argmax`` documents)."""

from __future__ import annotations

import time

import numpy as np

from losslessness.cases import GreedyCase
from losslessness.checks.ids import GREEDY_CHECK_ID
from losslessness.reference.greedy import verify_greedy
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.stats import exact_check_minimum_detectable_rate


def check_greedy(got: np.ndarray, case: GreedyCase, context: CheckContext) -> CheckResult:
    """Compare a greedy verifier's outputs with the reference's on every row of ``case``.

    Args:
        got: ``[B, k+1]`` int64: what the verifier under audit returned for ``case``.
        case: logits ``[B, k+1, V]`` and drafts ``[B, k]``.
        context: the case's context.

    Returns:
        One exact :class:`CheckResult`: LOSSY with the first differing row, else PASS.

    Raises:
        ValueError: naming ``got``, when its shape is not ``[B, k+1]``.
    """
    began = time.perf_counter()
    batch = case.batch_size
    if got.shape != (batch, case.k + 1):
        raise ValueError(f"got: expected shape {(batch, case.k + 1)}, got {got.shape}")
    expected = verify_greedy(case.target_logits, case.draft_token_ids).numpy()
    differs = (got != expected).any(axis=1)
    n_bad = int(differs.sum())
    message = f"all {batch} rows equal greedy decoding"
    if n_bad:
        b = int(np.flatnonzero(differs)[0])
        i = int(np.flatnonzero(got[b] != expected[b])[0])
        logits = case.target_logits[b, min(i, case.k)]
        tied = int((logits == logits.max()).sum())
        message = (
            f"{n_bad} of {batch} rows differ from greedy decoding. First: row {b}, position {i}: "
            f"drafts {case.draft_token_ids[b].tolist()}, expected {expected[b].tolist()}, got "
            f"{got[b].tolist()}{f' ({tied}-way tie at the maximum)' if tied > 1 else ''}"
        )
    return context.result(
        GREEDY_CHECK_ID,
        kind=CheckKind.EXACT,
        n=batch,
        verdict=Verdict.LOSSY if n_bad else Verdict.PASS,
        statistic=float(n_bad),
        p_value=0.0 if n_bad else 1.0,
        min_detectable_tv=exact_check_minimum_detectable_rate(batch, context.power),
        wall_time_s=time.perf_counter() - began,
        message=message,
    )
