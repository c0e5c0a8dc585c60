"""The transformers adapter: it wraps the installed ``_speculative_sampling`` (whatever its
signature), leaves the caller's global RNG alone, replays from the generator, and is LOSSLESS
on battery cases."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.base import seed_global_rng
from losslessness.adapters.transformers import SpeculativeSamplingVerifier
from losslessness.batteries import default_chain_battery
from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.engine.draw import sample_chain
from losslessness.results import TargetVerdict
from losslessness.targets import resolve_adapter

utils = pytest.importorskip("transformers.generation.utils")
real = utils._speculative_sampling


def old_signature_v438(
    candidate_input_ids: Any,
    candidate_logits: Any,
    candidate_length: Any,
    new_logits: Any,
    last_assistant_token_is_eos: Any,
    max_matches: Any,
) -> Any:
    """Stand-in with transformers 4.38's signature (EOS flag and max_matches required)."""
    assert last_assistant_token_is_eos is False
    assert max_matches == candidate_length
    return real(candidate_input_ids, candidate_logits, candidate_length, new_logits)


def old_signature_v440(
    candidate_input_ids: Any,
    candidate_logits: Any,
    candidate_length: Any,
    new_logits: Any,
    is_done_candidate: Any,
) -> Any:
    """Stand-in with transformers 4.40's signature (is_done_candidate required)."""
    assert is_done_candidate is False
    return real(candidate_input_ids, candidate_logits, candidate_length, new_logits)


def unknown_required(
    candidate_input_ids: Any,
    candidate_logits: Any,
    candidate_length: Any,
    new_logits: Any,
    mystery: Any,
) -> Any:
    """A signature with a required parameter the adapter cannot fill."""
    return None


def small_case() -> Any:
    return next(case for case in default_chain_battery() if case.case_id == "v16-near-k4")


def test_registered_adapter_wraps_the_installed_function() -> None:
    """``transformers`` resolves through the entry point and describes the real signature."""
    adapter = resolve_adapter("transformers")
    assert adapter.chain is not None and adapter.greedy is None
    for name in inspect.signature(real).parameters:
        assert name in adapter.description


@pytest.mark.parametrize("function", [real, old_signature_v438, old_signature_v440])
def test_every_known_signature_gives_the_same_outputs(function: Any) -> None:
    """Signature inspection: the 4.38, 4.40 and current signatures are all called correctly,
    and with the same seed they emit the same tokens."""
    case = small_case()
    expected = sample_chain(SpeculativeSamplingVerifier(real), case, 300, seed=3).outputs
    got = sample_chain(SpeculativeSamplingVerifier(function), case, 300, seed=3).outputs
    assert (got == expected).all()


def test_unknown_required_parameter_is_reported() -> None:
    """A signature with an unknown required parameter makes the adapter unavailable, naming it."""
    with pytest.raises(AdapterUnavailable, match="mystery"):
        SpeculativeSamplingVerifier(unknown_required)


def test_global_rng_state_is_left_untouched_and_runs_replay() -> None:
    """The adapter seeds transformers' global RNG from the audit's generator inside fork_rng:
    the caller's global RNG state is unchanged and equal generators give equal outputs."""
    case = small_case()
    verifier = SpeculativeSamplingVerifier(real)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = sample_chain(verifier, case, 200, seed=11).outputs
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)
    second = sample_chain(verifier, case, 200, seed=11).outputs
    assert (first == second).all()


def test_transformers_is_lossless_on_the_small_battery_cases() -> None:
    """The real ``_speculative_sampling`` passes every check on the cheap battery cases
    (the full battery runs in the default audit)."""
    config = AuditConfig(
        cases=(
            "v2-tilted",
            "v8-far",
            "v64-zeros",
            "edge-disjoint",
            "edge-one-hot",
            "edge-p-equals-q",
        )
    )
    result = run_audit([resolve_adapter("transformers")], config)
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSLESS, [
        c.message for c in target.checks if c.verdict.value != "PASS"
    ]


def test_seeding_draws_as_torch_manual_seed_without_queueing_lazy_device_calls() -> None:
    """seed_global_rng seeds the CPU generator exactly as torch.manual_seed does, and without
    CUDA initialised it queues nothing (torch.manual_seed queues a lazy CUDA, XPU and MTIA call
    with a formatted stack each time: 2.5 ms per verify call and a queue that grows all run)."""
    queued = getattr(torch.cuda, "_queued_calls", [])
    with torch.random.fork_rng(devices=[]):
        seed_global_rng(1234)
        ours = torch.rand(5)
        torch.manual_seed(1234)
        theirs = torch.rand(5)
    assert torch.equal(ours, theirs)
    if not torch.cuda.is_initialized():
        before = len(queued)
        verifier = SpeculativeSamplingVerifier(real)
        case = next(c for c in default_chain_battery() if c.case_id == "v2-tilted")
        drafts = torch.zeros((4, case.k), dtype=torch.int64)
        generator = torch.Generator().manual_seed(0)
        target = case.input_target_probs.expand(4, -1, -1)
        draft = case.input_draft_probs.expand(4, -1, -1)
        for _ in range(3):
            verifier(target, draft, drafts, generator)
        assert len(queued) == before, (before, len(queued))
