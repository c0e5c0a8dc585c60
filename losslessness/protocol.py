"""The verifier protocols every implementation plugs into, and validation of their inputs.

Conventions (docs/architecture.md, 'Protocols', mirroring vLLM's and FlashInfer's):

- token ids are ``int64``; probabilities are floating point, each row summing to 1 within
  :data:`ROW_SUM_TOLERANCE`;
- ``B`` is the batch, ``k`` the draft length, ``V`` the vocabulary;
- a verifier's output is ``[B, k+1]`` int64 with emitted tokens left-aligned and
  :data:`PLACEHOLDER` (-1) after the last one.

Chain sampling verifier::

    verify(target_probs [B, k+1, V], draft_probs [B, k, V],
           draft_token_ids [B, k], generator: torch.Generator) -> [B, k+1] int64

Greedy verifier::

    verify_greedy(target_logits [B, k+1, V], draft_token_ids [B, k]) -> [B, k+1] int64

Tree verifier (node 0 is the root context, nodes 1..N the drafted tokens; ``parents[b, j]`` is
the parent of node ``j+1`` and is smaller than ``j+1``; ``D`` the depth of the deepest node)::

    verify_tree(target_probs [B, N+1, V], draft_probs [B, N+1, V], parents [B, N],
                token_ids [B, N], draft_scheme: str, generator) -> TreeOutput
    verify_tree_greedy(target_logits [B, N+1, V], parents [B, N], token_ids [B, N]) -> TreeOutput

    TreeOutput.tokens [B, D+1] int64          accepted path's tokens, then one final token
    TreeOutput.accepted_nodes [B, D] int64    the accepted nodes (1..N) in path order

Serving chain verifier (a chain verifier as a serving engine calls it: raw logits and one
:class:`~losslessness.requests.Request` per row)::

    verify(target_logits [B, k+1, V], draft_probs [B, k, V] | None, draft_token_ids [B, k],
           num_draft_tokens [B], requests: Sequence[Request], generator) -> [B, k+1] int64

Serving tree verifier (a tree verifier as a serving engine calls it: raw logits at every node
and one request per tree)::

    verify_tree(target_logits [B, N+1, V], draft_probs [B, N+1, V], parents [B, N],
                token_ids [B, N], draft_scheme: str, requests: Sequence[Request],
                generator) -> TreeOutput

Bad input raises :class:`InvalidInputError` (a ``ValueError``) whose message starts with the
argument's name and says what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from losslessness.requests import Request

PLACEHOLDER = -1
"""Fills the output after the last emitted token."""

ROW_SUM_TOLERANCE = 1e-5
"""Largest accepted ``|sum(row) - 1|`` for a probability row; float32 softmax over 150k tokens
stays well inside it, while a row that was never normalised (or lost mass to a bug) does not."""


def row_sum_tolerance(dtype: torch.dtype) -> float:
    """Largest accepted ``|sum(row) - 1|`` (summed in float64) for a probability row of
    ``dtype``: :data:`ROW_SUM_TOLERANCE`, plus the unit roundoff ``u`` for 16-bit dtypes,
    whose cast of a normalised row moves its sum by up to ``u`` (bfloat16: 3.9e-3, measured up
    to 2e-3; ``strategies.row_sum_tolerance`` derives and measures the bound).

    Args:
        dtype: a floating-point dtype.
    """
    if dtype in (torch.float16, torch.bfloat16):
        return ROW_SUM_TOLERANCE + float(torch.finfo(dtype).eps) / 2.0
    return ROW_SUM_TOLERANCE


class InvalidInputError(ValueError):
    """An argument of a verifier call is malformed; ``argument`` names it."""

    def __init__(self, argument: str, problem: str) -> None:
        super().__init__(f"{argument}: {problem}")
        self.argument = argument
        self.problem = problem


@runtime_checkable
class ChainVerifier(Protocol):
    """One chain rejection-sampling verification step (Leviathan et al. 2022, Alg. 1).

    Args:
        target_probs: ``[B, k+1, V]`` float; row ``i`` is the target's distribution p_i at
            draft position i, row ``k`` the bonus position.
        draft_probs: ``[B, k, V]`` float; the draft distributions q_i the drafts came from.
        draft_token_ids: ``[B, k]`` int64; ``d_i ~ q_i``, drawn by the caller.
        generator: the only source of randomness.

    Returns:
        ``[B, k+1]`` int64: emitted tokens left-aligned, :data:`PLACEHOLDER` after the last.

    Optional coupling keyword: an implementation may also accept a keyword-only
    ``uniforms`` (:class:`losslessness.reference.ChainUniforms`: ``accept_uniforms`` ``[B, k]``
    and ``sample_uniforms`` ``[B]``, floats in ``[0, 1)``). When it is given, all randomness
    comes from it and ``generator`` is not used: draft i of row b is accepted iff
    ``accept_uniforms[b, i] < p_i(d_i) / q_i(d_i)``, and the one token drawn per row (the
    residual correction or the bonus) is the first token whose cumulative mass exceeds
    ``sample_uniforms[b]`` times the total. Feeding the same uniforms to a GPU implementation
    and to the CPU reference then makes their decisions comparable one by one (docs/architecture.md,
    'What lossless means', item 7). Callers detect support with ``inspect.signature``;
    implementations that draw their randomness differently simply do not take the keyword.
    """

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor: ...


@runtime_checkable
class GreedyVerifier(Protocol):
    """One greedy verification step: accept while ``d_i == argmax target_logits[i]``.

    Args:
        target_logits: ``[B, k+1, V]`` float; ``-inf`` allowed (masked tokens).
        draft_token_ids: ``[B, k]`` int64.

    Returns:
        ``[B, k+1]`` int64: emitted tokens left-aligned, :data:`PLACEHOLDER` after the last.
    """

    def __call__(
        self, target_logits: torch.Tensor, draft_token_ids: torch.Tensor
    ) -> torch.Tensor: ...


PROTOCOLS = ("chain", "greedy", "tree", "greedy-tree", "serving", "serving-tree")
"""The verifier protocols of this module a target may follow: :class:`ChainVerifier`,
:class:`GreedyVerifier`, :class:`TreeVerifier`, :class:`GreedyTreeVerifier`,
:class:`ServingVerifier`, :class:`ServingTreeVerifier` (a bare
``pkg.module:function`` target names its protocol, :func:`losslessness.targets.resolve_adapter`)."""


@runtime_checkable
class ServingVerifier(Protocol):
    """One chain verification step as a serving engine calls it: raw target logits, the
    drafts, and every row's request (issue 21; docs/architecture.md, 'Serving protocol').

    Args:
        target_logits: ``[B, k+1, V]`` float32, bfloat16 or float64 raw logits; row ``i`` is
            the target at draft position i, row ``num_draft_tokens[b]`` the bonus position
            of row b (rows after it are ignored).
        draft_probs: ``[B, k, V]`` float draft distributions the drafts came from, or None:
            the drafter passes none (n-gram, greedy EAGLE) and the draft counts as one-hot.
        draft_token_ids: ``[B, k]`` int64; entries at and after ``num_draft_tokens[b]`` are
            :data:`PLACEHOLDER`.
        num_draft_tokens: ``[B]`` int64 in ``0..k``: each row's own number of drafts.
        requests: B :class:`~losslessness.requests.Request` objects, the rows' sampling
            parameters and output histories.
        generator: randomness of the unseeded rows. A seeded row (``request.seed`` not None)
            draws only from randomness derived from its seed and its history length
            ``len(request.output_token_ids)`` (the seed contract).

    Returns:
        ``[B, k+1]`` int64: per row the accepted drafts, then one token (the correction at the
        first rejection, or the bonus at position ``num_draft_tokens[b]``), left-aligned,
        :data:`PLACEHOLDER` after. Lossless when the token emitted at every position follows
        the engine profile's law (:mod:`losslessness.reference.profiles`) for the row's request
        with the accepted drafts appended to its history; greedy rows exactly.
    """

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> torch.Tensor: ...


@runtime_checkable
class ServingTreeVerifier(Protocol):
    """One tree verification step as a serving engine calls it: raw target logits at every
    node, the drafted tree, and every tree's request (issue 21; docs/architecture.md, 'Serving
    tree protocol').

    Args:
        target_logits: ``[B, N+1, V]`` float32, bfloat16 or float64 raw logits; row ``n`` is
            the target at the context ending in node n (row 0: the root context).
        draft_probs: ``[B, N+1, V]`` float, as for :class:`TreeVerifier` (row ``n``: the law
            node n's children were drawn from).
        parents: ``[B, N]`` int64, as for :class:`TreeVerifier`.
        token_ids: ``[B, N]`` int64, as for :class:`TreeVerifier`.
        draft_scheme: one of :data:`DRAFT_SCHEMES`.
        requests: B :class:`~losslessness.requests.Request` objects, each tree's sampling
            parameters and output history (the history before the root; a node's history adds
            the tokens on its path).
        generator: the only source of randomness.

    Returns:
        :class:`TreeOutput`. Lossless when, given the accepted path so far, the next emitted
        token follows the engine profile's law (:mod:`losslessness.reference.profiles`) at the
        path's last node, for the tree's request with the path appended to its history;
        greedy requests exactly.
    """

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> TreeOutput: ...


SERVING_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float64)
"""The dtypes a serving verifier's ``target_logits`` may have."""


DRAFT_SCHEMES = ("iid", "without-replacement", "top-k")
"""How the children of one tree node were drawn from the draft distribution q at that node.

``iid``: independently from q, with replacement (duplicate sibling tokens happen; SpecInfer,
Miao et al. 2024; multi-draft SpecTr, Sun et al. 2023). ``without-replacement``: one after
the other from q with the earlier siblings' tokens removed and q renormalised (Jeon et al. 2024,
"Recursive Speculative Decoding"). ``top-k``: deterministically, the node's children are the
tokens of largest q, in any order (EAGLE-2's and Medusa's trees); q then only ranks tokens.
"""


def sample_siblings(
    draft_probs: torch.Tensor, count: int, draft_scheme: str, generator: torch.Generator
) -> torch.Tensor:
    """Draw the tokens of ``count`` siblings from their parent's draft law, per scheme.

    Args:
        draft_probs: ``[B, V]`` float, q at the parent (rows sum to 1).
        count: number of siblings, ``1 <= count`` (``<= `` the support of q for
            ``without-replacement``, ``<= V`` for ``top-k``).
        draft_scheme: ``"iid"`` (``torch.multinomial`` with replacement),
            ``"without-replacement"`` (without replacement: each next sibling from q with the
            earlier ones removed) or ``"top-k"`` (the ``count`` tokens of largest q, ties
            towards the lower id, in decreasing q).
        generator: randomness for the two sampled schemes.

    The tree protocol's own definition of each scheme (the audit draws drafts with it; the
    reference verifier's update after a rejected sibling assumes it).

    Returns:
        ``[B, count]`` int64 tokens.

    Raises:
        InvalidInputError: ``count`` < 1, an unknown scheme, or too few tokens with q > 0.
    """
    if count < 1:
        raise InvalidInputError("count", f"must be >= 1, got {count}")
    q = draft_probs.to(torch.float64)
    if draft_scheme == "top-k":
        if count > q.shape[-1]:
            raise InvalidInputError(
                "count", f"{count} siblings exceed the vocabulary {q.shape[-1]}"
            )
        # A stable descending sort puts the lower id first among equal q.
        return torch.sort(q, dim=-1, descending=True, stable=True).indices[:, :count]
    if draft_scheme == "iid":
        return torch.multinomial(q, count, replacement=True, generator=generator)
    if draft_scheme == "without-replacement":
        support = int((q > 0).sum(dim=-1).min()) if q.numel() else 0
        if count > support:
            raise InvalidInputError(
                "count", f"{count} siblings without replacement exceed q's support ({support})"
            )
        return torch.multinomial(q, count, replacement=False, generator=generator)
    raise InvalidInputError("draft_scheme", f"{draft_scheme!r} is not a known draft scheme")


class TreeOutput(NamedTuple):
    """What a tree verifier returns for a batch (one verification step per tree).

    Attributes:
        tokens: ``[B, D+1]`` int64; the accepted nodes' tokens in path order, then one final
            token (the correction after the last node's children were all rejected, or the
            bonus token at a leaf), left-aligned, :data:`PLACEHOLDER` after the last.
        accepted_nodes: ``[B, D]`` int64; the accepted nodes' indices (``1..N``) in path
            order, :data:`PLACEHOLDER` after the last. ``tokens[b, i] ==
            token_ids[b, accepted_nodes[b, i] - 1]`` for every accepted position i.

    ``D`` is the depth of the deepest node of the batch's trees (a chain of k drafts: D = k).
    """

    tokens: torch.Tensor
    accepted_nodes: torch.Tensor


@runtime_checkable
class TreeVerifier(Protocol):
    """One tree (or multi-draft) speculative-sampling verification step.

    Args:
        target_probs: ``[B, N+1, V]`` float; row ``n`` is the target's next-token law p_n at the
            context ending in node n (row 0: the root context).
        draft_probs: ``[B, N+1, V]`` float; row ``n`` is the draft law q_n the children of node
            n were drawn from. Rows of leaves are ignored (zeros allowed).
        parents: ``[B, N]`` int64; ``parents[b, j]`` is the parent of node ``j+1``, in
            ``[0, j]`` (parents precede children, so there is no cycle).
        token_ids: ``[B, N]`` int64; ``token_ids[b, j]`` is node ``j+1``'s drafted token.
        draft_scheme: one of :data:`DRAFT_SCHEMES`, the same for every tree of the batch.
        generator: the only source of randomness.

    Returns:
        :class:`TreeOutput`. A lossless verifier makes the emitted tokens follow the target:
        given the accepted path so far, the next emitted token follows p at its last node.

    Layouts of real engines convert to this one: SGLang's first-child / next-sibling arrays
    (``retrive_next_token``, ``retrive_next_sibling``) and Medusa's and EAGLE's
    ``tree_choices`` paths (:mod:`losslessness.reference.tree_layouts`). A chain of k drafts is
    the tree ``parents = [0, 1, ..., k-1]`` under the ``iid`` scheme.
    """

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        generator: torch.Generator,
    ) -> TreeOutput: ...


