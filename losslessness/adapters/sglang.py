"""SGLang's speculative verification kernels, wrapped into the chain and greedy protocols.

Checked against SGLang 0.5.23 (:data:`SGLANG`); outside it the adapter compares the signatures
it calls with the ones below and, where they differ, is UNAVAILABLE with the parameters added
and removed and the install command (:mod:`losslessness.adapters.engines`).

Targets:

- ``sglang``: ``sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton``
  (Triton; :data:`CHAIN_PARAMETERS`), chain rejection sampling with stochastic drafts, and the
  greedy tree verifier ``sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton``
  (:data:`GREEDY_PARAMETERS`), twice: as the chain greedy verifier on a chain-shaped tree, and
  as the greedy *tree* verifier (``greedy_tree``, :class:`SglangGreedyTreeVerifier`) on any
  tree of the protocol, converted to SGLang's layout by ``to_sglang``. On CUDA
  or, without CUDA, through Triton's interpreter on CPU tensors (the adapter sets
  ``TRITON_INTERPRET=1`` before the import). Its serving verifier is SGLang's EAGLE verify
  step with rejection sampling on per-request sampling parameters, held to the
  ``sglang-torch`` profile (:mod:`losslessness.adapters.sglang_serving`, which lists where
  SGLang's speculative path departs from its own sampler); its serving tree verifier is
  SGLang's default EAGLE tree verify on all-greedy batches (a batch with a sampled request
  needs the CUDA tree sampler: NotApplicable, stated in the adapter's exclusions).
- ``sglang-block``: the same chain kernel with ``block_verification=True`` (Sun et al. 2024,
  "Block verification accelerates speculative decoding", Alg. 2): lossless, and it accepts
  more than ``sum min(p, q)`` at positions >= 1. Its chain callable declares block
  verification (``losslessness_verification = "block"``,
  :func:`losslessness.reference.block.declared_verification`), so the acceptance check holds it
  to the prefix bound every lossless verifier obeys (LOSSY above it) and to block
  verification's own exact acceptance (SUBOPTIMAL below it).
- ``sglang-tree``: the CUDA tree sampler ``tree_speculative_sampling_target_only`` (sgl-kernel,
  or ``sglang.kernels.ops.speculative.sampling`` in SGLang 0.5.x), GPU only (below): as a chain
  verifier (one-hot drafts) and as a tree verifier (:class:`SglangTreeTargetOnly`, draft scheme
  ``top-k`` only); with SGLang 0.5.23 installed, also SGLang's default EAGLE tree verify on
  serving trees, sampled and greedy batches, held to ``sglang-flashinfer``
  (:class:`~losslessness.adapters.sglang_serving.SglangServingTreeVerifier`).

**Tree layout** (``to_sglang``, SGLang's ``build_tree_kernel_efficient`` output):
per row b, ``N+1`` slots, slot n holding node n of the protocol (slot 0 the root):
``candidates[b, n]`` its token (0 at the root), ``retrive_index[b, n] = b*(N+1) + n`` its
flat index into ``predicts`` and ``target_predict``, ``retrive_next_token[b, n]`` its first
child and ``retrive_next_sibling[b, n]`` its next sibling (slots, -1 for none). The adapter
orders siblings by node index, so "the first sibling that matches" is the protocol's
lowest-index child. ``accept_index`` has ``D+1`` columns (D the batch's depth): the kernels
walk at most D levels.

**Chain kernel conventions** (``speculative_sampling_classic_kernel``): per row b, ``N = k+1``
slots, slot 0 the root: ``candidates[b] = [0, d_0 .. d_{k-1}]`` int64, ``retrive_index[b, j] =
b*N + j``, ``retrive_next_token``/``retrive_next_sibling`` (not read by the chain kernel),
``uniform_samples[b, j]`` the coin of draft j (accept iff ``coin * q < p``, q in (0, 1]),
``uniform_samples_for_final_sampling[b]`` the uniform of the final token, drawn by inverse CDF
of ``relu(p - q)`` (or p_k after k acceptances): the first token whose cumulative mass exceeds
``u * total``. That is the protocol's ``uniforms=`` convention exactly, so decisions *and* the
final token are coupled with the CPU reference (float32 rounding aside). ``target_probs``
``[B, k+1, V]`` and ``draft_probs`` ``[B, k, V]`` float32; ``threshold_single =
threshold_acc = 1`` (SGLang 0.5.23's Triton wrapper takes both but never passes them to the
kernel, so relaxed thresholds change nothing on this path; the CUDA tree sampler reads them).
Output: ``accept_index[b, 0..m]`` the accepted slots (m = ``accept_token_num[b]``) and
``predicts`` at them the emitted tokens.

**Greedy** (``verify_tree_greedy_kernel_triton``): ``target_predict [B, N]`` is the target's
argmax at every slot, computed by the adapter with ``torch.argmax`` (as SGLang's worker does,
ties to the lowest index); the kernel walks the chain while the draft equals it.

**CUDA tree sampler** (``tree_speculative_sampling_target_only``, "target only";
``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``, kernel
``TreeSpeculativeSamplingTargetOnly``): at the current node n it takes *one* coin
``c = uniform_samples[b, n]`` and walks n's children in sibling order, accumulating their
target mass ``P_i = p(d_1) + .. + p(d_i)``; it accepts the first child with ``p(d_i) > 0`` and
``c < P_i`` (``threshold_acc = threshold_single = 1``), then moves there with that child's
coin. A rejected child's ``draft_probs[n, d_i]`` is overwritten with ``p(d_i)``, so after all
children are rejected the final token is drawn by inverse CDF (``uniform_samples_for_final_
sampling[b]``) from ``relu(p - draft_probs)``: p with the rejected children zeroed. At a
leaf (no child) the row of ``draft_probs`` is read as given (zeros from SGLang and from the
adapter), so the bonus token follows p. The draft law q is never read: the kernel samples
``y ~ p`` by inverse CDF over the children and accepts the child whose token is y. That is
rejection sampling for *deterministic* drafts (q = one-hot, EAGLE's top-k trees): sibling d_i
is accepted with probability ``p(d_i) / (1 - P_{i-1})`` after the earlier ones were
rejected, exactly the protocol's ``top-k`` rule (:mod:`losslessness.reference.tree`). Its
law is that rule's law, but it is not coupled with the reference (one coin per level, not one
per child). It needs *distinct* sibling tokens: a repeated token is counted twice in
``P_i`` (emitted with up to twice its mass), which the ``iid`` scheme allows; and it ignores
q, so on ``without-replacement`` drafts it would accept less than the scheme's own verifier.
The tree verifier therefore declares ``draft_schemes = ("top-k",)`` and refuses the others
(:class:`~losslessness.protocol.InvalidInputError` naming ``draft_scheme``). As a chain
verifier SGLang passes zeros as ``draft_probs``; so does the adapter, which requires one-hot
draft rows (``requires_one_hot_draft = True``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from losslessness.adapters.base import (
    Adapter,
    AdapterUnavailable,
    KernelVerifier,
    NotApplicable,
    import_optional,
    require_cuda,
)
from losslessness.adapters.engines import (
    REQUIREMENTS_FILE,
    EngineSpec,
    engine_device,
    import_engine_module,
    installed_version,
    mode_description,
    prepare_engine,
    require_interpreted,
    require_parameters,
    version_note,
)
from losslessness.adapters.sglang_serving import (
    SglangEngineFunctions,
    SglangServingTreeVerifier,
    SglangServingVerifier,
    emitted_chain,
    emitted_tree,
    renorm_on_cpu,
)
from losslessness.protocol import (
    PLACEHOLDER,
    InvalidInputError,
    TreeOutput,
    tree_depths,
    validate_chain_inputs,
    validate_greedy_inputs,
    validate_greedy_tree_inputs,
    validate_tree_inputs,
)
from losslessness.reference import ChainUniforms
from losslessness.reference.block import BLOCK_VERIFICATION
from losslessness.reference.tree_layouts import SglangTree, to_sglang

SGLANG = EngineSpec(
    "sglang",
    ("0.5.23",),
    f"pip install -c constraints.txt -r {REQUIREMENTS_FILE} && pip install --no-deps "
    "sglang==0.5.23",
)
"""SGLang as these adapters were checked against it (CPU interpreter; CUDA path unchanged)."""

CHAIN_PARAMETERS = (
    "predicts",
    "accept_index",
    "accept_token_num",
    "candidates",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
    "uniform_samples",
    "uniform_samples_for_final_sampling",
    "target_probs",
    "draft_probs",
    "threshold_single",
    "threshold_acc",
    "deterministic",
    "block_verification",
)
"""``chain_speculative_sampling_triton``'s parameters at SGLang 0.5.23."""

