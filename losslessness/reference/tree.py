"""Reference tree and multi-draft verifiers (the ground truth for the tree protocols).

Sampling (:func:`verify_tree`): from the root, the children of the current node are tried in
index order against a running target law r (first p at the node):

- ``iid`` siblings (drawn independently from q): accept child x with probability
  ``min(1, r(x) / q(x))``; on rejection ``r <- norm(max(0, r - q))``. This is SpecInfer's
  multi-step speculative sampling (Miao et al. 2024, "SpecInfer", Alg. 2) and the multi-draft
  rule of Chen et al. / SpecTr's baseline (Sun et al. 2023, section 4.1).
- ``without-replacement`` siblings (each drawn from q with the earlier ones removed): the same
  with ``q`` replaced by the running draft law ``q'`` (q with the tried siblings zeroed and
  renormalised): accept with ``min(1, r(x) / q'(x))``; on rejection ``r <- norm(max(0,
  r - q'))`` then ``q'(x) <- 0`` and renormalise. Recursive rejection sampling without
  replacement (Jeon et al. 2024, "Recursive Speculative Decoding", Alg. 2).
- ``top-k`` siblings (deterministic): accept child x with probability ``r(x)``; on rejection
  ``r(x) <- 0`` and renormalise (sampling x ~ r one candidate at a time; as in EAGLE-2's and
  SGLang's tree sampling for deterministic trees).

An accepted child becomes the current node (r = its p, q its draft law); when every child is
rejected the final token is drawn from r, and at a leaf the bonus token from its p. By induction
over the siblings each step emits its next token from p at the current node, so the emitted
tokens follow the target (Miao et al. 2024, Thm. 4.2; Jeon et al. 2024, Thm. 3.1).

Greedy (:func:`verify_tree_greedy`): move to the lowest-index child whose token is the argmax of
the target's logits at the current node; the final token is that argmax.

On CPU every row's tree is walked by the compiled kernel
:func:`losslessness.reference.tree_kernel.verify_tree_rows` (one pass per row, split over
``torch.get_num_threads()`` threads), which also makes the protocol's ``O(B N V)`` value checks
on its way for float32/float64 inputs with int64 parents and ids (any failed check hands the
call to :func:`losslessness.protocol.validate_tree_inputs`, which raises the protocol's error).
Off CPU, :func:`_verify_tree_validated` computes the same rule with torch operations:
everything is vectorised over the batch (a loop over depth and sibling slot only) and computed in
float64 (float32 on ``mps``). Only the rows still trying a child are touched, and a row's
residual is materialised (``[R, V]``) only once one of its children is rejected; before that the
acceptance ratio reads single entries of the inputs. Randomness: ``B * N`` accept uniforms
(node ``j+1``'s decision uses column j) then ``B`` sampling uniforms, all ``torch.rand`` on the
generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from losslessness.laws import residual_distribution
from losslessness.protocol import (
    DRAFT_SCHEMES,
    PLACEHOLDER,
    ROW_SUM_TOLERANCE,
    InvalidInputError,
    TreeOutput,
    tree_depths,
    validate_greedy_tree_inputs,
    validate_tree_inputs,
)
from losslessness.reference import tree_kernel
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.sampling import compute_dtype, sample_inverse_cdf
from losslessness.reference.threads import split_rows, worst_of


def child_table(parents: torch.Tensor) -> torch.Tensor:
    """Every node's children in index order, as a padded table.

    Args:
        parents: ``[B, N]`` int64, validated (``parents[b, j]`` in ``[0, j]``).

    Returns:
        ``[B, N+1, C]`` int64, C the largest number of children of any node (at least 1);
        ``table[b, n, s]`` is the s-th child (1..N) of node n, :data:`PLACEHOLDER` past the last.
    """
    batch, nodes = parents.shape
    parents = parents.long()
    earlier = torch.ones((nodes, nodes), dtype=torch.bool, device=parents.device).tril(-1)
    same_parent = parents.unsqueeze(2) == parents.unsqueeze(1)
    slot = (same_parent & earlier).sum(dim=2)
    width = int(slot.max()) + 1 if slot.numel() else 1
    table = torch.full((batch, nodes + 1, width), PLACEHOLDER, dtype=torch.int64,
                       device=parents.device)
    rows = torch.arange(batch, device=parents.device).unsqueeze(1).expand(batch, nodes)
    node_ids = torch.arange(1, nodes + 1, device=parents.device).expand(batch, nodes)
    table[rows, parents, slot] = node_ids
    return table


def _batch_depth(parents: torch.Tensor) -> int:
    """D, the depth of the deepest node of the batch's trees; 0 for an empty batch (whose
    outputs are then ``[0, 1]`` and ``[0, 0]``)."""
    return int(tree_depths(parents).max()) if parents.shape[0] else 0


def _renormalise(probs: torch.Tensor) -> torch.Tensor:
    total = probs.sum(dim=-1, keepdim=True)
    return probs / torch.where(total > 0, total, 1.0)


def _residual_rows(law: torch.Tensor, draft_law: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, r - q))`` row-wise, equal bit for bit to
    :func:`losslessness.laws.residual_distribution` on float64 rows (the same
    operations, done in place, without its full-size ``where``): rows without excess mass keep
    ``r``."""
    if law.dtype != torch.float64:
        return residual_distribution(law, draft_law).to(law.dtype)
    excess = (law - draft_law).clamp_(min=0.0)
    peak = excess.amax(dim=-1, keepdim=True)
    positive = peak > 0
    excess.div_(torch.where(positive, peak, 1.0))
    excess.div_(excess.sum(dim=-1, keepdim=True))
    flat = ~positive.squeeze(1)
    if bool(flat.any()):
        excess[flat] = law[flat]
    return excess


