"""GPU adapters against the CPU reference (issue 6, parts 2-3): run by ``tox -e gpu``.

Each test is marked ``gpu`` and skips with the reason when CUDA or the adapter's package is
missing, so the default ``tox -e py`` collects this module and skips it in milliseconds. With
a GPU: every adapter that takes ``uniforms=`` is coupled with the CPU reference (decisions
compared one by one, precision-only flips excused), the others are identity-tested and
two-sample-tested; the reference on CUDA is coupled with the reference on CPU.
Statistical assertions run at 1e-5 each (at most a few dozen per test).
"""

from __future__ import annotations

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.batteries import default_chain_battery
from losslessness.engine.device import (
    GPU_ADAPTERS,
    accepts_uniforms,
    check_coupling,
    couples_final_token,
    deterministic_draft_case,
    load_device_adapter,
)
from losslessness.reference import verify
from losslessness.results import Verdict

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA is not available")
CASE_IDS = ("v2-tilted", "v16-near-k4", "v64-zeros", "v1000-peaked", "v32-mixed-batch")
CASES = {case.case_id: case for case in default_chain_battery()}
ADAPTERS = sorted(GPU_ADAPTERS)
"""Registered adapter names, resolved through the registry (``load_device_adapter``)."""
ALPHA = 1e-5
STEPS = 4000


def _chain(name: str):  # type: ignore[no-untyped-def]
    try:
        chain = load_device_adapter(name, "cuda")
    except AdapterUnavailable as error:
        pytest.skip(f"{name}: {error}")
    return chain


@pytest.mark.parametrize("name", ADAPTERS)
def test_gpu_adapter_is_unavailable_with_a_reason_or_loads(name: str) -> None:
    """Resolved by its registered name, without its package or CUDA an adapter raises
    AdapterUnavailable naming the reason; with them it loads a chain verifier (runs
    everywhere, fast)."""
    try:
        chain = load_device_adapter(name, "cuda")
    except AdapterUnavailable as error:
        assert str(error)
        return
    assert callable(chain)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_gpu_reference_on_cuda_couples_with_cpu_reference(case_id: str, dtype: torch.dtype) -> None:
    """The device-generic reference on CUDA makes the CPU reference's decisions, given the
    same uniforms (float32 inputs: within tolerance)."""
    (result,) = check_coupling(verify, CASES[case_id], STEPS, seed=1, dtype=dtype, device="cuda")
    assert result.verdict is Verdict.PASS, result.message


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("case_id", CASE_IDS)
@pytest.mark.parametrize("name", ADAPTERS)
def test_gpu_adapter_agrees_with_cpu_reference(name: str, case_id: str) -> None:
    """Coupled with the CPU reference when the adapter takes uniforms (decisions, and final
    tokens when coupled); identity- and two-sample-tested otherwise, and for the final tokens
    of a decisions-only coupling."""
    chain = _chain(name)
    case = CASES[case_id]
    if getattr(chain, "requires_one_hot_draft", False):
        case = deterministic_draft_case(case)
    results = []
    if accepts_uniforms(chain):
        results += check_coupling(chain, case, STEPS, seed=2, device="cuda", target=name)
    if not accepts_uniforms(chain) or not couples_final_token(chain):
        results += check_coupling(
            chain, case, STEPS, seed=3, device="cuda", target=name, alpha=ALPHA, statistical=True
        )
    bad = [r.message for r in results if r.verdict not in (Verdict.PASS, Verdict.SKIPPED)]
    assert not bad, bad


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("case_id", "expected"),
    [("stree-eagle-top-p", "LOSSLESS"), ("stree-greedy", "LOSSLESS"),
     ("stree-greedy-min-tokens", "LOSSY")],
)
def test_sglang_tree_serving_tree_verdicts_on_cuda(case_id: str, expected: str) -> None:
    """``sglang-tree``'s serving tree verifier (SGLang's default EAGLE tree verify: FlashInfer
    renorm and ``tree_speculative_sampling_target_only``, the platform's greedy verify), held
    to ``sglang-flashinfer``: LOSSLESS on the EAGLE top-p tree (top-p alone: the speculative
    path applies what the sampler applies) and on the greedy tree; LOSSY on the greedy
    ``min_tokens`` tree (``min_new_tokens`` frozen over the tree, SGLang 0.5.23's
    ``eagle_sample``)."""
    from losslessness.adapters.sglang import tree_adapter
    from losslessness.config import RunConfig
    from losslessness.engine import run_audit

    try:
        adapter = tree_adapter()
    except AdapterUnavailable as error:
        pytest.skip(f"sglang-tree: {error}")
    if adapter.serving_tree is None:
        pytest.skip("sglang-tree: SGLang 0.5.23 is not installed (sgl-kernel alone)")
    result = run_audit([adapter], RunConfig(cases=(case_id,)))
    assert result.targets[0].verdict.value == expected, [
        (c.check_id, c.verdict.value, c.message) for c in result.targets[0].checks
    ]