GREEDY_PARAMETERS = (
    "predicts",
    "accept_index",
    "accept_token_num",
    "candidates",
    "retrieve_index",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "target_predict",
)
"""``verify_tree_greedy_triton``'s parameters at SGLang 0.5.23."""

TREE_PARAMETERS = (
    "predicts",
    "accept_index",
    "accept_token_num",
    "candidates",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
    "uniform_samples",
    "uniform_samples_for_final_sampling",
    "target_probs",
    "draft_probs",
    "threshold_single",
    "threshold_acc",
    "deterministic",
)
"""``tree_speculative_sampling_target_only``'s parameters (sgl-kernel 0.1-0.3, SGLang 0.5.23)."""


class SglangTreeSampler(KernelVerifier):
    """Chain verifier calling ``sgl_kernel.tree_speculative_sampling_target_only``.

    Args:
        function: the kernel wrapper.
        device: the CUDA device.
    """

    requires_one_hot_draft = True
    """The kernel implements rejection sampling for deterministic drafts only."""

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """One verification step (chain protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs, or a draft row that is not one-hot.
        """
        batch, k, vocab = validate_chain_inputs(
            target_probs, draft_probs, draft_token_ids, generator
        )
        if k and not bool((draft_probs.amax(dim=-1) == 1).all()):
            raise InvalidInputError(
                "draft_probs",
                "SGLang's target-only kernel assumes deterministic drafts: every row of q must "
                "be one-hot (use losslessness.engine.device.deterministic_draft_case)",
            )
        if uniforms is None:
            uniforms = ChainUniforms.draw(batch, k, generator)
        device, nodes = self.device, k + 1
        candidates, slots, next_token, sibling = _chain_layout(draft_token_ids, device)
        coins = torch.zeros((batch, nodes), dtype=torch.float32, device=device)
        coins[:, :k] = uniforms.accept_uniforms.to(device, torch.float32)
        predicts = torch.full((batch * nodes,), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_index = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
        self.function(
            predicts,
            accept_index,
            accept_token_num,
            candidates,
            slots,
            next_token,
            sibling,
            coins,
            uniforms.sample_uniforms.to(device, torch.float32).contiguous(),
            target_probs.to(device, torch.float32).contiguous(),
            torch.zeros((batch, nodes, vocab), dtype=torch.float32, device=device),
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
        )
        accepted = accept_token_num.to(torch.int64).cpu()
        index = accept_index.to(torch.int64).cpu()
        tokens = predicts.to(torch.int64).cpu()
        out = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int64)
        positions = torch.arange(nodes)
        emitted = positions.unsqueeze(0) <= accepted.unsqueeze(1)
        out[emitted] = tokens[index.clamp(min=0)][emitted]
        return out


