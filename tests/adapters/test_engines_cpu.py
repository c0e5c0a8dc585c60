"""vLLM and SGLang adapters (issue 12): faults without the engines, and the real Triton kernels
through Triton's interpreter on CPU with them (``tox -e engines``).

The first tests run everywhere (no engine import): an engine that is not installed, Triton
missing, and an API that changed give AdapterUnavailable with the reason and the install
command. The others skip cleanly unless vLLM 0.33 / SGLang 0.5.23 are installed; they keep B
small (the interpreter costs about 10 ms per request row) and compare the kernels with the CPU
reference decision by decision where the kernel takes our uniforms, token by token for greedy.
"""

from __future__ import annotations

import pytest
import torch

from losslessness.adapters import AdapterUnavailable, engines
from losslessness.adapters.engines import EngineSpec
from losslessness.reference import ChainUniforms, verify, verify_greedy
from losslessness.reference.block import (
    BLOCK_VERIFICATION,
    TOKEN_VERIFICATION,
    declared_verification,
)
from tests.adapters.installed import needs_engine

needs_vllm = needs_engine("vllm")
needs_sglang = needs_engine("sglang")
SPEC = EngineSpec("no-such-engine", ("1.0.0",), "pip install --no-deps no-such-engine==1.0.0")


def test_engine_not_installed_is_unavailable_with_the_install_command() -> None:
    """A missing engine raises AdapterUnavailable naming it and the command that installs it."""
    with pytest.raises(AdapterUnavailable, match=r"not installed.*pip install --no-deps"):
        engines.prepare_engine(SPEC)


def test_missing_triton_is_unavailable_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An installed engine without Triton raises AdapterUnavailable with Triton's pin."""
    versions = {"no-such-engine": "1.0.0", "triton": None}
    monkeypatch.setattr(engines, "installed_version", versions.get)
    with pytest.raises(AdapterUnavailable, match=r"Triton is not installed.*triton==3\.7\.1"):
        engines.prepare_engine(SPEC)


