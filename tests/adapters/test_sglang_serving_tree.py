"""SGLang 0.5.23's default EAGLE verify step on serving trees
(:class:`~losslessness.adapters.sglang_serving.SglangServingTreeVerifier`) on CPU.

Skipped without SGLang; run in ``tox -e engines``. The greedy branch runs SGLang's own code end
to end here (its sampling state and penalizers, ``verify_tree_greedy_triton`` through Triton's
interpreter): the ``sglang`` target's serving tree verifier. The sampled branch calls
``tree_speculative_sampling_target_only``, CUDA only: the ``sglang`` target refuses it
(NotApplicable), and its plumbing (SGLang's processing under the interpreter, the tree layout,
coins, output conversion) is tested with the kernel replaced by a CPU transcription of it
(``tests/adapters/sglang_tree_kernel.py``); the ``sglang-tree`` target runs the real kernel on a
GPU.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from losslessness.adapters import Adapter, NotApplicable
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.protocol import TreeOutput
from losslessness.reference.profiles import get_profile
from losslessness.reference.serving_tree import ServingTreeReference, path_histories
from losslessness.requests import Request
from losslessness.results import TargetVerdict, Verdict
from losslessness.zoo.serving_tree import MinTokensCountedAtTheRoot
from tests.adapters.installed import needs_engine
from tests.adapters.sglang_tree_kernel import tree_speculative_sampling_target_only

pytestmark = needs_engine("sglang")

V = 16
PARENTS = (0, 0, 0, 1, 1, 2, 4)
"""Three root children, two grandchildren under the first, one under the second, one node
at depth 3: seven drafted nodes."""
LAW_TOLERANCE = 2e-6
"""float32 softmax and renormalisation against the profile's float64 law."""


@pytest.fixture(scope="module")
def serving_tree() -> Any:
    """The loaded ``sglang`` target's serving tree verifier (greedy batches only)."""
    from losslessness.adapters.sglang import adapter

    loaded = adapter()
    assert loaded.serving_tree is not None and loaded.engine_profile == "sglang-torch"
    return loaded.serving_tree


def _with_kernel(serving_tree: Any, kernel: Any) -> Any:
    """The same verifier with ``kernel`` as its CUDA tree sampler."""
    from losslessness.adapters.sglang_serving import SglangServingTreeVerifier

    functions = copy.copy(serving_tree.engine)
    functions.tree = kernel
    return SglangServingTreeVerifier(functions, serving_tree.device, "sglang-torch")


def _trees(
    batch: int, seed: int, distinct: bool, scale: float = 2.0
) -> tuple[torch.Tensor, ...]:
    """``(logits [B, N+1, V], q [B, N+1, V], parents [B, N], ids [B, N])``: standard normal
    logits times ``scale``; siblings distinct when ``distinct`` (the top-k scheme), else drawn
    with repeats allowed."""
    generator = torch.Generator().manual_seed(seed)
    nodes = len(PARENTS)
    parents = torch.tensor(PARENTS).expand(batch, -1)
    if distinct:
        ids = torch.stack([torch.randperm(V, generator=generator)[:nodes] for _ in range(batch)])
    else:
        ids = torch.randint(0, 4, (batch, nodes), generator=generator)
    logits = torch.randn(batch, nodes + 1, V, generator=generator) * scale
    q = torch.full((batch, nodes + 1, V), 1.0 / V)
    return logits, q, parents, ids


