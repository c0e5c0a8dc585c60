"""The coupled CPU-vs-device comparison (issue 6, part 2), on CPU with crafted candidates.

Every candidate below is the reference with one change; the coupled check must pass the
reference against itself, excuse precision-only flips (a candidate computing in float16) and
report their share, and fail with a reproducer when decisions or final tokens flip away from
any threshold. Candidates without ``uniforms=`` take the statistical path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from losslessness.checks.coupling import (
    accepts_uniforms,
    check_coupling,
    count_coupling_assertions,
    deterministic_draft_case,
    run_device_checks,
)
from losslessness.engine.battery import default_chain_battery
from losslessness.protocol import validate_chain_inputs
from losslessness.reference import (
    ChainUniforms,
    accepted_lengths,
    emitted_tokens,
    residual_distribution,
    sample_inverse_cdf,
    verify,
)
from losslessness.results import CheckKind, Verdict
from tests.wrong_verifiers import residual_is_target

CASES = {case.case_id: case for case in default_chain_battery()}


def _shifted(accept_scale: float = 1.0, sample_shift: float = 0.0):  # type: ignore[no-untyped-def]
    """The reference fed ``u_i / accept_scale`` (accepts iff u < scale * p/q) and
    ``(s + sample_shift) mod 1``: flips far from any threshold."""

    def candidate(target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
        moved = ChainUniforms(
            uniforms.accept_uniforms / accept_scale,
            (uniforms.sample_uniforms + sample_shift) % 1.0,
        )
        return verify(target_probs, draft_probs, draft_token_ids, generator, uniforms=moved)

    return candidate


def half_precision_verify(target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
    """Lossless, but decides in float16: ``half(u) < half(p(d)) / half(q(d))``; the final
    token from the float64 law of the float16-cast inputs."""
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    if uniforms is None:
        uniforms = ChainUniforms.draw(batch, k, generator)
    p, q, ids = target_probs.half(), draft_probs.half(), draft_token_ids.long()
    p_draft = p[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    q_draft = q.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    accepted = accepted_lengths(uniforms.accept_uniforms.half() < p_draft / q_draft)
    rows = torch.arange(batch)
    p_final = p[rows, accepted].double()
    p_final = p_final / p_final.sum(-1, keepdim=True)
    q_final = q[rows, accepted.clamp(max=k - 1)].double()
    q_final = q_final / q_final.sum(-1, keepdim=True)
    law = torch.where((accepted < k).unsqueeze(1), residual_distribution(p_final, q_final), p_final)
    return emitted_tokens(ids, accepted, sample_inverse_cdf(law, uniforms.sample_uniforms))


def without_uniforms(target_probs, draft_probs, draft_token_ids, generator):  # type: ignore[no-untyped-def]
    """The reference, hiding its ``uniforms=`` keyword."""
    return verify(target_probs, draft_probs, draft_token_ids, generator)


@pytest.mark.parametrize("case_id", ["v2-tilted", "v64-zeros", "v32-mixed-batch", "v4096-flat"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_coupling_of_reference_with_itself_passes(case_id: str, dtype: torch.dtype) -> None:
    """Fed the same uniforms, the reference agrees with itself (float64 exactly; float32 inputs
    within tolerance), and the result is an exact check."""
    (result,) = check_coupling(verify, CASES[case_id], 400, seed=3, dtype=dtype)
    assert result.verdict is Verdict.PASS, result.message
    assert result.kind is CheckKind.EXACT
    assert result.details["unexcused"] == 0
    assert result.n == 400 * CASES[case_id].n_rows
    if dtype == torch.float64:
        assert result.details["excused"] == 0


def test_coupling_decision_flips_away_from_threshold_are_lossy_with_reproducer() -> None:
    """A candidate accepting iff u < 1.2 p/q disagrees far from the threshold: LOSSY, with a
    reproducer naming the case hash, seed, step, position, uniform and ratio."""
    case = CASES["v8-far"]
    (result,) = check_coupling(_shifted(accept_scale=1.2), case, 500, seed=11)
    assert result.verdict is Verdict.LOSSY
    reproducer = result.details["reproducer"]
    assert reproducer["case_hash"] == case.case_hash and reproducer["seed"] == 11
    assert reproducer["ratio"] < reproducer["uniform"] < 1.2 * reproducer["ratio"]
    assert abs(reproducer["ratio"] - reproducer["uniform"]) > reproducer["tolerance"]
    assert "accepted draft" in reproducer["what"]
    assert case.case_hash in result.message and "seed=11" in result.message
    # The reproducer replays: the same seed and n_steps = step + 1 meet the same disagreement.
    (again,) = check_coupling(_shifted(accept_scale=1.2), case, reproducer["step"] + 1, seed=11)
    assert again.details["reproducer"] == reproducer


def test_coupling_final_token_flips_are_lossy() -> None:
    """A candidate whose final token inverts the CDF at s + 0.3 is caught at the final token."""
    (result,) = check_coupling(_shifted(sample_shift=0.3), CASES["v16-near-k4"], 300, seed=5)
    assert result.verdict is Verdict.LOSSY
    assert result.details["reproducer"]["cdf_interval"] is not None


def test_coupling_excuses_precision_only_flips_and_reports_their_share() -> None:
    """A float16-deciding candidate flips some decisions and tokens next to thresholds: all
    excused at float16 tolerance, the share reported; the same flips at float64 tolerance
    are not excused."""
    case = CASES["v16-near-k4"]
    (result,) = check_coupling(half_precision_verify, case, 3000, seed=7, precision=torch.float16)
    assert result.verdict is Verdict.PASS, result.message
    assert result.details["excused"] > 0
    assert result.details["excused_share"] == result.details["excused"] / result.n
    (strict,) = check_coupling(half_precision_verify, case, 3000, seed=7, dtype=torch.float64)
    assert strict.verdict is Verdict.LOSSY


def test_coupling_never_excuses_accepting_a_zero_probability_draft() -> None:
    """Accepting a draft whose target probability is 0 is LOSSY whatever the tolerance."""

    def accepts_everything(target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
        batch, k = draft_token_ids.shape
        bonus = sample_inverse_cdf(target_probs[:, k].double(), uniforms.sample_uniforms)
        return emitted_tokens(draft_token_ids, torch.full((batch,), k), bonus)

    (result,) = check_coupling(
        accepts_everything, CASES["edge-disjoint"], 50, seed=1, precision=torch.bfloat16
    )
    assert result.verdict is Verdict.LOSSY
    assert result.details["reproducer"]["ratio"] == 0.0


def test_coupling_statistical_path_for_candidates_without_uniforms() -> None:
    """Without ``uniforms=``: law tests of both sides and two-sample tests, all passing on the
    reference (false-alarm probability <= 6 * 1e-4), LOSSY on a residual-is-target verifier."""
    case = CASES["v8-far"]
    assert not accepts_uniforms(without_uniforms)
    assert count_coupling_assertions(without_uniforms, case) == 6
    results = check_coupling(without_uniforms, case, 3000, seed=2, alpha=1e-4, target="cand")
    assert {r.check_id for r in results} == {"law", "two-sample"}
    assert {r.target for r in results} == {"cand", "cand/reference"}
    assert all(r.verdict is Verdict.PASS for r in results), [r.message for r in results]
    wrong = check_coupling(residual_is_target, case, 3000, seed=2, alpha=1e-4)
    lossy = {r.check_id for r in wrong if r.verdict is Verdict.LOSSY}
    assert {"law", "two-sample"} <= lossy


def test_coupling_reports_a_crashing_candidate_as_error() -> None:
    """A candidate that raises gives one ERROR result, not an exception."""

    def crashes(target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("kernel launch failed")

    (result,) = check_coupling(crashes, CASES["v2-tilted"], 10, seed=0)
    assert result.verdict is Verdict.ERROR and "kernel launch failed" in result.message


def test_check_coupling_rejects_bad_arguments() -> None:
    """n_steps < 1, or forcing the coupled path on a candidate without uniforms, is an error."""
    with pytest.raises(ValueError, match="n_steps"):
        check_coupling(verify, CASES["v2-tilted"], 0, seed=0)
    with pytest.raises(ValueError, match="statistical"):
        check_coupling(without_uniforms, CASES["v2-tilted"], 10, seed=0, statistical=False)


def test_deterministic_draft_case_has_one_hot_drafts() -> None:
    """The one-hot draft case keeps p and puts q's mass on its most likely token."""
    case = CASES["v8-far"]
    greedy = deterministic_draft_case(case)
    assert torch.equal(greedy.target_probs, case.target_probs)
    assert bool((greedy.draft_probs.amax(dim=-1) == 1).all())
    assert torch.equal(greedy.draft_probs.argmax(-1), case.draft_probs.argmax(-1))


def test_run_device_checks_on_cpu_couples_float32_reference_and_lists_gpu_adapters() -> None:
    """On CPU: the float32-input reference coupled against float64 on every battery case,
    precision diagnostics, and every GPU adapter listed as unavailable with its reason."""
    results, unavailable = run_device_checks("cpu", n_steps=100, seed=0, family_wise_alpha=1e-3)
    coupling = [r for r in results if r.check_id == "coupling"]
    assert len(coupling) == len(CASES)
    assert all(r.verdict is Verdict.PASS and r.target == "reference@cpu/float32" for r in coupling)
    assert all(r.details["diagnostic"] == "precision" for r in results if r.check_id == "precision")
    assert {name for name, _ in unavailable} == {
        "vllm",
        "flashinfer",
        "sglang",
        "transformers-cuda",
    }
    assert all(reason for _, reason in unavailable)
    assert dataclasses.asdict(coupling[0])["details"]["excused_share"] == 0.0