class _Rows:
    """Row and entry reads of a ``[B, N+1, V]`` tensor at (batch row, node) pairs given by
    their flat index ``row * (N+1) + node``: ``index_select`` on a flat view when the tensor is
    contiguous (4-5x faster than advanced indexing), advanced indexing otherwise (e.g. expanded
    inputs)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.nodes = tensor.shape[1]
        self.vocab = tensor.shape[2]
        self.flat = tensor.view(-1, self.vocab) if tensor.is_contiguous() else None

    def rows(self, flat_index: torch.Tensor) -> torch.Tensor:
        """``[R, V]`` rows at the flat indices ``[R]``."""
        if self.flat is not None:
            return self.flat.index_select(0, flat_index)
        return self.tensor[flat_index // self.nodes, flat_index % self.nodes]

    def entries(self, flat_index: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """``[R]`` entries ``tensor[row, node, token]``."""
        if self.flat is not None:
            return self.flat.view(-1).index_select(0, flat_index * self.vocab + token)
        return self.tensor[flat_index // self.nodes, flat_index % self.nodes, token]


def verify_tree(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """One tree speculative-sampling step per row, for the declared draft scheme.

    Args:
        target_probs: ``[B, N+1, V]`` float, p at every node's context (row 0 the root).
        draft_probs: ``[B, N+1, V]`` float, q at every node its children were drawn from.
        parents: ``[B, N]`` int64, ``parents[b, j] < j + 1``.
        token_ids: ``[B, N]`` int64, node ``j+1``'s token.
        draft_scheme: ``"iid"``, ``"without-replacement"`` or ``"top-k"``
            (:data:`losslessness.protocol.DRAFT_SCHEMES`); the rules are in the module
            docstring, with their sources.
        generator: draws ``B*N`` accept uniforms then ``B`` sampling uniforms (``torch.rand``,
            float64) on its device.

    Returns:
        :class:`TreeOutput`: tokens ``[B, D+1]`` and accepted nodes ``[B, D]`` int64 on the
        inputs' device.

    Raises:
        InvalidInputError: see :func:`losslessness.protocol.validate_tree_inputs`; inputs on
            different devices.
    """
    if _screenable(target_probs, draft_probs, parents, token_ids, generator):
        return _verify_tree_screened(
            target_probs, draft_probs, parents, token_ids, draft_scheme, generator
        )
    batch, nodes, _ = validate_tree_inputs(
        target_probs, draft_probs, parents, token_ids, draft_scheme, generator
    )
    device = target_probs.device
    for name, tensor in (("draft_probs", draft_probs), ("parents", parents),
                         ("token_ids", token_ids)):
        if tensor.device != device:
            raise InvalidInputError(
                name, f"is on {tensor.device}, but target_probs is on {device}; use one device"
            )
    dtype = compute_dtype(device)
    accept_u = torch.rand((batch, nodes), generator=generator, dtype=dtype,
                          device=generator.device).to(device)
    sample_u = torch.rand((batch,), generator=generator, dtype=dtype,
                          device=generator.device).to(device)
    if device.type == "cpu":
        return _kernel_tree(
            target_probs, draft_probs, parents, token_ids, str(draft_scheme), accept_u, sample_u
        )[0]
    return _verify_tree_validated(
        target_probs.to(dtype), draft_probs.to(dtype), parents.long(), token_ids.long(),
        draft_scheme, accept_u, sample_u,
    )


_KERNEL_DTYPES = (torch.float32, torch.float64)


def _screenable(
    target_probs: object,
    draft_probs: object,
    parents: object,
    token_ids: object,
    generator: object,
) -> bool:
    """Whether a call may validate its values on the kernel's way (:func:`_verify_tree_screened`):
    CPU float32/float64 probabilities, int64 parents and ids, a CPU ``torch.Generator``. The
    structure and shapes are still checked first by the protocol's validator."""
    tensors = (target_probs, draft_probs, parents, token_ids)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors):
        return False
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
        return False
    assert isinstance(target_probs, torch.Tensor) and isinstance(draft_probs, torch.Tensor)
    assert isinstance(parents, torch.Tensor) and isinstance(token_ids, torch.Tensor)
    return (
        target_probs.dtype in _KERNEL_DTYPES
        and draft_probs.dtype in _KERNEL_DTYPES
        and parents.dtype == torch.int64
        and token_ids.dtype == torch.int64
    )


