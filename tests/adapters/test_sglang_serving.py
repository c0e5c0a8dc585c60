"""The ``sglang`` target's serving verifier (SGLang 0.5.23's EAGLE verify with rejection
sampling, :mod:`losslessness.adapters.sglang_serving`) through Triton's interpreter on CPU.

Skipped without SGLang; run in ``tox -e engines``. The first tests read the target
probabilities SGLang's verify path hands its chain kernel (a spy around the real kernel) and
compare them with the ``sglang-torch`` profile: equal where the speculative path applies what
the normal sampler applies, and different, by the mechanism the adapter's docstring names,
where it does not (min-p ignored, top-p after the top-k renormalisation, penalties frozen for
the step). Then greedy rows against the reference serving verifier, token for token, and
the audit's verdict per row kind on two battery cases at 300 steps.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from losslessness.batteries.serving import default_serving_battery
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.protocol import PLACEHOLDER
from losslessness.reference.profiles import get_profile
from losslessness.reference.serving import ServingReference
from losslessness.requests import Request, UnsupportedRequest
from losslessness.results import TargetVerdict, Verdict
from tests.adapters.installed import needs_engine

pytestmark = needs_engine("sglang")

V = 16
K = 2
LAW_TOLERANCE = 2e-6
"""float32 softmax and renormalisation against the profile's float64 law."""


@pytest.fixture(scope="module")
def serving() -> Any:
    """The loaded ``sglang`` target's serving verifier."""
    from losslessness.adapters.sglang import adapter

    loaded = adapter()
    assert loaded.serving is not None and loaded.engine_profile == "sglang-torch"
    return loaded.serving


def _target_probs(serving: Any, logits: torch.Tensor, drafts: torch.Tensor,
                  requests: list[Request]) -> torch.Tensor:
    """``[B, k+1, V]`` float64: the target probabilities SGLang's verify path gives its chain
    kernel for ``logits [B, k+1, V]`` and ``drafts [B, k]`` (every row drafting k)."""
    from losslessness.adapters.sglang_serving import SglangServingVerifier

    seen: list[torch.Tensor] = []
    functions = copy.copy(serving.engine)
    kernel = functions.chain

    def spy(**arguments: Any) -> Any:
        seen.append(arguments["target_probs"].clone())
        return kernel(**arguments)

    functions.chain = spy
    batch = logits.shape[0]
    q = torch.full((batch, K, V), 1.0 / V)
    counts = torch.full((batch,), K, dtype=torch.int64)
    SglangServingVerifier(functions, serving.device)(
        logits, q, drafts, counts, requests, torch.Generator().manual_seed(0)
    )
    return seen[0].to(torch.float64)


def _profile_law(logits: torch.Tensor, request: Request, history: list[int]) -> torch.Tensor:
    return get_profile("sglang-torch").law(logits, request, history)


def test_sglang_serving_target_probs_equal_the_sglang_torch_law_where_the_paths_agree(
    serving: Any,
) -> None:
    """Temperature, top-k alone, top-p alone, logit bias, and the penalties at position 0
    (history = the output before the step): the probabilities SGLang's speculative path
    verifies against are the ``sglang-torch`` profile's law at every position where the
    history is the same."""
    requests = [
        Request(temperature=0.7),
        Request(top_k=4),
        Request(top_p=0.7),
        Request(logit_bias=((1, 3.0), (5, -2.0))),
        Request(frequency_penalty=1.2, presence_penalty=0.5, output_token_ids=(0, 1, 1)),
        Request(repetition_penalty=1.8, output_token_ids=(6,)),
    ]
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(len(requests), K + 1, V, generator=generator) * 1.5
    drafts = torch.tensor([[3, 9]] * len(requests))
    probs = _target_probs(serving, logits, drafts, requests)
    for row, request in enumerate(requests):
        positions = range(K + 1) if request.frequency_penalty == 0 and (
            request.repetition_penalty == 1.0
        ) else range(1)
        for i in positions:
            history = list(request.output_token_ids) + drafts[row, :i].tolist()
            law = _profile_law(logits[row, i], request, history)
            assert torch.allclose(probs[row, i], law, atol=LAW_TOLERANCE), (row, i, request)


def test_sglang_serving_ignores_min_p_on_the_speculative_path(serving: Any) -> None:
    """SGLang's ``eagle_sample`` never reads ``min_ps``: a min-p request is verified against
    the law without min-p, which differs from the ``sglang-torch`` law (the finding)."""
    request = Request(min_p=0.3)
    logits = torch.randn(1, K + 1, V, generator=torch.Generator().manual_seed(3)) * 2.0
    probs = _target_probs(serving, logits, torch.tensor([[3, 9]]), [request])
    without = _profile_law(logits[0, 0], Request(), [])
    assert torch.allclose(probs[0, 0], without, atol=LAW_TOLERANCE)
    assert not torch.allclose(probs[0, 0], _profile_law(logits[0, 0], request, []), atol=1e-3)


def test_sglang_serving_cuts_top_p_after_the_top_k_renormalisation(serving: Any) -> None:
    """With top-k and top-p, the speculative path cuts top-p on the top-k-renormalised
    probabilities (``top_k_renorm_prob`` then ``top_p_renorm_prob``); the normal pytorch
    sampler cuts top-p on the unfiltered ones (SGLang #36173): the laws differ."""
    request = Request(top_k=3, top_p=0.6)
    logits = torch.tensor([[2.0, 1.9, 1.8] + [1.0] * (V - 3)] * (K + 1)).unsqueeze(0)
    probs = _target_probs(serving, logits, torch.tensor([[3, 9]]), [request])
    top3 = torch.softmax(logits[0, 0, :3].double(), dim=-1)
    sequential = torch.zeros(V, dtype=torch.float64)
    sequential[:2] = top3[:2] / top3[:2].sum()
    assert torch.allclose(probs[0, 0], sequential, atol=LAW_TOLERANCE)
    assert not torch.allclose(probs[0, 0], _profile_law(logits[0, 0], request, []), atol=1e-3)


