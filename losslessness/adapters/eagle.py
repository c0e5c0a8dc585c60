"""EAGLE's tree verification (``eagle-llm`` on PyPI), wrapped into the tree protocols.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
section 4 and appendix on tree sampling) verifies a draft tree in one target pass. Its decision
function is ``eagle.model.utils.evaluate_posterior(logits, candidates, logits_processor,
cart_candidates_prob, op, p_indices, tree_candidates, b_indices)`` (:data:`POSTERIOR_PARAMETERS`)
on the tree's root-to-leaf paths:

- ``candidates [P, L+1]``: the paths' tokens (column 0 the root's, equal in every path), -1
  after a path's leaf; ``logits [P, L+1, V]`` the target's logits at every position.
- Sampling (``logits_processor`` given): level by level from the root, the distinct children
  of the accepted node are tried in path order. Child x is accepted when ``random.random() <=
  r(x) / q'(x)``, r the running target law (first ``softmax(logits_processor(logits))`` at the
  node) and ``q'(x) = cart_candidates_prob`` the probability with which x was drawn given the
  earlier siblings: EAGLE's draft samples a node's children *without replacement*
  (``cnets.Model.sample``, ``torch.multinomial(..., replacement=False)``), so ``q'(x_i) =
  q(x_i) / (1 - q(x_1) - .. - q(x_{i-1}))``. On rejection ``r <- norm(relu(r - q'))`` with
  ``q' = op[..][p_indices]``, the parent's q with the earlier siblings (``b_indices``, tokens
  ``tree_candidates[0][b]``) zeroed and renormalised. That is recursive rejection sampling
  without replacement (Jeon et al. 2024, Alg. 2), the protocol's ``without-replacement``
  scheme. The final token is drawn (``update_inference_inputs``: ``torch.multinomial(sample_p,
  1)``) from the returned ``sample_p``: the residual after rejections, or p at the last
  accepted node.
- Greedy (``logits_processor=None``): drafts equal to the parent's ``torch.argmax`` are
  accepted, the path with the most is kept (the first on ties), and the next token is the
  argmax of the returned logits. With distinct sibling tokens this is greedy decoding along the
  tree; with repeated sibling tokens EAGLE keeps the deepest matching path where the protocol's
  reference keeps the lowest-index child.

**Adapter conventions.** Paths are sorted lexicographically by node ids, so the children of a
node appear in index order (the protocol's sibling order, the order they were drawn in).
``op`` holds, for every depth, the tree's draft rows ``draft_probs[b]`` (``[N+1, V]``) and
``p_indices[j][i]`` the parent node of path j's position i, so ``op[i-1][p_indices[j][i]]`` is
q at that parent, as in EAGLE. ``cart_candidates_prob`` is computed with EAGLE's own formula
(``cnets.Model.sample``: ``q(x_i) / (1 - cumsum)``, clamped to [0, 1]); padding positions are 1.
``logits_processor`` is the identity on ``log p`` (the protocol's target_probs are already the
processed law). EAGLE draws its coins from Python's global ``random``: the adapter seeds it
from the protocol's generator for the call and restores its state afterwards; the final token
is drawn with ``torch.multinomial`` on the protocol's generator.

Checked against eagle-llm 1.2.1 (:data:`EAGLE`): ``pip install --no-deps eagle-llm==1.2.1``
installs in about 2 s (164 kB wheel); ``eagle.model.utils`` imports torch and transformers
(the project's ``test`` extra has it). Its declared dependencies (fschat, gradio 3.50.2,
protobuf 3.19, openai 0.28, ...) are for its demos and evaluation scripts, not this function.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from losslessness.adapters.base import Adapter, AdapterUnavailable, NotApplicable
from losslessness.adapters.engines import (
    EngineSpec,
    installed_version,
    require_parameters,
    version_note,
)
from losslessness.protocol import (
    PLACEHOLDER,
    TreeOutput,
    tree_depths,
    validate_greedy_tree_inputs,
    validate_tree_inputs,
)
from losslessness.reference.tree_layouts import root_to_leaf_paths

EAGLE = EngineSpec(
    "eagle-llm", ("1.2.1",), "pip install --no-deps eagle-llm==1.2.1 (and transformers)"
)
"""eagle-llm as this adapter was checked against it (the newest PyPI release)."""

POSTERIOR_PARAMETERS = (
    "logits",
    "candidates",
    "logits_processor",
    "cart_candidates_prob",
    "op",
    "p_indices",
    "tree_candidates",
    "b_indices",
)
"""``eagle.model.utils.evaluate_posterior``'s parameters at eagle-llm 1.2.1."""