def test_prepare_engine_sets_the_interpreter_environment_without_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without CUDA the adapter sets TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="" itself and
    drops VLLM_TARGET_DEVICE=cpu; the user sets nothing."""
    monkeypatch.setattr(engines, "installed_version", lambda name: "1.0.0")
    monkeypatch.setattr(engines, "interpreter_mode", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert engines.prepare_engine(SPEC) == "1.0.0"
    import os

    assert os.environ["TRITON_INTERPRET"] == "1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert "VLLM_TARGET_DEVICE" not in os.environ


def test_changed_api_is_unavailable_naming_added_and_removed_parameters() -> None:
    """A signature that differs from the checked one names the added and removed parameters,
    says the version is outside the checked range, and gives the install command."""

    def renamed(draft_token_ids: object, target_logits: object, new_option: bool = False) -> None:
        """A stand-in for an engine function whose API changed."""

    with pytest.raises(AdapterUnavailable) as raised:
        engines.require_parameters(
            SPEC, "2.0.0", renamed, "rejection_sample", ("draft_token_ids", "target_probs")
        )
    message = str(raised.value)
    assert "outside the range 1.0.0" in message
    assert "added target_logits, new_option" in message
    assert "removed target_probs" in message
    assert SPEC.install in message


def _never_called(*args: object, **kwargs: object) -> None:
    raise AssertionError("the kernel is not called when only the declaration is read")


def test_block_verification_targets_declare_it_and_the_others_do_not() -> None:
    """sglang-block's chain callable and vllm-v2-block's sampler declare block verification
    (so the acceptance check holds them to block verification's acceptance, not to token
    verification's); SGLang's plain chain sampler and vLLM v2 without the option declare token
    verification. Read without the engines installed (the wrappers import no engine)."""
    from losslessness.adapters.sglang import SglangBlockSampler, SglangChainSampler
    from losslessness.adapters.vllm import SamplerOptions, VllmV2Sampler

    cpu = torch.device("cpu")
    assert declared_verification(SglangBlockSampler(_never_called, cpu)) == BLOCK_VERIFICATION
    plain = SglangChainSampler(_never_called, cpu, block_verification=False)
    assert declared_verification(plain) == TOKEN_VERIFICATION

    def convert(rates: list[float]) -> list[float]:
        return rates

    block = VllmV2Sampler(_never_called, convert, SamplerOptions(block=True), cpu)
    assert declared_verification(block) == BLOCK_VERIFICATION
    default = VllmV2Sampler(_never_called, convert, SamplerOptions(), cpu)
    assert declared_verification(default) == TOKEN_VERIFICATION


def _case(batch: int, k: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    target = torch.softmax(2 * torch.randn(batch, k + 1, vocab, generator=generator), -1)
    draft = torch.softmax(2 * torch.randn(batch, k, vocab, generator=generator), -1)
    drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator)
    return target.double(), draft.double(), drafts.reshape(batch, k)


@needs_sglang
def test_sglang_chain_kernel_couples_with_reference_decision_by_decision() -> None:
    """Fed our uniforms, SGLang's chain kernel emits exactly the reference's tokens (accepted
    drafts and the inverse-CDF final token) on 24 rows."""
    from losslessness.adapters.sglang import adapter

    chain = adapter().chain
    assert chain is not None
    target, draft, drafts = _case(24, 3, 12, seed=1)
    uniforms = ChainUniforms.draw(24, 3, torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(3)
    out = chain(target, draft, drafts, generator, uniforms=uniforms)  # type: ignore[call-arg]
    assert torch.equal(out, verify(target, draft, drafts, generator, uniforms=uniforms))


@needs_sglang
def test_sglang_greedy_tree_verify_equals_reference_greedy() -> None:
    """SGLang's greedy tree kernel on a chain emits the reference greedy tokens, with drafts
    that match the argmax for a random prefix length."""
    from losslessness.adapters.sglang import adapter

    greedy = adapter().greedy
    assert greedy is not None
    logits = torch.randn(16, 4, 10, generator=torch.Generator().manual_seed(4))
    drafts = logits[:, :3].argmax(-1)
    drafts[::2, 1] = (drafts[::2, 1] + 1) % 10
    assert torch.equal(greedy(logits, drafts), verify_greedy(logits, drafts))


@needs_vllm
def test_vllm_accept_decisions_couple_with_reference() -> None:
    """Fed our accept uniforms, vLLM's RejectionSampler.forward accepts exactly the drafts the
    reference accepts (its final token is an exponential race, not coupled)."""
    from losslessness.adapters.vllm import adapter

    chain = adapter().chain
    assert chain is not None
    target, draft, drafts = _case(16, 3, 12, seed=5)
    uniforms = ChainUniforms.draw(16, 3, torch.Generator().manual_seed(6))
    generator = torch.Generator().manual_seed(7)
    out = chain(target, draft, drafts, generator, uniforms=uniforms)  # type: ignore[call-arg]
    reference = verify(target, draft, drafts, generator, uniforms=uniforms)
    emitted = (out != -1).sum(dim=1)
    assert torch.equal(emitted, (reference != -1).sum(dim=1))
    accepted = torch.arange(4).unsqueeze(0) < (emitted - 1).unsqueeze(1)
    assert torch.equal(out[accepted], reference[accepted])


@needs_vllm
@pytest.mark.parametrize("name", ["vllm", "vllm-v2"])
def test_vllm_greedy_equals_reference_greedy(name: str) -> None:
    """vLLM's greedy path (v1 and model runner v2) emits the reference greedy tokens."""
    from losslessness.adapters.vllm import v1_adapter, v2_adapter

    loaded = v1_adapter(name) if name == "vllm" else v2_adapter(name)
    assert loaded.greedy is not None
    logits = torch.randn(8, 4, 10, generator=torch.Generator().manual_seed(8))
    drafts = logits[:, :3].argmax(-1)
    drafts[::2, 2] = (drafts[::2, 2] + 1) % 10
    assert torch.equal(loaded.greedy(logits, drafts), verify_greedy(logits, drafts))


@needs_sglang
def test_sglang_block_target_is_loaded_declaring_block_verification() -> None:
    """The registered sglang-block target, loaded with the real kernel, declares block
    verification and says so in its description (no 'false LOSSY' caveat left)."""
    from losslessness.targets import resolve_adapter

    loaded = resolve_adapter("sglang-block")
    assert declared_verification(loaded.chain) == BLOCK_VERIFICATION
    assert "block_verification=True" in loaded.description
    assert "wrongly" not in loaded.description


@needs_vllm
def test_vllm_synthetic_mode_accepts_drafts_the_target_never_emits() -> None:
    """With synthetic_mode, vLLM accepts a draft of target probability 0 (disjoint supports),
    which no lossless verifier does: the option relaxes acceptance."""
    from losslessness.adapters.vllm import synthetic_adapter

    chain = synthetic_adapter().chain
    assert chain is not None
    target = torch.tensor([[0.0, 1.0]]).repeat(16, 2, 1).double()
    draft = torch.tensor([[1.0, 0.0]]).repeat(16, 1, 1).double()
    drafts = torch.zeros(16, 1, dtype=torch.int64)
    out = chain(target, draft, drafts, torch.Generator().manual_seed(9))
    assert bool((out[:, 0] == 0).any())


def _random_parents(batch: int, nodes: int, generator: torch.Generator) -> torch.Tensor:
    """``[batch, nodes]`` random trees: node j+1's parent uniform in ``[0, j]``."""
    limits = torch.arange(1, nodes + 1, dtype=torch.float64)
    draws = torch.rand((batch, nodes), generator=generator, dtype=torch.float64)
    return (draws * limits).floor().to(torch.int64)


def test_sglang_tree_layout_walks_back_to_every_nodes_children_in_index_order() -> None:
    """Walking SGLang's first-child / next-sibling arrays from every node lists exactly its
    children, in increasing node index (the protocol's sibling order), on 40 random trees;
    retrive_index is the flat slot b*(N+1) + n."""
    from losslessness.reference.tree_layouts import to_sglang

    parents = _random_parents(40, 9, torch.Generator().manual_seed(11))
    layout = to_sglang(parents, torch.zeros_like(parents), torch.zeros(40, dtype=torch.int64))
    index = layout.retrive_index
    first_child, next_sibling = layout.retrive_next_token, layout.retrive_next_sibling
    batch, slots = index.shape
    assert torch.equal(index, torch.arange(batch * slots).reshape(batch, slots))
    assert bool((next_sibling[:, 0] == -1).all())
    for b in range(batch):
        for node in range(slots):
            walked = []
            child = int(first_child[b, node])
            while child != -1:
                walked.append(child)
                child = int(next_sibling[b, child])
            expected = [j + 1 for j in range(slots - 1) if int(parents[b, j]) == node]
            assert walked == expected, (b, node)


def _top_k_inputs() -> tuple[torch.Tensor, ...]:
    """Two trees (a root with two children) whose distinct siblings are the top-2 of q, valid
    under every draft scheme."""
    target = torch.full((2, 3, 4), 0.25, dtype=torch.float64)
    draft = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64).repeat(2, 3, 1)
    parents = torch.zeros((2, 2), dtype=torch.int64)
    tokens = torch.tensor([[0, 1], [0, 1]])
    return target, draft, parents, tokens