def test_sglang_serving_freezes_the_penalties_over_the_draft_block(serving: Any) -> None:
    """The penalties are accumulated once from the output before the step and repeated to
    every position: at position 1 an accepted draft does not count (the profile's law there
    penalises it)."""
    request = Request(frequency_penalty=2.0)
    logits = torch.zeros(1, K + 1, V)
    probs = _target_probs(serving, logits, torch.tensor([[3, 9]]), [request])
    assert torch.allclose(probs[0, 1], torch.full((V,), 1.0 / V, dtype=torch.float64))
    assert not torch.allclose(probs[0, 1], _profile_law(logits[0, 1], request, [3]), atol=1e-3)


def _greedy_batch(greedy_only: bool) -> tuple[Any, ...]:
    generator = torch.Generator().manual_seed(11 if greedy_only else 12)
    requests = [
        Request(temperature=0.0),
        Request(temperature=0.0, logit_bias=((7, 4.0),)),
        Request(temperature=0.0, output_token_ids=(2, 2)),
        Request(temperature=0.0) if greedy_only else Request(top_k=5),
    ]
    batch = len(requests)
    logits = torch.randn(batch, K + 1, V, generator=generator) * 2.0
    drafts = torch.randint(0, V, (batch, K), generator=generator)
    for row in range(batch):  # half the rows draft the plain argmax, so some drafts pass
        if row % 2 == 0:
            drafts[row] = logits[row, :K].argmax(dim=-1)
    counts = torch.tensor([K, K, 1, K], dtype=torch.int64)
    drafts[2, 1] = PLACEHOLDER
    q = torch.softmax(torch.randn(batch, K, V, generator=generator), dim=-1)
    q[torch.arange(batch).unsqueeze(1), torch.arange(K), drafts.clamp(min=0)] += 1.0
    q = q / q.sum(dim=-1, keepdim=True)
    return logits, q, drafts, counts, requests


@pytest.mark.parametrize("greedy_only", [True, False], ids=["all-greedy", "mixed"])
def test_sglang_serving_greedy_rows_equal_the_reference_serving_verifier(
    serving: Any, greedy_only: bool
) -> None:
    """Greedy rows (an all-greedy batch: argmax and the greedy kernel; a mixed batch:
    ``top_k = 1`` through the rejection sampler) emit exactly what the reference serving
    verifier of the ``sglang-torch`` profile emits, logit bias and ragged drafts included
    (penalties are not: frozen for the step, :func:`test_sglang_serving_freezes_the_penalties_
    over_the_draft_block`)."""
    logits, q, drafts, counts, requests = _greedy_batch(greedy_only)
    out = serving(logits, q, drafts, counts, requests, torch.Generator().manual_seed(1))
    expected = ServingReference("sglang-torch")(
        logits, q, drafts, counts, requests, torch.Generator().manual_seed(1)
    )
    rows = [row for row, r in enumerate(requests) if r.greedy]
    assert torch.equal(out[rows], expected[rows]), (out, expected)


def test_sglang_serving_refuses_fields_sglang_lacks(serving: Any) -> None:
    """Allowed and bad token ids raise UnsupportedRequest naming the field (SGLang has no such
    sampling parameter); the same batch with a plain request is verified."""
    logits = torch.randn(1, K + 1, V, generator=torch.Generator().manual_seed(5))
    drafts = torch.tensor([[3, 9]])
    counts = torch.tensor([K])
    q = torch.full((1, K, V), 1.0 / V)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(UnsupportedRequest, match="allowed_token_ids"):
        serving(logits, q, drafts, counts, [Request(allowed_token_ids=(1, 2))], generator)
    with pytest.raises(UnsupportedRequest, match="bad_token_ids"):
        serving(logits, q, drafts, counts, [Request(bad_token_ids=(1,))], generator)
    out = serving(logits, q, drafts, counts, [Request()], generator)
    assert out.shape == (1, K + 1) and int(out[0, 0]) >= 0


@pytest.mark.slow
def test_sglang_serving_audit_verdicts_per_row_kind() -> None:
    """The audit of the ``sglang`` target at 300 steps on ``serving-distinct-b12`` (12
    distinct requests, 0..3 drafts, in one batch): the temperature, greedy, top-k, top-p,
    bias and seeded rows PASS; the ``min-p 0.2`` row (no drafts; min-p ignored, TV 0.36 from
    the ``sglang-torch`` law at its one position, above the 0.2 that n = 300 detects) is LOSSY,
    so the target is LOSSY. The two other min-p or top-k + top-p rows (TV 0.02-0.22 at
    positions reached by fewer steps) are not asserted at this n."""
    from losslessness.adapters.sglang import adapter

    result = run_audit([adapter()], RunConfig(cases=("serving-distinct-b12",), steps=300))
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSY
    (case,) = [c for c in default_serving_battery() if c.case_id == "serving-distinct-b12"]
    by_kind: dict[str, set[Verdict]] = {}
    for check in target.checks:
        if check.check_id in ("serving.law", "serving.greedy") and check.row is not None:
            by_kind.setdefault(case.rows[check.row].label, set()).add(check.verdict)
    passing = (0, 1, 2, 3, 5, 6, 9, 10, 11)
    for row in passing:
        assert by_kind[case.rows[row].label] == {Verdict.PASS}, (row, by_kind)
    assert by_kind["distinct 4: min-p 0.2"] == {Verdict.LOSSY}, by_kind