@runtime_checkable
class GreedyTreeVerifier(Protocol):
    """One greedy tree verification step: from the root, move to the child whose token is the
    argmax of the target's logits at the current node (the lowest-index such child when
    siblings repeat a token), until none matches; the final token is that argmax.

    Args:
        target_logits: ``[B, N+1, V]`` float; ``-inf`` allowed (masked tokens).
        parents: ``[B, N]`` int64, as for :class:`TreeVerifier`.
        token_ids: ``[B, N]`` int64.

    Returns:
        :class:`TreeOutput`; the tokens equal greedy decoding along the tree.
    """

    def __call__(
        self, target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
    ) -> TreeOutput: ...


@runtime_checkable
class EndToEndGenerator(Protocol):
    """A whole speculative-decoding engine seen from outside (docs/architecture.md, 'Protocols').

    Attributes:
        vocab_size: V, the number of token ids the target can emit.

    ``generate(prompt_ids, max_new_tokens, seed)`` returns the new tokens (``list[int]``, at most
    ``max_new_tokens``, ids in ``[0, V)``); everything random in it derives from ``seed``.
    ``next_token_probs(prefix_ids)`` returns the target's *processed* next-token law (the
    user's temperature, top-k, top-p, min-p applied) given the whole prefix (prompt and
    generated tokens): ``[V]`` float64 summing to 1. The sequence-law check enumerates the
    exact law of the first L new tokens from it.
    """

    vocab_size: int

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]: ...

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor: ...