@pytest.mark.parametrize("scheme", ["iid", "top-k"])
def test_sglang_serving_tree_greedy_batches_equal_the_reference_token_for_token(
    serving_tree: Any, scheme: str
) -> None:
    """All-greedy batches (argmax of the processed logits, then SGLang's greedy tree kernel)
    emit exactly the reference serving tree verifier's tokens and accept the same nodes, with
    a logit bias on some trees and repeated sibling tokens under ``iid``."""
    logits, q, parents, ids = _trees(24, 11, distinct=scheme == "top-k")
    requests = [
        Request(temperature=0.0, logit_bias=((int(ids[b, 0]), 1.5),)) if b % 3 == 0
        else Request(temperature=0.0)
        for b in range(24)
    ]
    out = serving_tree(logits, q, parents, ids, scheme, requests, torch.Generator())
    expected = ServingTreeReference("sglang-torch")(
        logits, q, parents, ids, scheme, requests, torch.Generator()
    )
    assert torch.equal(out.tokens, expected.tokens), (out.tokens, expected.tokens)
    assert torch.equal(out.accepted_nodes, expected.accepted_nodes)
    assert int((out.accepted_nodes >= 0).sum()) > 0


def test_sglang_serving_tree_freezes_min_tokens_over_the_tree(serving_tree: Any) -> None:
    """SGLang's EAGLE verify accumulates ``min_new_tokens`` once from the output before the step
    and repeats it to every node (``eagle_sample``, "a relaxed version of penalties"): a
    greedy request one token short of ``min_tokens`` keeps its stop tokens masked below the
    root. Its trees equal the zoo's ``MinTokensCountedAtTheRoot`` token for token and differ
    from the ``sglang-torch`` law's where a stop token is the argmax below the root (the
    finding, held by the audit as LOSSY)."""
    logits, q, parents, ids = _trees(32, 12, distinct=False)
    logits[:, 1:, 0] += 6.0
    ids[:, :3] = torch.tensor([1, 2, 3])
    request = Request(temperature=0.0, min_tokens=2, stop_token_ids=(0,), output_token_ids=(5,))
    requests = [request] * 32
    out = serving_tree(logits, q, parents, ids, "iid", requests, torch.Generator())
    frozen = MinTokensCountedAtTheRoot("sglang-torch")(
        logits, q, parents, ids, "iid", requests, torch.Generator()
    )
    lossless = ServingTreeReference("sglang-torch")(
        logits, q, parents, ids, "iid", requests, torch.Generator()
    )
    assert torch.equal(out.tokens, frozen.tokens)
    assert not torch.equal(out.tokens, lossless.tokens)
    assert not bool((out.tokens == 0).any()) and bool((lossless.tokens == 0).any())


def test_sglang_serving_tree_refuses_sampled_batches_without_the_cuda_kernel(
    serving_tree: Any,
) -> None:
    """A batch with one sampled request takes SGLang's sampled branch, whose tree kernel is
    CUDA only: the ``sglang`` target raises NotApplicable naming ``requests`` and the target
    that runs it, whatever the scheme."""
    logits, q, parents, ids = _trees(2, 13, distinct=True)
    requests = [Request(temperature=0.0), Request(temperature=0.7)]
    with pytest.raises(NotApplicable, match="sglang-tree") as raised:
        serving_tree(logits, q, parents, ids, "top-k", requests, torch.Generator())
    assert raised.value.argument == "requests"


def test_sglang_serving_tree_sampled_branch_refuses_schemes_the_kernel_cannot_verify(
    serving_tree: Any,
) -> None:
    """With the tree kernel present, a sampled batch under the ``iid`` scheme is refused
    (NotApplicable naming ``draft_scheme``): the kernel ignores q and counts a repeated
    sibling token twice."""
    verifier = _with_kernel(serving_tree, tree_speculative_sampling_target_only)
    logits, q, parents, ids = _trees(2, 14, distinct=False)
    with pytest.raises(NotApplicable, match="top-k") as raised:
        verifier(logits, q, parents, ids, "iid", [Request(temperature=0.7)] * 2,
                 torch.Generator())
    assert raised.value.argument == "draft_scheme"