def _verify_tree_screened(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: object,
    generator: torch.Generator,
) -> TreeOutput:
    """:func:`verify_tree` with the ``O(B N V)`` value checks made by the kernel on its way.

    The protocol's validator checks everything else first; the kernel then reports what it
    saw of the values (:class:`_TreeFacts`), and any failed check calls the full validator,
    which raises the protocol's own error (with the generator restored to its state before the
    call). Should the full validator pass (the kernel's row sums may differ from its own in
    the last bit), the tokens already drawn are returned.
    """
    batch, nodes, _ = validate_tree_inputs(
        target_probs, draft_probs, parents, token_ids, draft_scheme, generator,
        check_values=False,
    )
    state = generator.get_state()
    accept_u = torch.rand((batch, nodes), generator=generator, dtype=torch.float64)
    sample_u = torch.rand((batch,), generator=generator, dtype=torch.float64)
    output, facts = _kernel_tree(
        target_probs, draft_probs, parents, token_ids, str(draft_scheme), accept_u, sample_u
    )
    if not facts.passed(str(draft_scheme)):
        try:
            validate_tree_inputs(
                target_probs, draft_probs, parents, token_ids, draft_scheme, generator
            )
        except InvalidInputError:
            generator.set_state(state)
            raise
    return output


@dataclass(frozen=True)
class _TreeFacts:
    """What :func:`losslessness.reference.tree_kernel.verify_tree_rows` saw of the values,
    over every thread's rows (see its Returns)."""

    smallest_target: float
    worst_target_sum_error: float
    smallest_draft: float
    worst_draft_sum_error: float
    smallest_drafted: float
    repeated_siblings: bool
    top_k_beaten: bool

    def passed(self, scheme: str) -> bool:
        """True iff the values pass the validator's checks for ``scheme``."""
        return (
            self.smallest_target >= 0
            and self.worst_target_sum_error <= ROW_SUM_TOLERANCE
            and self.smallest_draft >= 0
            and self.worst_draft_sum_error <= ROW_SUM_TOLERANCE
            and self.smallest_drafted > 0
            and not (scheme != "iid" and self.repeated_siblings)
            and not (scheme == "top-k" and self.top_k_beaten)
        )


def _kernel_array(probs: torch.Tensor) -> np.ndarray:
    """A numpy view of CPU probabilities for the kernel (float16/bfloat16 converted, exactly,
    to float32; any strides kept, so expanded inputs are not materialised)."""
    if probs.dtype not in _KERNEL_DTYPES:
        probs = probs.to(torch.float32)
    return probs.detach().numpy()