@runtime_checkable
class GeneratesBatches(Protocol):
    """An :class:`EndToEndGenerator` that serves many requests at once, as a serving engine
    batches them (vLLM's ``LLM.generate`` on a list of prompts).

    Attributes:
        batch_size: the most seeds one call takes (>= 1).

    ``generate_batch(prompt_ids, max_new_tokens, seeds)`` returns one value per seed, in the
    seeds' order, each what ``generate(prompt_ids, max_new_tokens, seed)`` returns: the same
    law, and for an engine that promises reproducible seeds the same tokens, whatever else is
    in the batch (the seed contract replays a few seeds in a batch of another size).
    """

    batch_size: int

    def generate_batch(
        self, prompt_ids: list[int], max_new_tokens: int, seeds: list[int]
    ) -> list[list[int]]: ...


@runtime_checkable
class ReportsAcceptedLengths(Protocol):
    """An :class:`EndToEndGenerator` that counts its verify steps by accepted draft length.

    ``accepted_length_counts()`` maps the number of draft tokens accepted in one verify step
    (0..k) to how many verify steps had it, summed since the generator was built.
    """

    def accepted_length_counts(self) -> dict[int, int]: ...


@runtime_checkable
class ReportsDraftCounts(Protocol):
    """An :class:`EndToEndGenerator` that counts draft tokens in total, the way serving engines
    report them (llama.cpp's ``timings.draft_n`` and ``draft_n_accepted``, OpenVINO GenAI's and
    vLLM's acceptance counters), not per verify step.

    ``draft_counts()`` returns ``{"drafted": d, "accepted": a}``, summed since the generator was
    built: the draft tokens the engine proposed and those its target accepted (``a <= d``).
    """

    def draft_counts(self) -> dict[str, int]: ...


@runtime_checkable
class ReportsLawAgreement(Protocol):
    """An :class:`EndToEndGenerator` whose ``next_token_probs`` is an engine's own law, compared
    with a reference implementation on the same weights (transformers).

    ``law_agreement()`` returns ``{"prefixes": n, "max_abs_difference": d, "tolerance": t}``:
    over the ``n`` prefixes whose law was asked so far, the largest absolute difference of one
    token's probability, and the tolerance beyond which the difference is reported.
    """

    def law_agreement(self) -> dict[str, float]: ...