def _chain_layout(draft_token_ids: torch.Tensor, device: torch.device) -> SglangTree:
    """SGLang's layout of a batch of chains (node i+1 the only child of node i, root token 0),
    by :func:`losslessness.reference.tree_layouts.to_sglang`, on ``device``.

    Args:
        draft_token_ids: ``[B, k]`` integer drafts (validated).
        device: where the kernels read the layout.

    Returns:
        :class:`SglangTree` of ``[B, k+1]`` int64 tensors.
    """
    batch, k = draft_token_ids.shape
    parents = torch.arange(k, dtype=torch.int64).expand(batch, k)
    layout = to_sglang(
        parents, draft_token_ids.to(torch.int64).cpu(), torch.zeros(batch, dtype=torch.int64)
    )
    return SglangTree(*(tensor.to(device) for tensor in layout))


class SglangChainSampler(KernelVerifier):
    """Chain verifier calling ``chain_speculative_sampling_triton`` (coupled: takes
    ``uniforms=``).

    Args:
        function: the kernel wrapper.
        device: where the tensors live (``cpu`` under the interpreter, else ``cuda``).
        block_verification: pass ``block_verification=True`` (Sun et al. 2024).
    """

    def __init__(
        self, function: Callable[..., Any], device: torch.device, block_verification: bool
    ) -> None:
        super().__init__(function, device)
        self.block_verification = block_verification

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """One verification step (chain protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs or ``k == 0``.
        """
        batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
        if k < 1:
            raise InvalidInputError("draft_token_ids", "SGLang's chain kernel needs k >= 1")
        if uniforms is None:
            uniforms = ChainUniforms.draw(batch, k, generator)
        device, nodes = self.device, k + 1
        candidates, slots, next_token, sibling = _chain_layout(draft_token_ids, device)
        coins = torch.zeros((batch, nodes), dtype=torch.float32)
        coins[:, :k] = uniforms.accept_uniforms.to(torch.float32)
        predicts = torch.full((batch * nodes,), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_index = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
        self.function(
            predicts,
            accept_index,
            accept_token_num,
            candidates.to(device),
            slots,
            next_token,
            sibling,
            coins.to(device),
            uniforms.sample_uniforms.to(device, torch.float32).contiguous(),
            target_probs.to(device, torch.float32).contiguous(),
            draft_probs.to(device, torch.float32).contiguous(),
            1.0,
            1.0,
            True,
            block_verification=self.block_verification,
        )
        return emitted_chain(predicts, accept_index, accept_token_num)


class SglangBlockSampler:
    """``chain_speculative_sampling_triton`` with ``block_verification=True``.

    It takes no ``uniforms=``: block verification decides on the whole block (accept the
    longest prefix whose coin falls below a block-level probability), not draft by draft with
    ``u < p/q``, so the coupling protocol's per-draft rule does not describe it; its law is
    tested statistically. The kernel still consumes a coin per draft and one final uniform,
    drawn here from the protocol's generator.

    Args:
        function: the kernel wrapper.
        device: where the tensors live.
    """

    losslessness_verification = BLOCK_VERIFICATION
    """Declares block verification (:func:`losslessness.reference.block.declared_verification`):
    the acceptance check's SUBOPTIMAL threshold at positions >= 1 is then block verification's
    own exact acceptance, and its LOSSY bound the prefix bound of every lossless verifier."""

    def __init__(self, function: Callable[..., Any], device: torch.device) -> None:
        self.chain = SglangChainSampler(function, device, block_verification=True)

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """One verification step (chain protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs or ``k == 0``.
        """
        return self.chain(target_probs, draft_probs, draft_token_ids, generator)


class SglangGreedyTreeVerifier(KernelVerifier):
    """Greedy tree verifier calling ``verify_tree_greedy_triton`` on the protocol's trees
    (:class:`~losslessness.protocol.GreedyTreeVerifier`).

    The trees go to SGLang's layout by ``to_sglang``; ``target_predict [B, N+1]``
    is ``torch.argmax`` of the logits at every node, as SGLang's EAGLE worker computes it
    (ties to the lowest index, ``-inf`` masked tokens never chosen unless the row is all
    ``-inf``, which validation refuses).

    Args:
        function: the kernel wrapper.
        device: where the tensors live (``cpu`` under the interpreter, else ``cuda``).
    """

    def __call__(
        self, target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
    ) -> TreeOutput:
        """One greedy tree verification step; :class:`TreeOutput` (tokens ``[B, D+1]``,
        accepted nodes ``[B, D]``, int64 on CPU).

        Raises:
            InvalidInputError: see :func:`losslessness.protocol.validate_greedy_tree_inputs`.
        """
        batch, nodes, _ = validate_greedy_tree_inputs(target_logits, parents, token_ids)
        device, slots = self.device, nodes + 1
        tree = parents.long().cpu()
        depth = int(tree_depths(tree).max())
        layout = to_sglang(tree, token_ids, torch.zeros(batch, dtype=torch.int64))
        candidates, index, next_token, sibling = layout
        target_predict = target_logits.argmax(dim=-1).to(torch.int64)
        predicts = torch.full((batch * slots,), PLACEHOLDER, dtype=torch.int64, device=device)
        accept_index = torch.full(
            (batch, depth + 1), PLACEHOLDER, dtype=torch.int64, device=device
        )
        accept_token_num = torch.zeros(batch, dtype=torch.int64, device=device)
        self.function(
            predicts,
            accept_index,
            accept_token_num,
            candidates.to(device),
            index.to(device),
            next_token.to(device),
            sibling.to(device),
            target_predict.to(device).contiguous(),
        )
        return emitted_tree(predicts, accept_index, accept_token_num)


class SglangTreeTargetOnly(KernelVerifier):
    """Tree verifier calling ``tree_speculative_sampling_target_only`` (CUDA) on the
    protocol's trees (:class:`~losslessness.protocol.TreeVerifier`), draft scheme ``top-k``
    only.

    The kernel's conventions and why it supports deterministic (top-k) siblings only are in
    the module docstring. Randomness: ``B*(N+1)`` coins (``torch.rand`` float32 on the
    generator's device; column n picks among node n's children) then ``B`` final uniforms;
    not coupled with the reference.

    Args:
        function: the kernel wrapper.
        device: the CUDA device.
    """

    draft_schemes: tuple[str, ...] = ("top-k",)
    """The draft schemes whose inputs this verifier accepts; others raise InvalidInputError."""

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        generator: torch.Generator,
    ) -> TreeOutput:
        """One tree verification step; :class:`TreeOutput` int64 on CPU.

        Raises:
            InvalidInputError: see :func:`losslessness.protocol.validate_tree_inputs`, or a
                draft scheme other than ``top-k`` (the reason names what goes wrong).
        """
        batch, nodes, vocab = validate_tree_inputs(
            target_probs, draft_probs, parents, token_ids, draft_scheme, generator
        )
        if draft_scheme not in self.draft_schemes:
            raise NotApplicable(
                f"{draft_scheme!r} is not supported: SGLang's tree_speculative_sampling_"
                "target_only ignores q and accepts a child with the target's cumulative "
                "mass over its siblings (rejection sampling for deterministic drafts): "
                "repeated sibling tokens ('iid') are counted twice, and sampled siblings "
                "would be verified without their draft law; it supports 'top-k' only",
                argument="draft_scheme",
            )
        device, slots = self.device, nodes + 1
        tree = parents.long().cpu()
        depth = int(tree_depths(tree).max())
        layout = to_sglang(tree, token_ids, torch.zeros(batch, dtype=torch.int64))
        candidates, index, next_token, sibling = layout
        coins = torch.rand((batch, slots), generator=generator, device=generator.device)
        final = torch.rand((batch,), generator=generator, device=generator.device)
        predicts = torch.full((batch * slots,), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_index = torch.full(
            (batch, depth + 1), PLACEHOLDER, dtype=torch.int32, device=device
        )
        accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
        self.function(
            predicts,
            accept_index,
            accept_token_num,
            candidates.to(device),
            index.to(device),
            next_token.to(device),
            sibling.to(device),
            coins.to(device, torch.float32).contiguous(),
            final.to(device, torch.float32).contiguous(),
            target_probs.to(device, torch.float32).contiguous(),
            torch.zeros((batch, slots, vocab), dtype=torch.float32, device=device),
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
        )
        return emitted_tree(predicts, accept_index, accept_token_num)


class SglangGreedyVerifier(KernelVerifier):
    """Greedy verifier calling ``verify_tree_greedy_triton`` on a chain-shaped tree.

    Args:
        function: the kernel wrapper.
        device: where the tensors live.
    """

    def __call__(self, target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
        """One greedy verification step (greedy protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs.
        """
        batch, k, _ = validate_greedy_inputs(target_logits, draft_token_ids)
        device, nodes = self.device, k + 1
        candidates, slots, next_token, sibling = _chain_layout(draft_token_ids, device)
        target_predict = target_logits.argmax(dim=-1).to(torch.int64)
        predicts = torch.full((batch * nodes,), PLACEHOLDER, dtype=torch.int64, device=device)
        accept_index = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int64, device=device)
        accept_token_num = torch.zeros(batch, dtype=torch.int64, device=device)
        self.function(
            predicts,
            accept_index,
            accept_token_num,
            candidates.to(device),
            slots,
            next_token,
            sibling,
            target_predict.to(device),
        )
        return emitted_chain(predicts, accept_index, accept_token_num)


def _checked_function(
    version: str, module: Any, name: str, parameters: tuple[str, ...]
) -> Callable[..., Any]:
    """``module.name``, a callable with exactly ``parameters`` (SGLang 0.5.23's).

    Raises:
        AdapterUnavailable: missing, or other parameters (naming them and the install command).
    """
    function: Callable[..., Any] | None = getattr(module, name, None)
    if not callable(function):
        where = module.__name__.removeprefix("sglang.")
        raise AdapterUnavailable(
            f"sglang {version}: API changed, {where}.{name} is missing; install the checked "
            f"version with: {SGLANG.install}"
        )
    require_parameters(SGLANG, version, function, name, parameters)
    return function


def _triton_adapter(name: str, block_verification: bool) -> Adapter:
    version = prepare_engine(SGLANG)
    reject = import_engine_module(
        SGLANG, version, "sglang.kernels.ops.speculative.reject_sampling"
    )
    chain_function = _checked_function(
        version, reject, "chain_speculative_sampling_triton", CHAIN_PARAMETERS
    )
    require_interpreted(
        SGLANG, version, reject.speculative_sampling_classic_kernel, "speculative_sampling_classic"
    )
    device = engine_device()
    greedy = None
    greedy_tree = None
    serving = None
    serving_tree = None
    what = "chain_speculative_sampling_triton"
    if not block_verification:
        tree = import_engine_module(SGLANG, version, "sglang.kernels.ops.speculative.spec_tree")
        greedy_function = _checked_function(
            version, tree, "verify_tree_greedy_triton", GREEDY_PARAMETERS
        )
        greedy = SglangGreedyVerifier(greedy_function, device)
        greedy_tree = SglangGreedyTreeVerifier(greedy_function, device)
        functions = _engine_functions(
            version, chain_function, greedy_function,
            "sglang.kernels.ops.sampling.renorm_triton",
        )
        serving = SglangServingVerifier(functions, device)
        serving_tree = SglangServingTreeVerifier(functions, device, serving.engine_profile)
        what += (
            " and verify_tree_greedy_triton (greedy chain as a chain-shaped tree, and greedy "
            "tree verification on any tree in SGLang's first-child/next-sibling layout; "
            "argmax by torch.argmax); serving: EAGLE verify with rejection sampling "
            "(eagle_sample's penalties, bias, temperature softmax, Triton top-k/top-p renorm, "
            "chain kernel; per-request SamplingParams and penalizer orchestrator), held to the "
            "sglang-torch profile; serving trees: EAGLE's default verify on all-greedy batches "
            "(argmax of the processed logits, greedy tree kernel; a batch with a sampled "
            "request needs the CUDA tree sampler: sglang-tree)"
        )
    else:
        what += (
            " with block_verification=True (Sun et al. 2024; declared as block verification: "
            "held to the prefix bound of every lossless verifier and to block verification's "
            "own acceptance)"
        )
    return Adapter(
        name=name,
        description=f"{version_note(SGLANG, version)} {what}; {mode_description()}; float32 "
        "probabilities; "
        + (
            "uniforms drawn from the protocol's generator (not coupled: block decisions)"
            if block_verification
            else "decisions and final token coupled (uniforms=)"
        ),
        chain=(
            SglangBlockSampler(chain_function, device)
            if block_verification
            else SglangChainSampler(chain_function, device, block_verification=False)
        ),
        greedy=greedy,
        greedy_tree=greedy_tree,
        serving=serving,
        serving_tree=serving_tree,
        engine_profile=None if serving is None else serving.engine_profile,
        exclusions=None if serving_tree is None else SAMPLED_SERVING_TREES,
    )


SAMPLED_SERVING_TREES = (
    "serving trees with a sampled request (SGLang verifies them with the CUDA-only "
    "tree_speculative_sampling_target_only: the sglang-tree target)"
)
"""The ``sglang`` target's exclusion: its serving tree verifier takes all-greedy batches."""


def _engine_functions(
    version: str,
    chain_function: Callable[..., Any] | None,
    greedy_function: Callable[..., Any],
    renorm_module: str,
    tree_function: Callable[..., Any] | None = None,
) -> SglangEngineFunctions:
    """SGLang's sampling state and kernels for its serving verifiers
    (:class:`~losslessness.adapters.sglang_serving.SglangEngineFunctions`).

    Args:
        version: the installed SGLang version.
        chain_function, greedy_function, tree_function: the kernels.
        renorm_module: ``sglang.kernels.ops.sampling.renorm_triton`` (CPU, through the
            interpreter: its wrappers run on CPU tensors by
            :func:`~losslessness.adapters.sglang_serving.renorm_on_cpu`) or
            ``sglang.kernels.ops.sampling.renorm`` (CUDA: FlashInfer's, as ``eagle_sample``
            imports them).

    Raises:
        AdapterUnavailable: a module missing or a renorm kernel imported before the
            interpreter was set up.
    """
    params = import_engine_module(SGLANG, version, "sglang.srt.sampling.sampling_params")
    penaltylib = import_engine_module(SGLANG, version, "sglang.srt.sampling.penaltylib")
    repetition = import_engine_module(
        SGLANG, version, "sglang.srt.sampling.penaltylib.repetition_penalty"
    )
    sampling = import_engine_module(SGLANG, version, "sglang.kernels.ops.sampling")
    renorm = import_engine_module(SGLANG, version, renorm_module)
    if renorm_module.endswith("renorm_triton"):
        require_interpreted(
            SGLANG, version, renorm._mask_and_partial_sum_kernel, "_mask_and_partial_sum_kernel"
        )
        top_k, top_p = (
            renorm_on_cpu(renorm.top_k_renorm_probs_triton),
            renorm_on_cpu(renorm.top_p_renorm_probs_triton),
        )
    else:
        top_k, top_p = renorm.top_k_renorm_prob, renorm.top_p_renorm_prob
    return SglangEngineFunctions(
        sampling_params=params.SamplingParams,
        penaltylib=penaltylib,
        apply_scaling_penalties=repetition.apply_scaling_penalties,
        softmax=sampling.softmax,
        top_k_renorm=top_k,
        top_p_renorm=top_p,
        chain=chain_function,
        greedy=greedy_function,
        top_k_all=params.TOP_K_ALL,
        tree=tree_function,
    )


def adapter() -> Adapter:
    """The ``sglang`` target: Triton chain sampling, greedy chain and greedy tree verification.

    Raises:
        AdapterUnavailable: SGLang or Triton missing, an API that differs from SGLang 0.5.23's,
            or SGLang imported before the interpreter could be set up (the reason says which
            and gives the install command).
    """
    return _triton_adapter("sglang", block_verification=False)


def block_adapter() -> Adapter:
    """The ``sglang-block`` target: the chain kernel with ``block_verification=True``.

    Raises:
        AdapterUnavailable: as :func:`adapter`.
    """
    return _triton_adapter("sglang-block", block_verification=True)


def tree_adapter(device: str = "cuda") -> Adapter:
    """The ``sglang-tree`` target: the CUDA tree sampler (GPU only), as a chain verifier
    (one-hot drafts) and a tree verifier (draft scheme ``top-k``).

    Without CUDA nothing of SGLang is imported (an import here would decorate SGLang's Triton
    kernels for the GPU and spoil the ``sglang`` target's interpreter in the same process).

    Raises:
        AdapterUnavailable: neither sgl-kernel nor SGLang is installed (with the install
            command), CUDA missing, or a different signature.
    """
    if installed_version("sgl-kernel") is not None:
        module_name, package = "sgl_kernel", "sgl-kernel"
    elif installed_version("sglang") is not None:
        module_name, package = "sglang.kernels.ops.speculative.sampling", "sglang"
    else:
        raise AdapterUnavailable(
            "neither sgl-kernel nor sglang is installed; install SGLang with: "
            f"{SGLANG.install} (the tree sampler needs CUDA)"
        )
    version = installed_version(package) or "unknown"
    require_cuda(f"{package}'s tree_speculative_sampling_target_only is CUDA only")
    module = import_optional(module_name, package)
    function = getattr(module, "tree_speculative_sampling_target_only", None)
    if function is None:
        raise AdapterUnavailable(
            f"{package} {version}: API changed, no tree_speculative_sampling_target_only"
        )
    parameters = tuple(inspect.signature(function).parameters)
    if parameters != TREE_PARAMETERS:
        raise AdapterUnavailable(
            f"{package} {version}: API changed, tree_speculative_sampling_target_only"
            f"{parameters} differs from the {TREE_PARAMETERS} this adapter was written against"
        )
    serving_tree = None
    serving_note = ""
    if package == "sglang" and version in SGLANG.checked:
        serving_tree = _cuda_serving_tree(version, function, torch.device(device))
        serving_note = (
            "; serving trees: EAGLE's default verify (eagle_sample's penalties, bias, "
            "temperature softmax, FlashInfer top-k/top-p renorm, this kernel; greedy batches: "
            "verify_tree_greedy_func), held to the sglang-flashinfer profile"
        )
    return Adapter(
        name="sglang-tree",
        description=f"{package} {version} tree_speculative_sampling_target_only on {device}: "
        "chain as a degenerate tree with one-hot drafts, and trees in SGLang's "
        "first-child/next-sibling layout with draft scheme top-k only (the kernel ignores q); "
        f"float32 probabilities; not coupled (one coin per tree level){serving_note}",
        chain=SglangTreeSampler(function, device),
        tree=SglangTreeTargetOnly(function, device),
        serving_tree=serving_tree,
        engine_profile=None if serving_tree is None else serving_tree.engine_profile,
        exclusions="tree draft schemes other than top-k (the kernel ignores q)",
    )


def _cuda_serving_tree(
    version: str, function: Callable[..., Any], device: torch.device
) -> SglangServingTreeVerifier:
    """``sglang-tree``'s serving tree verifier: SGLang's sampling state, ``eagle_sample``'s
    processing with the renormalisation it imports on CUDA (FlashInfer's), the platform's
    greedy tree verify (``spec_tree.verify_tree_greedy_func``) and ``function``. Claims the
    ``sglang-flashinfer`` profile, SGLang's default sampling backend on CUDA.

    Raises:
        AdapterUnavailable: a module missing or a signature other than SGLang 0.5.23's.
    """
    spec_tree = import_engine_module(SGLANG, version, "sglang.kernels.ops.speculative.spec_tree")
    greedy = _checked_function(
        version, spec_tree, "verify_tree_greedy_func", (*GREEDY_PARAMETERS, "topk")
    )
    functions = _engine_functions(
        version, None, greedy, "sglang.kernels.ops.sampling.renorm", function
    )
    return SglangServingTreeVerifier(functions, device, "sglang-flashinfer")
