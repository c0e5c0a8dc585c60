"""The float16 precision mutants (losslessness.zoo.PRECISION_MUTANTS): synthetic
lossy verifiers whose deviation (a ratio p / q computed in float16 from float16 logits) lies
below the per-assertion reach of the law tests; the run-level uniformity check is what may
catch them (benchmarks/uniformity_power.py)."""

from __future__ import annotations

import pytest
import torch

from losslessness.cases import ChainCase
from losslessness.engine.draw import sample_chain
from losslessness.laws import residual_distribution
from losslessness.stats import identity_test
from losslessness.targets import resolve_adapter
from losslessness.zoo import MUTANTS, PRECISION_MUTANTS
from losslessness.zoo.chain import FLOAT16_MAX_LOGIT, FLOAT16_OFFSET_MAX_LOGIT, _float16_law

MAX_LOGITS = {
    "laws-from-float16-logits": FLOAT16_MAX_LOGIT,
    "laws-from-offset-float16-logits": FLOAT16_OFFSET_MAX_LOGIT,
}


def first_position_law(p: torch.Tensor, q: torch.Tensor, max_logit: float) -> torch.Tensor:
    """Exact law [V] of the token the mutant emits at position 0, for rows p, q [V] float64:
    draft d ~ q accepted with probability min(1, p~(d) / q~(d)) (ratio in float16), else the
    correction from norm(max(0, p~ - q~))."""
    p_rounded = _float16_law(p[None], max_logit)[0]
    q_rounded = _float16_law(q[None], max_logit)[0]
    ratio = (p_rounded.to(torch.float16) / q_rounded.to(torch.float16)).to(torch.float64)
    accept = torch.nan_to_num(q * ratio.clamp(max=1.0))
    residual = residual_distribution(p_rounded[None], q_rounded[None])[0]
    return accept + (1.0 - accept.sum()) * residual


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("laws-from-float16-logits", 1e-3, 4e-3),
        ("laws-from-offset-float16-logits", 4e-3, 1.5e-2),
    ],
)
def test_precision_mutant_is_lossy_by_a_few_thousandths_of_tv(
    name: str, low: float, high: float
) -> None:
    """On its own case, the exact first-position law of the mutant differs from p_0 by a TV in
    [low, high]: lossy, but far below the default design TV 0.05."""
    case = PRECISION_MUTANTS[name].case
    assert isinstance(case, ChainCase)
    p = case.target_probs.to(torch.float64)[0, 0]
    q = case.draft_probs.to(torch.float64)[0, 0]
    law = first_position_law(p, q, MAX_LOGITS[name])
    assert float(law.sum()) == pytest.approx(1.0, abs=1e-12)
    tv = 0.5 * float((law - p).abs().sum())
    assert low <= tv <= high, tv


@pytest.mark.parametrize("name", list(PRECISION_MUTANTS))
def test_precision_mutant_samples_follow_its_exact_law(name: str) -> None:
    """The mutant's emitted tokens at position 0 (20,000 steps of its case) pass an identity
    test against the exact law above (p-value > 1e-4), so that law is the one it implements,
    and it resolves as ``mutant/<name>`` while staying out of the zoo that the default audit
    must catch entry by entry."""
    entry = PRECISION_MUTANTS[name]
    assert entry.lossy and name not in MUTANTS
    assert resolve_adapter(f"mutant/{name}") is entry.adapter
    case = entry.case
    assert isinstance(case, ChainCase) and entry.adapter.chain is not None
    samples = sample_chain(entry.adapter.chain, case, 20_000, 3)
    tokens = samples.outputs[0, :, 0]
    law = first_position_law(
        case.target_probs.to(torch.float64)[0, 0],
        case.draft_probs.to(torch.float64)[0, 0],
        MAX_LOGITS[name],
    )
    counts = torch.bincount(torch.as_tensor(tokens), minlength=case.vocab_size).numpy()
    assert identity_test(counts, law.numpy()).pvalue > 1e-4