def _require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidInputError(name, f"expected a torch.Tensor, got {type(value).__name__}")
    return value


def _require_rank(name: str, tensor: torch.Tensor, rank: int, layout: str) -> None:
    if tensor.dim() != rank:
        raise InvalidInputError(
            name, f"expected rank {rank} {layout}, got shape {tuple(tensor.shape)}"
        )


def _require_float(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_floating_point():
        raise InvalidInputError(name, f"expected a floating-point dtype, got {tensor.dtype}")


def _require_logit_values(logits: torch.Tensor, used: torch.Tensor | None = None) -> None:
    """``target_logits [..., V]`` holds no NaN or ``+inf``, and every row (every row ``used``
    marks, a bool tensor of the leading shape) has a finite logit, so some token is possible.

    Raises:
        InvalidInputError: naming ``target_logits``.
    """
    if bool(torch.isnan(logits).any()):
        raise InvalidInputError("target_logits", "contains NaN")
    if bool((logits == float("inf")).any()):
        raise InvalidInputError("target_logits", "contains +inf")
    impossible = (logits == float("-inf")).all(dim=-1)
    if used is not None:
        impossible = impossible & used
    if logits.numel() and bool(impossible.any()):
        which = "a used row" if used is not None else "a row"
        raise InvalidInputError("target_logits",
                                f"{which} has every logit -inf (no token possible)")


def _require_ids(name: str, tensor: torch.Tensor, vocab_size: int) -> None:
    if tensor.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise InvalidInputError(name, f"expected an integer dtype (int64), got {tensor.dtype}")
    if tensor.numel() == 0:
        return
    low, high = int(tensor.min()), int(tensor.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InvalidInputError(
            name, f"token id {bad} out of range [0, {vocab_size}) for vocabulary size {vocab_size}"
        )


def _distinct_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with every broadcast (stride 0) leading dimension cut to its first index.

    The rows so dropped are the same memory as the one kept, so every per-row check on the
    result holds for the whole tensor, and ``p.expand(B, k+1, V)`` is checked in ``O(k V)``.
    The index of a reported error is then its first occurrence.
    """
    index = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in tensor.stride()[:-1])
    return tensor[index]


def validate_probability_rows(name: str, probs: torch.Tensor) -> float:
    """Check that every row along the last axis is a probability vector.

    Args:
        name: the argument name used in error messages.
        probs: ``[..., V]`` floating-point tensor.

    Returns:
        The smallest entry (>= 0; ``inf`` for an empty tensor), computed on the way: a caller
        can skip per-entry zero checks when it is positive.

    Raises:
        InvalidInputError: NaN or infinite entries, negative mass, or a row whose sum differs
            from 1 by more than :data:`ROW_SUM_TOLERANCE`.
    """
    if probs.numel() == 0:
        return float("inf")
    probs = _distinct_rows(probs)
    # One pass for the sums and one for the minimum: NaN and inf propagate into the sums, so
    # the elementwise scans below run only to locate an error that is already known.
    sums = probs.sum(dim=-1, dtype=torch.float64)
    if not bool(torch.isfinite(sums).all()):
        where = torch.nonzero(~torch.isfinite(probs))[0].tolist()
        raise InvalidInputError(name, f"contains NaN or inf (first at index {where})")
    smallest = float(probs.min())
    if smallest < 0:
        where = torch.nonzero(probs < 0)[0].tolist()
        raise InvalidInputError(
            name, f"contains negative mass {float(probs[tuple(where)]):.3g} at index {where}"
        )
    error = (sums - 1.0).abs()
    tolerance = row_sum_tolerance(probs.dtype)
    if bool((error > tolerance).any()):
        where = torch.nonzero(error > tolerance)[0].tolist()
        raise InvalidInputError(
            name,
            f"row {where} sums to {float(sums[tuple(where)]):.9g}, not 1 "
            f"(tolerance {tolerance:g} for {probs.dtype})",
        )
    return smallest


_NOT_GIVEN = object()


def validate_chain_inputs(
    target_probs: object,
    draft_probs: object,
    draft_token_ids: object,
    generator: object = _NOT_GIVEN,
) -> tuple[int, int, int]:
    """Validate the arguments of a chain verifier call (docs/architecture.md, 'Protocols').

    Args:
        target_probs: ``[B, k+1, V]`` float tensor.
        draft_probs: ``[B, k, V]`` float tensor.
        draft_token_ids: ``[B, k]`` integer tensor with ids in ``[0, V)`` and
            ``draft_probs[b, i, draft_token_ids[b, i]] > 0`` (a draft cannot have been drawn
            from q where q is 0).
        generator: must be a ``torch.Generator`` when given (None is an error); leave it out
            for calls that take no generator.

    Returns:
        ``(B, k, V)``.

    Raises:
        InvalidInputError: naming the argument, for a wrong type, rank or shape, a k+1 vs k
            mismatch, a vocabulary or batch mismatch, NaN/inf, negative mass, rows not summing
            to 1, or draft ids out of range or with zero draft probability.
    """
    target = _require_tensor("target_probs", target_probs)
    draft = _require_tensor("draft_probs", draft_probs)
    ids = _require_tensor("draft_token_ids", draft_token_ids)
    _require_rank("target_probs", target, 3, "[B, k+1, V]")
    _require_rank("draft_probs", draft, 3, "[B, k, V]")
    _require_rank("draft_token_ids", ids, 2, "[B, k]")
    _require_float("target_probs", target)
    _require_float("draft_probs", draft)
    batch, positions, vocab = target.shape
    if positions < 1:
        raise InvalidInputError("target_probs", "needs k+1 >= 1 positions, got 0")
    if vocab < 1:
        raise InvalidInputError("target_probs", "vocabulary size V must be >= 1, got 0")
    k = positions - 1
    if draft.shape[0] != batch or ids.shape[0] != batch:
        raise InvalidInputError(
            "draft_probs" if draft.shape[0] != batch else "draft_token_ids",
            f"batch size {draft.shape[0] if draft.shape[0] != batch else ids.shape[0]} "
            f"does not match target_probs batch size {batch}",
        )
    if draft.shape[1] != k:
        raise InvalidInputError(
            "draft_probs",
            f"has {draft.shape[1]} positions but target_probs has {positions} = k+1, "
            f"so k = {k} draft positions are expected",
        )
    if draft.shape[2] != vocab:
        raise InvalidInputError(
            "draft_probs",
            f"vocabulary size {draft.shape[2]} does not match target_probs vocabulary size {vocab}",
        )
    if ids.shape[1] != k:
        raise InvalidInputError(
            "draft_token_ids", f"has {ids.shape[1]} positions, expected k = {k}"
        )
    validate_probability_rows("target_probs", target)
    smallest_draft_mass = validate_probability_rows("draft_probs", draft)
    _require_ids("draft_token_ids", ids, vocab)
    # Where q has no zero entry, no draft can sit on one: the gather below is skipped.
    if k > 0 and batch > 0 and smallest_draft_mass <= 0:
        drafted_mass = draft.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
        if bool((drafted_mass <= 0).any()):
            where = torch.nonzero(drafted_mass <= 0)[0].tolist()
            raise InvalidInputError(
                "draft_token_ids",
                f"token {int(ids[tuple(where)])} at {where} has draft probability 0, "
                "so it cannot have been sampled from draft_probs",
            )
    if generator is not _NOT_GIVEN and not isinstance(generator, torch.Generator):
        raise InvalidInputError(
            "generator", f"expected a torch.Generator, got {type(generator).__name__}"
        )
    return batch, k, vocab


def validate_greedy_inputs(target_logits: object, draft_token_ids: object) -> tuple[int, int, int]:
    """Validate the arguments of a greedy verifier call.

    Args:
        target_logits: ``[B, k+1, V]`` float tensor; ``-inf`` marks masked tokens.
        draft_token_ids: ``[B, k]`` integer tensor with ids in ``[0, V)``.

    Returns:
        ``(B, k, V)``.

    Raises:
        InvalidInputError: naming the argument, for a wrong type, rank or shape, a batch or
            k mismatch, NaN or ``+inf`` logits, a row with every logit ``-inf``, or draft ids
            out of range.
    """
    logits = _require_tensor("target_logits", target_logits)
    ids = _require_tensor("draft_token_ids", draft_token_ids)
    _require_rank("target_logits", logits, 3, "[B, k+1, V]")
    _require_rank("draft_token_ids", ids, 2, "[B, k]")
    _require_float("target_logits", logits)
    batch, positions, vocab = logits.shape
    if positions < 1 or vocab < 1:
        raise InvalidInputError(
            "target_logits", f"needs k+1 >= 1 positions and V >= 1, got {tuple(logits.shape)}"
        )
    if ids.shape[0] != batch:
        raise InvalidInputError(
            "draft_token_ids", f"batch size {ids.shape[0]} does not match target_logits ({batch})"
        )
    if ids.shape[1] != positions - 1:
        raise InvalidInputError(
            "draft_token_ids",
            f"has {ids.shape[1]} positions but target_logits has {positions} = k+1",
        )
    _require_logit_values(logits)
    _require_ids("draft_token_ids", ids, vocab)
    return batch, positions - 1, vocab


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node of a batch of trees (root 0, its children 1, ...).

    Args:
        parents: ``[B, N]`` int64 with ``parents[b, j]`` in ``[0, j]`` (already validated).

    Returns:
        ``[B, N+1]`` int64; column 0 is the root (depth 0).
    """
    batch, nodes = parents.shape
    depths = torch.zeros((batch, nodes + 1), dtype=torch.int64, device=parents.device)
    for j in range(nodes):
        depths[:, j + 1] = depths.gather(1, parents[:, j : j + 1].long()).squeeze(1) + 1
    return depths


def _validate_tree_shape(
    parents: object, token_ids: object, batch: int, nodes_plus_root: int, vocab: int, rows: str
) -> tuple[torch.Tensor, torch.Tensor]:
    tree = _require_tensor("parents", parents)
    ids = _require_tensor("token_ids", token_ids)
    _require_rank("parents", tree, 2, "[B, N]")
    _require_rank("token_ids", ids, 2, "[B, N]")
    if tree.shape[1] == 0:
        raise InvalidInputError("parents", "N = 0: a tree needs at least one drafted node")
    if tree.shape[0] != batch:
        raise InvalidInputError(
            "parents", f"batch size {tree.shape[0]} does not match {rows} batch size {batch}"
        )
    if tree.shape[1] + 1 != nodes_plus_root:
        raise InvalidInputError(
            "parents",
            f"has N = {tree.shape[1]} nodes but {rows} has {nodes_plus_root} rows; expected "
            "N+1 (row 0 is the root context)",
        )
    if tuple(ids.shape) != tuple(tree.shape):
        raise InvalidInputError(
            "token_ids", f"shape {tuple(ids.shape)} does not match parents {tuple(tree.shape)}"
        )
    if tree.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise InvalidInputError("parents", f"expected an integer dtype (int64), got {tree.dtype}")
    if tree.numel():
        index = torch.arange(1, tree.shape[1] + 1, device=tree.device)
        bad = (tree < 0) | (tree >= index)
        if bool(bad.any()):
            b, j = torch.nonzero(bad)[0].tolist()
            value = int(tree[b, j])
            why = (
                "is negative (out of range)"
                if value < 0
                else "is not smaller than the node's own index (parents must precede children, "
                "which also rules out cycles)"
                if value <= tree.shape[1]
                else f"is out of range [0, {tree.shape[1]}]"
            )
            raise InvalidInputError(
                "parents", f"row {b}: the parent {value} of node {j + 1} {why}"
            )
    _require_ids("token_ids", ids, vocab)
    return tree.long(), ids.long()


def _children_mask(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N+1]`` bool: whether node n has at least one child."""
    batch, nodes = parents.shape
    has = torch.zeros((batch, nodes + 1), dtype=torch.bool, device=parents.device)
    has.scatter_(1, parents, True)
    return has


def validate_tree_inputs(
    target_probs: object,
    draft_probs: object,
    parents: object,
    token_ids: object,
    draft_scheme: object,
    generator: object = _NOT_GIVEN,
    *,
    check_values: bool = True,
) -> tuple[int, int, int]:
    """Validate the arguments of a tree verifier call (:class:`TreeVerifier`).

    Args:
        target_probs: ``[B, N+1, V]`` float, every row a distribution.
        draft_probs: ``[B, N+1, V]`` float; the row of every node with children a distribution,
            leaves' rows finite and non-negative (ignored).
        parents: ``[B, N]`` integer, ``parents[b, j]`` in ``[0, j]``, N >= 1.
        token_ids: ``[B, N]`` integer ids in ``[0, V)``.
        draft_scheme: one of :data:`DRAFT_SCHEMES`; the drafts must be possible under it:
            every drafted token has q > 0 at its parent; ``without-replacement`` and ``top-k``
            siblings are distinct; ``top-k`` siblings are tokens of largest q at their parent.
        generator: must be a ``torch.Generator`` when given.
        check_values: False skips the ``O(B N V)`` checks of the probabilities' values and of
            the drafts against them (a caller that makes them itself on the way, as the CPU
            reference does, then calls this again with True when one fails); the structure,
            shapes, dtypes, ids' range, scheme and generator are always checked.

    Returns:
        ``(B, N, V)``.

    Raises:
        InvalidInputError: naming the argument: wrong type, rank or shape, N = 0, a parent not
            smaller than its node (a cycle) or out of range, mismatched batch, node count or
            vocabulary, rows that are not distributions, a node with children whose draft row
            is not a distribution, an unknown scheme, or drafts the declared scheme contradicts.
    """
    target = _require_tensor("target_probs", target_probs)
    draft = _require_tensor("draft_probs", draft_probs)
    _require_rank("target_probs", target, 3, "[B, N+1, V]")
    _require_rank("draft_probs", draft, 3, "[B, N+1, V]")
    _require_float("target_probs", target)
    _require_float("draft_probs", draft)
    batch, rows, vocab = target.shape
    if vocab < 1:
        raise InvalidInputError("target_probs", "vocabulary size V must be >= 1, got 0")
    if tuple(draft.shape) != tuple(target.shape):
        raise InvalidInputError(
            "draft_probs",
            f"shape {tuple(draft.shape)} does not match target_probs {tuple(target.shape)} "
            "(one draft row per node, leaves included)",
        )
    tree, ids = _validate_tree_shape(parents, token_ids, batch, rows, vocab, "target_probs")
    if draft_scheme not in DRAFT_SCHEMES:
        raise InvalidInputError(
            "draft_scheme", f"{draft_scheme!r} is not one of {', '.join(DRAFT_SCHEMES)}"
        )
    if not check_values:
        _require_generator(generator)
        return batch, tree.shape[1], vocab
    validate_probability_rows("target_probs", target)
    if batch == 0:
        return batch, tree.shape[1], vocab
    # NaN and inf propagate into the row sums, so one pass for the sums and one for the minimum
    # find every bad entry; the elementwise scans run only to locate an error already known.
    sums = draft.sum(dim=-1, dtype=torch.float64)
    if not bool(torch.isfinite(sums).all()):
        raise InvalidInputError("draft_probs", "contains NaN or inf")
    if float(draft.min()) < 0:
        where = torch.nonzero(draft < 0)[0].tolist()
        raise InvalidInputError("draft_probs", f"contains negative mass at index {where}")
    has_children = _children_mask(tree)
    bad = has_children & ((sums - 1.0).abs() > ROW_SUM_TOLERANCE)
    if bool(bad.any()):
        b, n = torch.nonzero(bad)[0].tolist()
        raise InvalidInputError(
            "draft_probs",
            f"row {b}: node {n} has children but its draft distribution sums to "
            f"{float(sums[b, n]):.9g}, not 1 (siblings need the law they were drawn from)",
        )
    # q at each node's parent, at the node's token: a flat gather of B*N entries.
    row_of_parent = tree + rows * torch.arange(batch, device=tree.device).unsqueeze(1)
    drafted = draft.reshape(batch * rows, vocab)[row_of_parent, ids]
    if bool((drafted <= 0).any()):
        b, j = torch.nonzero(drafted <= 0)[0].tolist()
        raise InvalidInputError(
            "token_ids",
            f"row {b}: node {j + 1}'s token {int(ids[b, j])} has draft probability 0 at its "
            f"parent {int(tree[b, j])}, so it cannot have been drafted",
        )
    if draft_scheme != "iid":
        _require_distinct_siblings(tree, ids, str(draft_scheme))
    if draft_scheme == "top-k":
        _require_top_k_siblings(tree, ids, draft, drafted)
    _require_generator(generator)
    return batch, tree.shape[1], vocab


def _require_generator(generator: object) -> None:
    if generator is not _NOT_GIVEN and not isinstance(generator, torch.Generator):
        raise InvalidInputError(
            "generator", f"expected a torch.Generator, got {type(generator).__name__}"
        )


def _require_distinct_siblings(parents: torch.Tensor, ids: torch.Tensor, scheme: str) -> None:
    same_parent = parents.unsqueeze(2) == parents.unsqueeze(1)
    same_token = ids.unsqueeze(2) == ids.unsqueeze(1)
    repeat = (same_parent & same_token).triu(diagonal=1)
    if bool(repeat.any()):
        b, i, j = torch.nonzero(repeat)[0].tolist()
        raise InvalidInputError(
            "token_ids",
            f"row {b}: nodes {i + 1} and {j + 1} are siblings with the same token "
            f"{int(ids[b, i])}, impossible under draft_scheme {scheme!r}",
        )


def _require_top_k_siblings(
    parents: torch.Tensor, ids: torch.Tensor, draft: torch.Tensor, drafted: torch.Tensor
) -> None:
    # Each child's token must have q at least that of every token its parent did not expand.
    batch = draft.shape[0]
    chosen = torch.zeros(draft.shape, dtype=torch.bool, device=ids.device)
    chosen[torch.arange(batch, device=ids.device).unsqueeze(1), parents, ids] = True
    unchosen_best = draft.masked_fill(chosen, 0.0).amax(dim=-1)
    beaten = unchosen_best.gather(1, parents) > drafted
    if bool(beaten.any()):
        b, j = torch.nonzero(beaten)[0].tolist()
        raise InvalidInputError(
            "token_ids",
            f"row {b}: node {j + 1}'s token {int(ids[b, j])} (q = {float(drafted[b, j]):.4g}) is "
            f"not among the top-k tokens of its parent {int(parents[b, j])}'s draft "
            "distribution, as draft_scheme 'top-k' declares",
        )


def validate_greedy_tree_inputs(
    target_logits: object, parents: object, token_ids: object
) -> tuple[int, int, int]:
    """Validate the arguments of a greedy tree verifier call (:class:`GreedyTreeVerifier`).

    Args:
        target_logits: ``[B, N+1, V]`` float; ``-inf`` marks masked tokens.
        parents: ``[B, N]`` integer, ``parents[b, j]`` in ``[0, j]``, N >= 1.
        token_ids: ``[B, N]`` integer ids in ``[0, V)``.

    Returns:
        ``(B, N, V)``.

    Raises:
        InvalidInputError: naming the argument, as :func:`validate_tree_inputs` for the tree,
            and NaN, ``+inf`` or an all ``-inf`` row in ``target_logits``.
    """
    logits = _require_tensor("target_logits", target_logits)
    _require_rank("target_logits", logits, 3, "[B, N+1, V]")
    _require_float("target_logits", logits)
    batch, rows, vocab = logits.shape
    if vocab < 1:
        raise InvalidInputError("target_logits", "vocabulary size V must be >= 1, got 0")
    tree, _ = _validate_tree_shape(parents, token_ids, batch, rows, vocab, "target_logits")
    _require_logit_values(logits)
    return batch, tree.shape[1], vocab


def validate_serving_inputs(
    target_logits: object,
    draft_probs: object,
    draft_token_ids: object,
    num_draft_tokens: object,
    requests: object,
    generator: object = _NOT_GIVEN,
) -> tuple[int, int, int]:
    """Validate the arguments of a serving verifier call (:class:`ServingVerifier`).

    Args:
        target_logits: ``[B, k+1, V]`` tensor of a dtype in :data:`SERVING_LOGIT_DTYPES`; no
            NaN or ``+inf``; a row used by a request (positions ``0..num_draft_tokens[b]``)
            has a finite logit.
        draft_probs: None, or ``[B, k, V]`` float rows summing to 1 for the positions a row
            drafts (the rest are ignored), with q > 0 at every draft.
        draft_token_ids: ``[B, k]`` integer; ids in ``[0, V)`` before ``num_draft_tokens[b]``,
            :data:`PLACEHOLDER` at and after it.
        num_draft_tokens: ``[B]`` integer in ``0..k``.
        requests: a sequence of B :class:`~losslessness.requests.Request` naming no token id
            outside ``[0, V)``.
        generator: must be a ``torch.Generator`` when given.

    Returns:
        ``(B, k, V)``.

    Raises:
        InvalidInputError: naming the argument, for a wrong type, rank, shape or dtype, a
            count outside ``0..k``, a draft id out of range, a missing or misplaced -1 pad, a
            draft with q = 0, a wrong number of requests, or a request naming a token outside
            the vocabulary.
    """
    logits = _require_tensor("target_logits", target_logits)
    ids = _require_tensor("draft_token_ids", draft_token_ids)
    counts = _require_tensor("num_draft_tokens", num_draft_tokens)
    _require_rank("target_logits", logits, 3, "[B, k+1, V]")
    _require_rank("draft_token_ids", ids, 2, "[B, k]")
    _require_rank("num_draft_tokens", counts, 1, "[B]")
    if logits.dtype not in SERVING_LOGIT_DTYPES:
        raise InvalidInputError(
            "target_logits",
            f"expected float32, bfloat16 or float64, got {logits.dtype}",
        )
    batch, positions, vocab = logits.shape
    if positions < 1 or vocab < 1:
        raise InvalidInputError(
            "target_logits", f"needs k+1 >= 1 positions and V >= 1, got {tuple(logits.shape)}"
        )
    k = positions - 1
    if tuple(ids.shape) != (batch, k):
        raise InvalidInputError(
            "draft_token_ids", f"expected shape {(batch, k)} = [B, k], got {tuple(ids.shape)}"
        )
    if tuple(counts.shape) != (batch,):
        raise InvalidInputError(
            "num_draft_tokens", f"expected shape {(batch,)} = [B], got {tuple(counts.shape)}"
        )
    for name, tensor in (("draft_token_ids", ids), ("num_draft_tokens", counts)):
        if tensor.dtype not in (torch.int64, torch.int32):
            raise InvalidInputError(name, f"expected an integer dtype (int64), got {tensor.dtype}")
    if batch and (int(counts.min()) < 0 or int(counts.max()) > k):
        bad = int(counts[(counts < 0) | (counts > k)][0])
        raise InvalidInputError("num_draft_tokens", f"{bad} is outside 0..k = 0..{k}")
    drafted = torch.arange(k, device=ids.device).unsqueeze(0) < counts.unsqueeze(1)
    if bool((ids[~drafted] != PLACEHOLDER).any()):
        b, i = torch.nonzero(~drafted & (ids != PLACEHOLDER))[0].tolist()
        raise InvalidInputError(
            "draft_token_ids",
            f"row {b} position {i}: expected the pad {PLACEHOLDER} at and after "
            f"num_draft_tokens[{b}] = {int(counts[b])}, got {int(ids[b, i])}",
        )
    used = ids[drafted]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= vocab):
        bad = int(used[(used < 0) | (used >= vocab)][0])
        raise InvalidInputError(
            "draft_token_ids", f"token id {bad} out of range [0, {vocab}) for a drafted position"
        )
    reached = torch.arange(positions, device=ids.device).unsqueeze(0) <= counts.unsqueeze(1)
    _require_logit_values(logits, reached)
    if draft_probs is not None:
        draft = _require_tensor("draft_probs", draft_probs)
        _require_rank("draft_probs", draft, 3, "[B, k, V]")
        _require_float("draft_probs", draft)
        if tuple(draft.shape) != (batch, k, vocab):
            raise InvalidInputError(
                "draft_probs",
                f"expected shape {(batch, k, vocab)} = [B, k, V], got {tuple(draft.shape)}",
            )
        if used.numel():
            validate_probability_rows("draft_probs", draft[drafted])
            mass = draft[drafted].gather(-1, used.long().unsqueeze(-1)).squeeze(-1)
            if bool((mass <= 0).any()):
                token = int(used[mass <= 0][0])
                raise InvalidInputError(
                    "draft_token_ids",
                    f"token {token} has draft probability 0, so it cannot have been drafted",
                )
    _validate_requests(requests, batch, vocab)
    _require_generator(generator)
    return batch, k, vocab


def _validate_requests(requests: object, batch: int, vocab: int) -> None:
    """``requests`` is a sequence of ``batch`` :class:`Request` naming tokens in ``[0, V)``.

    Raises:
        InvalidInputError: naming ``requests``.
    """
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise InvalidInputError(
            "requests", f"expected a sequence of Request, got {type(requests).__name__}"
        )
    if len(requests) != batch:
        raise InvalidInputError("requests", f"has {len(requests)} requests for B = {batch} rows")
    for b, request in enumerate(requests):
        if not isinstance(request, Request):
            raise InvalidInputError(
                "requests", f"row {b}: expected a Request, got {type(request).__name__}"
            )
        try:
            request.check_vocabulary(vocab)
        except ValueError as error:
            raise InvalidInputError("requests", f"row {b}: {error}") from None


def validate_serving_tree_inputs(
    target_logits: object,
    draft_probs: object,
    parents: object,
    token_ids: object,
    draft_scheme: object,
    requests: object,
    generator: object = _NOT_GIVEN,
) -> tuple[int, int, int]:
    """Validate the arguments of a serving tree verifier call (:class:`ServingTreeVerifier`).

    Args:
        target_logits: ``[B, N+1, V]`` tensor of a dtype in :data:`SERVING_LOGIT_DTYPES`; no
            NaN or ``+inf``; every row has a finite logit.
        draft_probs, parents, token_ids, draft_scheme: as for :func:`validate_tree_inputs`.
        requests: a sequence of B :class:`~losslessness.requests.Request` naming no token id
            outside ``[0, V)``.
        generator: must be a ``torch.Generator`` when given.

    Returns:
        ``(B, N, V)``.

    Raises:
        InvalidInputError: naming the argument: :func:`validate_tree_inputs`'s errors (the
            target's named ``target_logits``), a logits dtype outside
            :data:`SERVING_LOGIT_DTYPES`, NaN or ``+inf`` logits, a row with every logit
            ``-inf``, or :func:`validate_serving_inputs`'s request errors.
    """
    logits = _require_tensor("target_logits", target_logits)
    _require_rank("target_logits", logits, 3, "[B, N+1, V]")
    if logits.dtype not in SERVING_LOGIT_DTYPES:
        raise InvalidInputError(
            "target_logits", f"expected float32, bfloat16 or float64, got {logits.dtype}"
        )
    _require_logit_values(logits)
    # The tree's structure, the drafts and the scheme are the tree protocol's: checked against
    # the logits' softmax, a distribution of the same shape.
    try:
        batch, nodes, vocab = validate_tree_inputs(
            torch.softmax(logits.to(torch.float64), dim=-1), draft_probs, parents, token_ids,
            draft_scheme, generator,
        )
    except InvalidInputError as error:
        if error.argument != "target_probs":
            raise
        raise InvalidInputError("target_logits", error.problem) from None
    _validate_requests(requests, batch, vocab)
    return batch, nodes, vocab


def validate_serving_output(
    output: torch.Tensor, draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor,
    vocab_size: int,
) -> None:
    """Check a serving verifier's output layout (:class:`ServingVerifier`).

    Args:
        output: ``[B, k+1]`` integer tensor.
        draft_token_ids: ``[B, k]`` the call's drafts.
        num_draft_tokens: ``[B]`` the call's draft counts.
        vocab_size: V.

    Raises:
        InvalidInputError: naming ``output``: a wrong shape or dtype, a row emitting no token
            or more than ``num_draft_tokens[b] + 1``, a token after the -1 pad, an id outside
            ``[0, V)``, or an emitted token before the last that differs from the draft.
    """
    batch, k = draft_token_ids.shape
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != (batch, k + 1):
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise InvalidInputError(
            "output", f"expected shape {(batch, k + 1)} = [B, k+1], got {shape}"
        )
    if output.is_floating_point() or output.dtype == torch.bool:
        raise InvalidInputError("output", f"expected an integer dtype (int64), got {output.dtype}")
    tokens = output.long()
    for b in range(batch):
        row = tokens[b].tolist()
        emitted = row.index(PLACEHOLDER) if PLACEHOLDER in row else k + 1
        limit = int(num_draft_tokens[b]) + 1
        if any(token != PLACEHOLDER for token in row[emitted:]):
            raise InvalidInputError("output", f"row {b}: a token after the pad: {row}")
        if not 1 <= emitted <= limit:
            raise InvalidInputError(
                "output", f"row {b}: emits {emitted} tokens, expected 1..{limit}: {row}"
            )
        if any(not 0 <= token < vocab_size for token in row[:emitted]):
            raise InvalidInputError("output", f"row {b}: a token outside [0, {vocab_size}): {row}")
        drafts = draft_token_ids[b, : emitted - 1].tolist()
        if row[: emitted - 1] != drafts:
            raise InvalidInputError(
                "output", f"row {b}: accepted tokens {row[: emitted - 1]} differ from the drafts "
                f"{drafts}",
            )