@pytest.mark.parametrize("scheme", ["iid", "without-replacement"])
def test_sglang_target_only_tree_sampler_refuses_schemes_other_than_top_k(scheme: str) -> None:
    """SGLang's target-only tree sampler ignores q (rejection sampling for deterministic
    drafts), so the tree verifier declares draft scheme top-k only and refuses the others with
    the reason, before any kernel call."""
    from losslessness.adapters.sglang import SglangTreeTargetOnly
    from losslessness.protocol import InvalidInputError

    verifier = SglangTreeTargetOnly(_never_called, torch.device("cpu"))
    assert verifier.draft_schemes == ("top-k",)
    with pytest.raises(InvalidInputError, match=r"draft_scheme.*ignores q.*'top-k' only"):
        verifier(*_top_k_inputs(), scheme, torch.Generator().manual_seed(0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available: the sampler loads")
def test_sglang_tree_target_is_unavailable_without_cuda_with_the_reason() -> None:
    """Without CUDA the sglang-tree target is UNAVAILABLE saying why: CUDA missing when
    SGLang is installed, else the command that installs it."""
    from losslessness.adapters.sglang import tree_adapter

    with pytest.raises(AdapterUnavailable, match=r"CUDA is not available|pip install"):
        tree_adapter()


def _greedy_tree_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """48 random trees of 10 nodes over V = 5 with repeated sibling tokens, tied logits
    (integers in [0, 3)), masked (-inf) tokens, and drafts that mostly follow the argmax so
    greedy paths go deep."""
    generator = torch.Generator().manual_seed(seed)
    batch, nodes, vocab = 48, 10, 5
    parents = _random_parents(batch, nodes, generator)
    logits = torch.randint(0, 3, (batch, nodes + 1, vocab), generator=generator).double()
    masked = torch.rand((batch, nodes + 1, vocab), generator=generator) < 0.25
    masked[..., 0] = False  # never a whole row
    logits = logits.masked_fill(masked, float("-inf"))
    best = logits.argmax(dim=-1)
    follow = best.gather(1, parents)
    other = torch.randint(0, vocab, (batch, nodes), generator=generator)
    tokens = torch.where(torch.rand((batch, nodes), generator=generator) < 0.7, follow, other)
    return logits, parents, tokens


@needs_sglang
@pytest.mark.parametrize("seed", [12, 13])
def test_sglang_greedy_tree_verifier_equals_reference_tree_greedy(seed: int) -> None:
    """SGLang's real verify_tree_greedy Triton kernel, on random trees converted to its
    first-child / next-sibling layout, emits the reference's tokens and accepted nodes
    (lowest-index child among repeated sibling tokens, lowest-index argmax among tied logits,
    masked tokens never chosen)."""
    from losslessness.adapters.sglang import adapter
    from losslessness.reference.tree import verify_tree_greedy

    greedy_tree = adapter().greedy_tree
    assert greedy_tree is not None
    logits, parents, tokens = _greedy_tree_case(seed)
    out = greedy_tree(logits, parents, tokens)
    expected = verify_tree_greedy(logits, parents, tokens)
    assert bool((expected.accepted_nodes[:, 1] >= 0).any())  # some paths are two deep
    assert torch.equal(out.tokens, expected.tokens)
    assert torch.equal(out.accepted_nodes, expected.accepted_nodes)