def _kernel_inputs(
    serving_tree: Any, requests: list[Request], scale: float = 2.0
) -> tuple[Any, ...]:
    """The ``target_probs`` and ``draft_probs`` the sampled branch hands the tree kernel
    (captured around the CPU transcription), with the call's inputs (:func:`_trees`)."""
    seen: dict[str, torch.Tensor] = {}

    def spy(**arguments: Any) -> None:
        seen["target"] = arguments["target_probs"].clone()
        seen["draft"] = arguments["draft_probs"].clone()
        tree_speculative_sampling_target_only(**arguments)

    batch = len(requests)
    logits, q, parents, ids = _trees(batch, 15, distinct=True, scale=scale)
    out = _with_kernel(serving_tree, spy)(
        logits, q, parents, ids, "top-k", requests, torch.Generator().manual_seed(0)
    )
    assert isinstance(out, TreeOutput)
    return seen["target"].to(torch.float64), seen["draft"], logits, parents, ids


def test_sglang_serving_tree_kernel_gets_the_sglang_torch_law_where_the_paths_agree(
    serving_tree: Any,
) -> None:
    """Temperature, top-k alone, top-p alone and logit bias, a greedy request beside them: the
    probabilities the tree kernel gets at every node are the ``sglang-torch`` profile's law at
    that node, and its draft probabilities are all zero (SGLang's target-only call)."""
    requests = [
        Request(temperature=0.7),
        Request(top_k=4),
        Request(temperature=1.3, top_p=0.7),
        Request(logit_bias=((1, 3.0), (5, -2.0))),
        Request(temperature=0.0),
    ]
    probs, draft, logits, parents, ids = _kernel_inputs(serving_tree, requests)
    assert not bool(draft.any())
    profile = get_profile("sglang-torch")
    paths = path_histories(parents, ids)
    for b, request in enumerate(requests):
        for node, path in enumerate(paths[b]):
            law = profile.law(logits[b, node], request, list(path))
            assert torch.allclose(probs[b, node], law, atol=LAW_TOLERANCE), (b, node, request)


def test_sglang_serving_tree_kernel_gets_no_min_p_and_top_p_after_the_top_k_renorm(
    serving_tree: Any,
) -> None:
    """The sampled branch's departures from ``sglang-torch`` (the chain's, on trees): min-p is
    never applied, and top-p cuts the top-k renormalised law; both rows' kernel laws differ
    from the profile's at the root by more than rounding (flat logits, so that both cuts
    leave several tokens)."""
    requests = [Request(min_p=0.3), Request(top_k=3, top_p=0.5)]
    probs, _, logits, _, _ = _kernel_inputs(serving_tree, requests, scale=0.5)
    profile = get_profile("sglang-torch")
    for b, request in enumerate(requests):
        law = profile.law(logits[b, 0], request, [])
        assert float((probs[b, 0] - law).abs().sum()) > 0.05, (b, request)


@pytest.mark.parametrize(
    ("case", "verdict"),
    [("stree-eagle-top-p", TargetVerdict.LOSSLESS), ("stree-greedy", TargetVerdict.LOSSLESS)],
)
def test_sglang_serving_tree_audit_with_the_kernel_transcription(
    serving_tree: Any, case: str, verdict: TargetVerdict
) -> None:
    """Through ``run_audit`` with the CPU transcription as its tree kernel: the battery's EAGLE
    top-p case (top-k scheme; SGLang's processing agrees with ``sglang-torch`` for top-p
    alone) and its greedy case come out LOSSLESS, every check passing."""
    adapter = Adapter(
        name="sglang-serving-tree-cpu",
        description="SglangServingTreeVerifier with a CPU transcription of the tree kernel",
        serving_tree=_with_kernel(serving_tree, tree_speculative_sampling_target_only),
        engine_profile="sglang-torch",
    )
    result = run_audit([adapter], RunConfig(cases=(case,), steps=1024))
    target = result.targets[0]
    assert target.verdict is verdict, [c.message for c in target.checks]
    assert all(c.verdict is Verdict.PASS for c in target.checks), [
        (c.check_id, c.message) for c in target.checks if c.verdict is not Verdict.PASS
    ]