def _kernel_tree(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    scheme: str,
    accept_u: torch.Tensor,
    sample_u: torch.Tensor,
) -> tuple[TreeOutput, _TreeFacts]:
    """Every row's tree verified by :func:`losslessness.reference.tree_kernel.verify_tree_rows`
    on CPU, split over threads by :func:`losslessness.reference.threads.split_rows`.

    Args:
        target_probs, draft_probs: ``[B, N+1, V]`` CPU float (structure validated).
        parents, token_ids: ``[B, N]`` CPU integers (validated).
        scheme: a validated draft scheme.
        accept_u: ``[B, N]`` CPU float64; sample_u: ``[B]`` CPU float64.

    Returns:
        The :class:`TreeOutput` and what the kernel saw of the values.
    """
    batch = parents.shape[0]
    depth = _batch_depth(parents)
    tokens = torch.empty((batch, depth + 1), dtype=torch.int64)
    accepted = torch.empty((batch, depth), dtype=torch.int64)
    p, q = _kernel_array(target_probs), _kernel_array(draft_probs)
    tree = parents.to(torch.int64).contiguous().numpy()
    ids = token_ids.to(torch.int64).contiguous().numpy()
    accept = accept_u.to(torch.float64).contiguous().numpy()
    sample = sample_u.to(torch.float64).contiguous().numpy()
    out = (tokens.numpy(), accepted.numpy())
    code = DRAFT_SCHEMES.index(scheme)

    def run(rows: slice) -> tuple[float, float, float, float, float, bool, bool]:
        return tree_kernel.verify_tree_rows(  # type: ignore[no-any-return]
            p[rows], q[rows], tree[rows], ids[rows], code, accept[rows], sample[rows],
            out[0][rows], out[1][rows],
        )

    seen = split_rows(batch, run) if batch else []
    facts = _TreeFacts(
        smallest_target=min((s[0] for s in seen), default=math.inf),
        worst_target_sum_error=worst_of(s[1] for s in seen),
        smallest_draft=min((s[2] for s in seen), default=math.inf),
        worst_draft_sum_error=worst_of(s[3] for s in seen),
        smallest_drafted=min((s[4] for s in seen), default=math.inf),
        repeated_siblings=any(s[5] for s in seen),
        top_k_beaten=any(s[6] for s in seen),
    )
    return TreeOutput(tokens, accepted), facts


def _verify_tree_validated(
    target: torch.Tensor,
    draft: torch.Tensor,
    parents: torch.Tensor,
    ids: torch.Tensor,
    scheme: str,
    accept_u: torch.Tensor,
    sample_u: torch.Tensor,
) -> TreeOutput:
    """The verification loop on validated inputs (one pass per depth and sibling slot).

    Only the rows still trying a child are touched: a row's residual (and its draft law) is
    materialised as a compact ``[R, V]`` row the first time one of its children is rejected;
    before that the acceptance ratio reads single entries of ``target``/``draft``. Every
    operation is row-wise, so the tokens equal those of the rule applied to the whole batch at
    once. A batch whose rows share one tree (the usual case) builds its child table once.
    """
    batch, nodes = parents.shape
    width_nodes = nodes + 1
    device = target.device
    shared = batch > 0 and bool((parents == parents[:1]).all())
    if shared:
        depth = _batch_depth(parents[:1])
        table = child_table(parents[:1])[0]
    else:
        depth = _batch_depth(parents)
        table = child_table(parents)
    width = table.shape[-1]
    flat_table = table.reshape(-1)
    # Node 0 has no token: a zero in front makes node n's token column n.
    node_tokens = torch.cat(
        [torch.zeros((batch, 1), dtype=torch.int64, device=device), ids], 1
    ).view(-1)
    node_u = torch.cat(
        [torch.ones((batch, 1), dtype=accept_u.dtype, device=device), accept_u], 1
    ).view(-1)
    target_rows, draft_rows = _Rows(target), _Rows(draft)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64, device=device)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)
    current = torch.zeros(batch, dtype=torch.int64, device=device)
    for level in range(depth + 1):
        stop_rows: list[torch.Tensor] = []
        stop_laws: list[torch.Tensor] = []
        empty = rows[:0]
        moved_rows: list[torch.Tensor] = [empty]
        moved_nodes: list[torch.Tensor] = [empty]
        live_rows, live_nodes = rows, current
        live_at = live_rows * width_nodes + live_nodes
        residual: torch.Tensor | None = None
        draft_law: torch.Tensor | None = None
        for slot in range(width):
            table_at = live_nodes if shared else live_at
            child = flat_table.index_select(0, table_at * width + slot)
            has_child = child >= 0
            if not bool(has_child.all()):
                done = torch.nonzero(~has_child).squeeze(1)
                stop_rows.append(live_rows[done])
                stop_laws.append(target_rows.rows(live_at[done]) if residual is None
                                 else residual[done])
                keep = torch.nonzero(has_child).squeeze(1)
                live_rows, live_nodes, live_at = live_rows[keep], live_nodes[keep], live_at[keep]
                child = child[keep]
                if residual is not None:
                    residual = residual[keep]
                if draft_law is not None:
                    draft_law = draft_law[keep]
            if live_rows.numel() == 0:
                break
            child_at = live_rows * width_nodes + child
            token = node_tokens.index_select(0, child_at)
            if residual is None:
                r_x = target_rows.entries(live_at, token)
            else:
                r_x = residual.gather(1, token.unsqueeze(1)).squeeze(1)
            if scheme == "top-k":
                ratio = r_x
            else:
                if draft_law is None:
                    q_x = draft_rows.entries(live_at, token)
                else:
                    q_x = draft_law.gather(1, token.unsqueeze(1)).squeeze(1)
                ratio = r_x / torch.where(q_x > 0, q_x, 1.0)
            accept = node_u.index_select(0, child_at) < ratio
            taken = torch.nonzero(accept).squeeze(1)
            moved_rows.append(live_rows[taken])
            moved_nodes.append(child[taken])
            rejected = torch.nonzero(~accept).squeeze(1)
            live_rows, live_nodes, live_at = (
                live_rows[rejected], live_nodes[rejected], live_at[rejected]
            )
            if rejected.numel() == 0:
                break
            token = token[rejected].unsqueeze(1)
            if residual is None:
                law = target_rows.rows(live_at)
                if scheme != "top-k":
                    draft_law = draft_rows.rows(live_at)
            else:
                law = residual[rejected]
                if draft_law is not None:
                    draft_law = draft_law[rejected]
            if scheme == "top-k":
                residual = _renormalise(law.scatter_(1, token, 0.0))
                continue
            assert draft_law is not None
            residual = _residual_rows(law, draft_law)
            if scheme == "without-replacement":
                draft_law = _renormalise(draft_law.scatter_(1, token, 0.0))
        if live_rows.numel():
            # Every child of these rows was rejected (or the node is a leaf).
            stop_rows.append(live_rows)
            stop_laws.append(target_rows.rows(live_at) if residual is None else residual)
        rows, current = torch.cat(moved_rows), torch.cat(moved_nodes)
        if level < depth and rows.numel():
            tokens[rows, level] = node_tokens.index_select(0, rows * width_nodes + current)
            accepted[rows, level] = current
        if stop_rows:
            stopped = torch.cat(stop_rows)
            if stopped.numel():
                tokens[stopped, level] = sample_inverse_cdf(torch.cat(stop_laws),
                                                            sample_u[stopped])
        if rows.numel() == 0:
            break
    return TreeOutput(tokens, accepted)