def _identity_processor(input_ids: object, scores: torch.Tensor) -> torch.Tensor:
    """A logits processor that changes nothing (the protocol's p is already processed)."""
    return scores


class _EagleVerifier:
    """Shared layout: one ``evaluate_posterior`` call per tree of the batch.

    Args:
        evaluate_posterior: ``eagle.model.utils.evaluate_posterior``.
    """

    def __init__(self, evaluate_posterior: Callable[..., Any]) -> None:
        self.evaluate_posterior = evaluate_posterior

    @staticmethod
    def _layout(
        logits: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(paths [P, D], candidates [P, D+1], path_logits [P, D+1, V])`` for one tree."""
        paths = root_to_leaf_paths(parents, lexicographic=True)
        count = paths.shape[0]
        padded = torch.cat([torch.zeros((count, 1), dtype=torch.int64), paths], dim=1)
        real = padded >= 0
        leaf = torch.where(real, padded, 0).cummax(dim=1).values
        node_tokens = torch.cat([torch.zeros(1, dtype=torch.int64), tokens.long()])
        candidates = torch.where(real, node_tokens[padded.clamp(min=0)], PLACEHOLDER)
        return paths, candidates, logits[torch.where(real, padded, leaf)]


class EagleGreedyTreeVerifier(_EagleVerifier):
    """EAGLE's greedy tree verification (``logits_processor=None``) in the
    :class:`~losslessness.protocol.GreedyTreeVerifier` protocol (module docstring)."""

    def __call__(
        self, target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
    ) -> TreeOutput:
        """One greedy tree verification step; :class:`TreeOutput` int64 on CPU.

        Raises:
            InvalidInputError: see :func:`losslessness.protocol.validate_greedy_tree_inputs`.
        """
        batch, _, _ = validate_greedy_tree_inputs(target_logits, parents, token_ids)
        parents = parents.long().cpu()
        depth = int(tree_depths(parents).max())
        tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
        accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
        for b in range(batch):
            paths, candidates, path_logits = self._layout(
                target_logits[b].cpu(), parents[b], token_ids[b].cpu()
            )
            best, length, next_logits = self.evaluate_posterior(
                path_logits, candidates, None, None, None, None, None, None
            )
            best, length = int(best), int(length)
            accepted[b, :length] = paths[best, :length]
            tokens[b, :length] = candidates[best, 1 : length + 1]
            tokens[b, length] = int(torch.argmax(next_logits))  # update_inference_inputs
        return TreeOutput(tokens, accepted)


def _drawn_probabilities(
    draft: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """``[N+1]`` float64: for node n (n >= 1) the probability that it was drawn given its
    earlier siblings, by EAGLE's formula (``cnets.Model.sample``): ``q(x_n) / (1 - sum of q
    over the earlier siblings' tokens)``, inf/NaN to -1, clamped to [0, 1]; 1 at the root."""
    nodes = parents.numel()
    drawn = draft[parents, tokens]
    earlier = (parents.unsqueeze(1) == parents.unsqueeze(0)) & torch.ones(
        (nodes, nodes), dtype=torch.bool
    ).tril(-1)
    before = (earlier.double() * drawn.unsqueeze(0)).sum(dim=1)
    ratio = drawn / (1 - before)
    ratio = torch.where(torch.isfinite(ratio), ratio, -1.0).clamp(0.0, 1.0)
    return torch.cat([torch.ones(1, dtype=torch.float64), ratio])


class EagleTreeSampler(_EagleVerifier):
    """EAGLE's tree speculative sampling (``logits_processor`` given) in the
    :class:`~losslessness.protocol.TreeVerifier` protocol, draft scheme ``without-replacement``
    (module docstring).

    Randomness: one ``torch.randint`` seeds Python's ``random`` for EAGLE's coins (its state
    is restored after the call), then one ``torch.multinomial`` per tree for the final token.
    """

    draft_schemes: tuple[str, ...] = ("without-replacement",)
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
                draft scheme other than ``without-replacement``.
        """
        batch, _, _ = validate_tree_inputs(
            target_probs, draft_probs, parents, token_ids, draft_scheme, generator
        )
        if draft_scheme not in self.draft_schemes:
            raise NotApplicable(
                f"{draft_scheme!r} is not supported: EAGLE's draft samples a node's children "
                "without replacement and its verifier divides by that draw's probability and "
                "skips repeated tokens; it supports 'without-replacement' only",
                argument="draft_scheme",
            )
        parents = parents.long().cpu()
        depth = int(tree_depths(parents).max())
        tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
        accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        saved = random.getstate()
        random.seed(seed)
        try:
            for b in range(batch):
                self._row(b, target_probs, draft_probs, parents, token_ids, generator,
                          tokens, accepted)
        finally:
            random.setstate(saved)
        return TreeOutput(tokens, accepted)

    def _row(
        self,
        b: int,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        generator: torch.Generator,
        tokens: torch.Tensor,
        accepted: torch.Tensor,
    ) -> None:
        ids = token_ids[b].long().cpu()
        logits = target_probs[b].to(torch.float64).cpu().log()
        draft = draft_probs[b].to(torch.float64).cpu()
        paths, candidates, path_logits = self._layout(logits, parents[b], ids)
        count, width = candidates.shape
        padded = torch.cat([torch.zeros((count, 1), dtype=torch.int64), paths], dim=1)
        real = padded >= 0
        drawn = _drawn_probabilities(draft, parents[b], ids)
        cart_prob = torch.where(real, drawn[padded.clamp(min=0)], 1.0)
        node_parent = torch.cat([torch.full((1,), -1, dtype=torch.int64), parents[b]])
        p_indices = torch.where(real, node_parent[padded.clamp(min=0)], -1).tolist()
        nodes = ids.numel()
        siblings: list[list[int]] = [[] for _ in range(nodes + 1)]
        for node in range(1, nodes + 1):
            parent = int(parents[b, node - 1])
            siblings[node] = [s for s in range(1, node) if int(parents[b, s - 1]) == parent]
        b_indices: list[list[torch.Tensor | list[int]]] = [
            [
                torch.tensor(siblings[int(n)], dtype=torch.int64)
                if int(n) > 0 and siblings[int(n)] else []
                for n in padded[j]
            ]
            for j in range(count)
        ]
        tree_candidates = torch.cat([torch.zeros(1, dtype=torch.int64), ids]).unsqueeze(0)
        op = [draft] * max(width - 1, 1)
        best, length, sample_p = self.evaluate_posterior(
            path_logits, candidates, _identity_processor, cart_prob, op, p_indices,
            tree_candidates, b_indices,
        )
        best, length = int(best), int(length)
        accepted[b, :length] = paths[best, :length]
        tokens[b, :length] = candidates[best, 1 : length + 1]
        final = torch.multinomial(sample_p.to(torch.float64), 1, generator=generator)
        tokens[b, length] = int(final)


def _load() -> tuple[str, Callable[..., Any]]:
    version = installed_version(EAGLE.distribution)
    if version is None:
        raise AdapterUnavailable(
            f"{EAGLE.distribution} is not installed; install it with: {EAGLE.install}"
        )
    try:
        from eagle.model import utils
    except Exception as error:  # a broken install can fail with more than ImportError
        raise AdapterUnavailable(
            f"{EAGLE.distribution} {version}: importing eagle.model.utils failed "
            f"({type(error).__name__}: {error}); install the checked version with: "
            f"{EAGLE.install}"
        ) from error
    function = getattr(utils, "evaluate_posterior", None)
    if not callable(function):
        raise AdapterUnavailable(
            f"{EAGLE.distribution} {version}: API changed, eagle.model.utils."
            f"evaluate_posterior is missing; install the checked version with: {EAGLE.install}"
        )
    require_parameters(EAGLE, version, function, "evaluate_posterior", POSTERIOR_PARAMETERS)
    return version, function


def adapter() -> Adapter:
    """The ``eagle`` target: EAGLE's tree sampling (without-replacement siblings) and greedy
    tree verification.

    Raises:
        AdapterUnavailable: eagle-llm (or transformers) missing, or an API that differs from
            1.2.1's (the reason gives the install command).
    """
    version, evaluate_posterior = _load()
    return Adapter(
        name="eagle",
        description=f"{version_note(EAGLE, version)} eagle.model.utils.evaluate_posterior: "
        "tree sampling (recursive rejection sampling over children drawn without "
        "replacement; coins from Python's random seeded by the protocol's generator, final "
        "token by torch.multinomial) and greedy (logits_processor=None); trees as "
        "lexicographically sorted root-to-leaf paths",
        tree=EagleTreeSampler(evaluate_posterior),
        greedy_tree=EagleGreedyTreeVerifier(evaluate_posterior),
        exclusions="draft schemes other than without-replacement (EAGLE's draft samples a "
        "node's children without replacement)",
    )
