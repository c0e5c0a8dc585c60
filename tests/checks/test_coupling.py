"""The coupled CPU-vs-device comparison (issue 6, part 2), on CPU with crafted candidates.

Every candidate below is the reference with one change; the coupled check must pass the
reference against itself, excuse precision-only flips (a candidate computing in float16) and
report their share, and fail with a reproducer when decisions or final tokens flip away from
any threshold. Candidates without ``uniforms=`` take the statistical path.

The checks are pure (:mod:`losslessness.checks.coupling`: samples in, results out); the engine's
device unit (:mod:`losslessness.engine.device`) draws the samples, calls the implementations and
resolves GPU adapters through the registry. Both halves are tested here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect

import numpy as np
import pytest
import torch

import losslessness.checks.coupling as coupling_checks
from losslessness.adapters import Adapter, AdapterNotFound, AdapterUnavailable
from losslessness.batteries import default_chain_battery
from losslessness.checks.coupling import (
    CoupledSamples,
    check_coupled_samples,
    check_sampled_laws,
)
from losslessness.checks.precision import decision_tolerance
from losslessness.engine import device as device_unit
from losslessness.engine.device import (
    GPU_ADAPTERS,
    accepts_uniforms,
    cast_case,
    check_coupling,
    count_coupling_assertions,
    deterministic_draft_case,
    draw_coupled_samples,
    load_device_adapter,
    run_device_checks,
)
from losslessness.engine.draw import sample_chain
from losslessness.laws import residual_distribution
from losslessness.protocol import validate_chain_inputs
from losslessness.reference import (
    ChainUniforms,
    accepted_lengths,
    emitted_tokens,
    sample_inverse_cdf,
    verify,
)
from losslessness.results import CheckContext, CheckKind, Verdict
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
    """On CPU: the float32-input reference coupled against float64 on every battery case
    without call conditions of its own (the device checks choose dtypes and call sizes),
    precision diagnostics, and every GPU adapter listed as unavailable with its reason."""
    results, unavailable = run_device_checks("cpu", n_steps=100, seed=0, family_wise_alpha=1e-3)
    coupling = [r for r in results if r.check_id == "coupling"]
    unconditioned = {name for name, case in CASES.items() if not case.conditions}
    assert {r.case_id for r in coupling} == unconditioned and len(unconditioned) >= 12
    assert all(r.verdict is Verdict.PASS and r.target == "reference@cpu/float32" for r in coupling)
    assert all(r.details["diagnostic"] == "precision" for r in results if r.check_id == "precision")
    assert {name for name, _ in unavailable} == set(GPU_ADAPTERS) == {
        "vllm",
        "vllm-v2",
        "flashinfer",
        "sglang",
        "sglang-tree",
        "transformers-cuda",
    }
    assert all(reason for _, reason in unavailable)
    assert dataclasses.asdict(coupling[0])["details"]["excused_share"] == 0.0


class _DecisionsOnly:
    """``_shifted(sample_shift=0.3)`` declaring ``coupled_final_token = False``: its final
    tokens differ from the reference's but are not compared."""

    coupled_final_token = False

    def __init__(self) -> None:
        self.inner = _shifted(sample_shift=0.3)

    def __call__(self, target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
        return self.inner(target_probs, draft_probs, draft_token_ids, generator, uniforms=uniforms)


def _crashes_on_third_call():  # type: ignore[no-untyped-def]
    """The reference, raising on its third call (v4096-flat: 341 steps per call)."""
    calls = []

    def candidate(target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("third call fails")
        return verify(target_probs, draft_probs, draft_token_ids, generator, uniforms=uniforms)

    return candidate


def test_coupled_path_verdicts_and_reproducers_equal_those_before_the_split() -> None:
    """Regression pin of the split of checks/coupling.py into pure checks and the engine's
    device unit (issue 10): the expected values below were computed with the code *before* the
    split (commit b1db442, ``check_coupling`` of losslessness.checks.coupling) on these fixed
    seeds and are hard-coded; the split must give the same verdicts, n, excused share and
    disagreements (the same seeds draw the same drafts and uniforms)."""
    (shifted,) = check_coupling(_shifted(accept_scale=1.2), CASES["v8-far"], 500, seed=11)
    assert (shifted.verdict, shifted.n, shifted.seed) == (Verdict.LOSSY, 500, 11)
    assert {key: shifted.details[key] for key in ("agree", "excused", "unexcused")} == {
        "agree": 450,
        "excused": 0,
        "unexcused": 50,
    }
    assert [(d["step"], d["position"], d["drafts"]) for d in shifted.details["disagreements"]] == [
        (8, 0, [4]),
        (40, 0, [2]),
        (42, 0, [3]),
        (49, 0, [2]),
        (50, 0, [3]),
    ]
    assert shifted.details["reproducer"] == {
        "candidate_output": [4, 4],
        "case_hash": CASES["v8-far"].case_hash,
        "cdf_interval": None,
        "drafts": [4],
        "position": 0,
        "ratio": 0.3229362113274852,
        "reference_output": [1, -1],
        "row": 0,
        "seed": 11,
        "step": 8,
        "tolerance": 4.76837158203125e-07,
        "uniform": 0.3557491024880268,
        "what": "candidate accepted draft 4 where the reference did not",
    }

    (final,) = check_coupling(_shifted(sample_shift=0.3), CASES["v16-near-k4"], 300, seed=5)
    assert (final.verdict, final.details["unexcused"]) == (Verdict.LOSSY, 300)
    reproducer = final.details["reproducer"]
    assert (reproducer["step"], reproducer["position"], reproducer["drafts"]) == (
        0,
        2,
        [8, 13, 10, 6],
    )
    assert reproducer["cdf_interval"] == [0.5319994817758222, 0.6094044904177357]
    assert reproducer["uniform"] == 0.2890764341114038
    assert [d["position"] for d in final.details["disagreements"]] == [2, 4, 4, 4, 4]

    (half,) = check_coupling(
        half_precision_verify, CASES["v16-near-k4"], 3000, seed=7, precision=torch.float16
    )
    assert (half.verdict, half.n) == (Verdict.PASS, 3000)
    assert (half.details["agree"], half.details["excused"], half.details["excused_decisions"]) == (
        2995,
        5,
        1,
    )
    assert half.details["excused_share"] == 5 / 3000

    (decisions,) = check_coupling(_DecisionsOnly(), CASES["v16-near-k4"], 300, seed=5)
    assert (decisions.verdict, decisions.details["final_not_compared"]) == (Verdict.PASS, 300)

    (crashed,) = check_coupling(_crashes_on_third_call(), CASES["v4096-flat"], 1000, seed=9)
    assert (crashed.verdict, crashed.n) == (Verdict.ERROR, 682)
    assert (
        crashed.message == "candidate failed on cpu (torch.float32): RuntimeError: third call fails"
    )


def _samples(case_id: str, candidate_outputs: list[list[int]], **fields) -> CoupledSamples:  # type: ignore[no-untyped-def]
    """Hand-made coupled samples of one step per row: reference outputs, drafts and uniforms
    given in ``fields`` (no verifier is called)."""
    values = {"seed": 0, "dtype": torch.float32, "device": "cpu", **fields}
    return CoupledSamples(
        case=CASES[case_id],
        candidate_outputs=np.array(candidate_outputs, dtype=np.int64).reshape(
            -1, CASES[case_id].k + 1
        ),
        n_steps=len(candidate_outputs) // CASES[case_id].n_rows,
        **values,
    )


def test_check_coupled_samples_excuses_decision_flips_only_within_tolerance() -> None:
    """The pure check on hand-made samples (v2-tilted, draft 0): a rejection where the
    reference accepted is excused when u is within decision_tolerance of p/q, LOSSY when it
    is not; no verifier is involved."""
    case = CASES["v2-tilted"]
    p, q = case.target_probs[0], case.draft_probs[0]
    ratio = float(p[0, 0] / q[0, 0])
    assert 0 < ratio < 1
    tolerance = decision_tolerance(torch.float32)
    context = CheckContext.for_case("hand", case, alpha=1e-3, power=0.9, tv=0.05, seed=0)
    common = {
        "drafts": np.zeros((2, 2), dtype=np.int64),
        "sample_uniforms": np.full(2, 0.5),
        "reference_outputs": np.array([[0, 0, 1], [0, 0, 1]], dtype=np.int64),
    }
    near = ratio * (1 - tolerance / 2)
    far = ratio * (1 - 100 * tolerance)
    accept = np.array([[near, 0.0], [0.0, 0.0]])
    rejected = [[1, -1, -1], [0, 0, 1]]
    excused = check_coupled_samples(
        _samples("v2-tilted", rejected, accept_uniforms=accept, **common), context
    )
    assert excused.verdict is Verdict.PASS and excused.details["excused"] == 1
    accept[0, 0] = far
    lossy = check_coupled_samples(
        _samples("v2-tilted", rejected, accept_uniforms=accept, **common), context
    )
    assert lossy.verdict is Verdict.LOSSY
    assert lossy.details["reproducer"]["uniform"] == far
    assert lossy.details["reproducer"]["ratio"] == pytest.approx(ratio, rel=1e-15)


def test_check_coupled_samples_reports_a_recorded_failure_as_error() -> None:
    """Samples recording a candidate failure give ERROR with the rows compared before it."""
    case = CASES["v8-far"]
    context = CheckContext.for_case("hand", case, alpha=1e-3, power=0.9, tv=0.05, seed=0)
    empty = {
        "drafts": np.empty((0, 1), dtype=np.int64),
        "accept_uniforms": np.empty((0, 1)),
        "sample_uniforms": np.empty(0),
        "reference_outputs": np.empty((0, 2), dtype=np.int64),
    }
    samples = _samples("v8-far", [], failure="ProtocolViolation: bad shape", **empty)
    result = check_coupled_samples(samples, context)
    assert (result.verdict, result.n) == (Verdict.ERROR, 0)
    assert "ProtocolViolation: bad shape" in result.message


def test_coupled_samples_reject_arrays_of_the_wrong_shape_naming_the_field() -> None:
    """CoupledSamples validates every array against the case and n_steps."""
    good = draw_coupled_samples(verify, CASES["v2-tilted"], 3, seed=0)
    assert good.drafts.shape == (3, 2) and good.candidate_outputs.shape == (3, 3)
    with pytest.raises(ValueError, match="accept_uniforms: expected float64"):
        dataclasses.replace(good, accept_uniforms=good.accept_uniforms.astype(np.float32))
    with pytest.raises(ValueError, match="reference_outputs: expected int64 array of shape"):
        dataclasses.replace(good, reference_outputs=good.reference_outputs[:2])


def test_draw_coupled_samples_copies_outputs_of_a_candidate_reusing_its_buffer() -> None:
    """A candidate returning the same buffer on every call does not overwrite earlier calls'
    recorded outputs (v4096-flat: 341 steps per call, 3 calls)."""
    buffer: list[torch.Tensor] = []

    def reuses(target_probs, draft_probs, draft_token_ids, generator, uniforms=None):  # type: ignore[no-untyped-def]
        out = verify(target_probs, draft_probs, draft_token_ids, generator, uniforms=uniforms)
        if not buffer:
            buffer.append(torch.empty((341, 2), dtype=torch.int64))
        view = buffer[0][: out.shape[0]]
        view.copy_(out)
        return view

    samples = draw_coupled_samples(reuses, CASES["v4096-flat"], 1000, seed=4)
    assert np.array_equal(samples.candidate_outputs, samples.reference_outputs)


def test_check_sampled_laws_rejects_samples_of_different_cases() -> None:
    """The statistical path's pure check refuses a reference sampled on another case."""
    a = sample_chain(verify, cast_case(CASES["v2-tilted"], torch.float32), 50, seed=0)
    b = sample_chain(verify, CASES["v2-skewed"], 50, seed=1)
    context = CheckContext.for_case("x", a.case, alpha=1e-3, power=0.9, tv=0.05, seed=0)
    with pytest.raises(ValueError, match="reference: samples of case"):
        check_sampled_laws(a, b, context, device="cpu", dtype="torch.float32")


def test_coupling_checks_module_is_pure() -> None:
    """losslessness.checks.coupling imports nothing from adapters, engine, nightly or commands
    and calls no verifier (no sampling function, no CastVerifier): its imports are read from
    its source."""
    tree = ast.parse(inspect.getsource(coupling_checks))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    forbidden = ("losslessness.adapters", "losslessness.engine", "losslessness.targets")
    assert not [name for name in imported if name.startswith((*forbidden, "losslessness.commands"))]
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not names & {"sample_chain", "CastVerifier", "reference_verify", "verify"}


def test_load_device_adapter_resolves_through_the_registry_and_binds_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adapter comes from resolve_adapter by name; a chain verifier carrying a different
    ``device`` is returned as a copy bound to the requested one (the registered one unchanged);
    an unregistered name is unavailable, with the registry's reason."""

    class OnDevice:
        def __init__(self) -> None:
            self.device = torch.device("cuda")

        def __call__(self, target_probs, draft_probs, draft_token_ids, generator):  # type: ignore[no-untyped-def]
            raise AssertionError("not called")

    registered = OnDevice()
    asked: list[str] = []

    def resolve(name: str, in_process: bool | None = None) -> Adapter:
        asked.append(name)
        if name == "missing":
            raise AdapterNotFound("'missing': not a registered adapter")
        return Adapter(name=name, description="fake", chain=registered)

    monkeypatch.setattr(device_unit, "resolve_adapter", resolve)
    bound = load_device_adapter("transformers-cuda", "cuda:1")
    assert asked == ["transformers-cuda"]
    assert bound is not registered and bound.device == torch.device("cuda:1")  # type: ignore[attr-defined]
    assert registered.device == torch.device("cuda")
    assert load_device_adapter("vllm", "cuda") is registered
    with pytest.raises(AdapterUnavailable, match="not a registered adapter"):
        load_device_adapter("missing", "cuda")