def verify_tree_greedy(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """One greedy tree verification step per row (the greedy tree protocol).

    From the root, move to the lowest-index child whose token equals the argmax (lowest index
    on ties) of ``target_logits`` at the current node; stop when no child matches and emit that
    argmax as the final token. The tokens equal greedy decoding along the tree (SpecInfer's
    greedy tree verification, Miao et al. 2024, section 4.2; SGLang's ``verify_tree_greedy``).

    Args:
        target_logits: ``[B, N+1, V]`` float, ``-inf`` allowed.
        parents: ``[B, N]`` int64, ``parents[b, j] < j + 1``.
        token_ids: ``[B, N]`` int64.

    Returns:
        :class:`TreeOutput` (tokens ``[B, D+1]``, accepted nodes ``[B, D]``, int64).

    Raises:
        InvalidInputError: see :func:`losslessness.protocol.validate_greedy_tree_inputs`.
    """
    batch, _, _ = validate_greedy_tree_inputs(target_logits, parents, token_ids)
    device = target_logits.device
    parents = parents.long().to(device)
    ids = token_ids.long().to(device)
    depth = _batch_depth(parents)
    table = child_table(parents)
    best = argmax_lowest_index(target_logits)
    rows = torch.arange(batch, device=device)
    node_tokens = torch.cat([torch.full((batch, 1), -2, dtype=torch.int64, device=device), ids], 1)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64, device=device)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64, device=device)
    current = torch.zeros(batch, dtype=torch.int64, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    for level in range(depth + 1):
        wanted = best[rows, current]
        children = table[rows, current]
        matches = (children >= 0) & (node_tokens.gather(1, children.clamp(min=0)) ==
                                     wanted.unsqueeze(1))
        first = torch.where(matches, children, torch.iinfo(torch.int64).max).min(dim=1).values
        moved = active & matches.any(dim=1)
        tokens[active, level] = wanted[active]
        if level < depth:
            accepted[:, level] = torch.where(moved, first, accepted[:, level])
        active = moved
        current = torch.where(moved, first, current)
        if not bool(active.any()):
            break
    return TreeOutput(tokens, accepted)
