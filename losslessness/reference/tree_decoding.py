"""A reference tree speculative-decoding loop on toy models, and tree drafters.

One iteration of :meth:`TreeSpeculativeDecoder.generate`:

1. the proposer drafts a tree after the context (:class:`TreeProposal`: protocol parents,
   tokens, the draft law q at every node, and the draft scheme its siblings follow);
2. the target's processed law p is computed at every node's context (``context`` plus the
   tokens on the path from the root to the node: one "forward pass" over the tree with a tree
   attention mask);
3. the tree verifier (:func:`losslessness.reference.tree.verify_tree`, or
   :func:`~losslessness.reference.tree.verify_tree_greedy` when greedy) accepts a root-to-node
   path and emits one final token;
4. the context, the stand-in for the KV cache, is rolled back to the accepted path: the tokens
   of the accepted nodes (read from ``accepted_nodes``, the cache entries kept) plus the final
   token (:meth:`TreeSpeculativeDecoder.rollback`).

Drafters (all deterministic in the tree's shape given the context, except the i.i.d. one):

- :class:`DynamicTreeProposer` (EAGLE-2-like, scheme ``top-k``): layer by layer, expand the
  ``top_k`` nodes of the newest layer with the largest cumulative draft probability (the
  product of q along the path), each into its ``top_k`` most likely tokens; then keep the
  ``max_nodes`` nodes of largest cumulative probability (Li et al. 2024, "EAGLE-2", section 4:
  expansion then reranking; the kept set is closed under parents and under higher-q siblings,
  since both have at least the node's value and come first in creation order).
- :class:`StaticTreeProposer` (Medusa-like, scheme ``top-k``): a fixed ``tree_choices``
  converted by :func:`losslessness.reference.tree_layouts.tree_choices_to_parents`; a node of
  depth d and rank r holds the r-th most likely token of "head" d-1, whose law is the draft
  model's marginal law of the token d positions after the context (what a Medusa head learns
  to predict; Cai et al. 2024, "Medusa", section 2.1). Every node at depth d shares that law.
- :class:`MultiDraftProposer` (SpecInfer-like, scheme ``iid``): ``n_drafts`` independent
  chains of ``depth`` tokens, each sampled from the draft model, as ``n_drafts`` children of the
  root (their first tokens i.i.d. from q at the root, duplicates kept) each carrying its own
  chain (Miao et al. 2024, "SpecInfer", section 3); or (MCSD-like, scheme
  ``without-replacement``) the chains' first tokens drawn without replacement (Yang et al.
  2024, "Multi-Candidate Speculative Decoding"; Jeon et al. 2024).

The loop is an :class:`~losslessness.protocol.EndToEndGenerator` reporting its accepted lengths
(:class:`~losslessness.protocol.ReportsAcceptedLengths`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from losslessness.protocol import PLACEHOLDER, TreeOutput
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.proposers import LanguageModel
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from losslessness.reference.tree_layouts import tree_choices_to_parents

__all__ = [
    "DynamicTreeProposer",
    "GreedyTreeVerifierFn",
    "MultiDraftProposer",
    "StaticTreeProposer",
    "TreeProposal",
    "TreeProposer",
    "TreeSpeculativeDecoder",
    "TreeVerifierFn",
    "top_tokens",
]

TreeVerifierFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, torch.Generator], TreeOutput
]
"""The :class:`~losslessness.protocol.TreeVerifier` call signature."""

GreedyTreeVerifierFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], TreeOutput]
"""The :class:`~losslessness.protocol.GreedyTreeVerifier` call signature."""


@dataclass(frozen=True)
class TreeProposal:
    """A drafted tree in the protocol layout (one tree, no batch axis).

    Attributes:
        parents: ``N`` parents, ``parents[j] < j + 1`` (node 0 the root context).
        token_ids: ``N`` drafted tokens, node ``j+1``'s at ``j``.
        draft_probs: ``[N+1, V]`` float64, q at every node (the law its children came from;
            rows of leaves are ignored by the verifier).
        draft_scheme: how siblings were drawn (:data:`losslessness.protocol.DRAFT_SCHEMES`).
    """

    parents: list[int]
    token_ids: list[int]
    draft_probs: torch.Tensor
    draft_scheme: str

    def path(self, node: int) -> list[int]:
        """Tokens from the root to ``node`` (0: empty)."""
        tokens: list[int] = []
        while node > 0:
            tokens.append(self.token_ids[node - 1])
            node = self.parents[node - 1]
        return tokens[::-1]


class TreeProposer(Protocol):
    """Drafts a tree after ``context``; randomness only from ``generator``."""

    vocab_size: int

    def propose(self, context: Sequence[int], generator: torch.Generator) -> TreeProposal:
        """The drafted tree (see :class:`TreeProposal`)."""
        ...


def top_tokens(law: torch.Tensor, count: int) -> list[int]:
    """The up to ``count`` tokens of largest probability in ``law`` ``[V]`` with probability
    > 0, in decreasing probability, ties towards the lower id (as
    :func:`losslessness.protocol.sample_siblings` orders ``top-k`` siblings)."""
    order = torch.sort(law, descending=True, stable=True).indices[:count].tolist()
    return [int(token) for token in order if float(law[token]) > 0]


class DynamicTreeProposer:
    """EAGLE-2-like dynamic tree (module docstring), scheme ``top-k``.

    Args:
        model: the draft model.
        sampling: sampling parameters applied to q (the target's).
        top_k: children per expanded node and nodes expanded per layer, ``>= 1``.
        depth: layers, ``>= 1``.
        max_nodes: drafted nodes kept by the final reranking, ``>= 1``.

    Raises:
        ValueError: naming an argument below 1.
    """

    def __init__(
        self,
        model: LanguageModel,
        sampling: SamplingParameters | None,
        top_k: int,
        depth: int,
        max_nodes: int,
    ) -> None:
        for name, value in (("top_k", top_k), ("depth", depth), ("max_nodes", max_nodes)):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        self.model = model
        self.sampling = sampling
        self.top_k = top_k
        self.depth = depth
        self.max_nodes = max_nodes
        self.vocab_size = model.vocab_size

    def propose(self, context: Sequence[int], generator: torch.Generator) -> TreeProposal:
        """Expand, rerank, keep ``max_nodes`` nodes in creation order (``generator`` unused)."""
        del generator
        base = list(context)
        # Created nodes: (parent index in `created` or -1, token, cumulative value, path).
        created: list[tuple[int, int, float, list[int]]] = []
        frontier: list[tuple[int, float, list[int]]] = [(-1, 1.0, [])]  # (node, value, path)
        for _ in range(self.depth):
            layer: list[int] = []
            for node, value, path in frontier:
                law = self.model.next_token_probs(base + path, self.sampling)
                for token in top_tokens(law, self.top_k):
                    created.append((node, token, value * float(law[token]), [*path, token]))
                    layer.append(len(created) - 1)
            best = sorted(layer, key=lambda i: (-created[i][2], i))[: self.top_k]
            frontier = [(i, created[i][2], created[i][3]) for i in sorted(best)]
        kept = sorted(sorted(range(len(created)), key=lambda i: (-created[i][2], i))[
            : self.max_nodes
        ])
        number = {old: new + 1 for new, old in enumerate(kept)}
        parents = [number[created[i][0]] if created[i][0] >= 0 else 0 for i in kept]
        tokens = [created[i][1] for i in kept]
        rows = [self.model.next_token_probs(base, self.sampling)]
        rows += [self.model.next_token_probs(base + created[i][3], self.sampling) for i in kept]
        return TreeProposal(parents, tokens, torch.stack(rows).to(torch.float64), "top-k")


class StaticTreeProposer:
    """Medusa-like static tree from ``tree_choices`` (module docstring), scheme ``top-k``.

    Args:
        model: the draft model whose marginals stand in for the heads.
        sampling: sampling parameters applied to the draft model.
        tree_choices: the fixed tree (paths of ranks, closed under prefixes; a node's children
            must be ranks ``0..c-1`` for the ``top-k`` scheme to hold).

    Raises:
        InvalidInputError: from :func:`~losslessness.reference.tree_layouts.
            tree_choices_to_parents`.
    """

    def __init__(
        self,
        model: LanguageModel,
        sampling: SamplingParameters | None,
        tree_choices: Sequence[Sequence[int]],
    ) -> None:
        self.model = model
        self.sampling = sampling
        self.layout = tree_choices_to_parents(tree_choices)
        self.depth = int(self.layout.depths.max())
        self.vocab_size = model.vocab_size

    def head_laws(self, context: Sequence[int]) -> list[torch.Tensor]:
        """Head d's law ``[V]`` float64 for d in ``0..depth-1``: the draft model's marginal law
        of the token ``d`` positions after the context's next one (exact enumeration)."""
        base = list(context)
        laws: list[torch.Tensor] = []
        prefixes: list[tuple[list[int], float]] = [([], 1.0)]
        for _ in range(self.depth):
            marginal = torch.zeros(self.vocab_size, dtype=torch.float64)
            extended: list[tuple[list[int], float]] = []
            for path, weight in prefixes:
                law = self.model.next_token_probs(base + path, self.sampling).to(torch.float64)
                marginal += weight * law
                extended += [([*path, t], weight * float(law[t])) for t in range(self.vocab_size)
                             if float(law[t]) > 0]
            laws.append(marginal)
            prefixes = extended
        return laws

    def propose(self, context: Sequence[int], generator: torch.Generator) -> TreeProposal:
        """Tokens of the fixed tree from the heads' top-k (``generator`` unused); nodes whose
        rank exceeds the head's support are dropped with their subtrees."""
        del generator
        heads = self.head_laws(context)
        ranked = [top_tokens(law, self.vocab_size) for law in heads]
        parents: list[int] = []
        tokens: list[int] = []
        rows = [heads[0]]
        number = {0: 0}
        for i, (parent, rank, depth) in enumerate(
            zip(
                self.layout.parents.tolist(),
                self.layout.ranks.tolist(),
                self.layout.depths.tolist(),
                strict=True,
            )
        ):
            if parent not in number or rank >= len(ranked[depth - 1]):
                continue
            parents.append(number[parent])
            tokens.append(ranked[depth - 1][rank])
            number[i + 1] = len(tokens)
            rows.append(heads[depth] if depth < self.depth else torch.zeros_like(heads[0]))
        return TreeProposal(parents, tokens, torch.stack(rows), "top-k")


class MultiDraftProposer:
    """SpecInfer-like or MCSD-like multi-draft (module docstring), scheme ``iid`` or
    ``without-replacement``.

    Args:
        model: the draft model.
        sampling: sampling parameters applied to q.
        n_drafts: chains, ``>= 1``.
        depth: tokens per chain, ``>= 1``.
        scheme: ``"iid"`` (the chains' first tokens drawn independently from q at the root,
            duplicates kept) or ``"without-replacement"`` (drawn one after the other from q
            with the earlier ones removed, as ``torch.multinomial(..., replacement=False)``
            draws: Yang et al. 2024, "Multi-Candidate Speculative Decoding"; Jeon et al. 2024,
            "Recursive Speculative Decoding"); the tokens below them are i.i.d. either way.

    Raises:
        ValueError: naming an argument below 1, or an unknown ``scheme``.
    """

    def __init__(
        self,
        model: LanguageModel,
        sampling: SamplingParameters | None,
        n_drafts: int,
        depth: int,
        scheme: str = "iid",
    ) -> None:
        for name, value in (("n_drafts", n_drafts), ("depth", depth)):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        if scheme not in ("iid", "without-replacement"):
            raise ValueError(f"scheme: expected 'iid' or 'without-replacement', got {scheme!r}")
        self.model = model
        self.sampling = sampling
        self.n_drafts = n_drafts
        self.depth = depth
        self.scheme = scheme
        self.vocab_size = model.vocab_size

    def propose(self, context: Sequence[int], generator: torch.Generator) -> TreeProposal:
        """``n_drafts`` chains from the root, each token drawn by ``torch.multinomial``.

        Raises:
            ValueError: ``without-replacement`` with fewer tokens of positive q at the root
                than ``n_drafts``.
        """
        base = list(context)
        root = self.model.next_token_probs(base, self.sampling).to(torch.float64)
        firsts: list[int] | None = None
        if self.scheme == "without-replacement":
            if int((root > 0).sum()) < self.n_drafts:
                raise ValueError(
                    f"n_drafts: {self.n_drafts} distinct drafts need as many tokens with q > 0 "
                    f"at the root, got {int((root > 0).sum())}"
                )
            firsts = torch.multinomial(root, self.n_drafts, replacement=False,
                                       generator=generator).tolist()
        parents: list[int] = []
        tokens: list[int] = []
        rows = [root]
        for chain in range(self.n_drafts):
            path: list[int] = []
            law = root
            for step in range(self.depth):
                if step == 0 and firsts is not None:
                    token = int(firsts[chain])
                else:
                    token = int(torch.multinomial(law, 1, generator=generator)[0])
                parents.append(0 if step == 0 else len(tokens))
                tokens.append(token)
                path.append(token)
                law = self.model.next_token_probs(base + path, self.sampling).to(torch.float64)
                rows.append(law)
        return TreeProposal(parents, tokens, torch.stack(rows), self.scheme)


@dataclass
class TreeDecodingCounters:
    """Verify steps, drafted nodes, and verify steps by accepted path length."""

    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_lengths: Counter[int] = field(default_factory=Counter)


class TreeSpeculativeDecoder:
    """The reference tree spec-decode loop (module docstring), an end-to-end generator.

    Args:
        target: the target model.
        proposer: the tree drafter.
        sampling: the target's sampling parameters (None: temperature 1, no filters).
        greedy: verify with the greedy tree verifier (the output must equal greedy decoding).
        verifier: the tree verifier (default: the reference
            :func:`losslessness.reference.tree.verify_tree`).
        greedy_verifier: the greedy tree verifier (default: the reference).

    Raises:
        ValueError: naming ``proposer`` when its vocabulary differs from the target's.
    """

    def __init__(
        self,
        target: LanguageModel,
        proposer: TreeProposer,
        sampling: SamplingParameters | None = None,
        greedy: bool = False,
        verifier: TreeVerifierFn = verify_tree,
        greedy_verifier: GreedyTreeVerifierFn = verify_tree_greedy,
    ) -> None:
        if proposer.vocab_size != target.vocab_size:
            raise ValueError(
                f"proposer: vocabulary {proposer.vocab_size} differs from the target's "
                f"{target.vocab_size}"
            )
        self.target = target
        self.proposer = proposer
        self.sampling = sampling
        self.greedy = greedy
        self.verifier = verifier
        self.greedy_verifier = greedy_verifier
        self.vocab_size = target.vocab_size
        self.counters = TreeDecodingCounters()

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        """The target's processed next-token law after ``prefix_ids``: ``[V]`` float64."""
        return self.target.next_token_probs(prefix_ids, self.sampling)

    def accepted_length_counts(self) -> dict[int, int]:
        """Verify steps by accepted path length, summed since construction."""
        return dict(sorted(self.counters.accepted_lengths.items()))

    def rollback(
        self, context: list[int], proposal: TreeProposal, accepted: list[int], final: int
    ) -> list[int]:
        """The context after a verify step: the cache keeps the accepted nodes' entries (their
        tokens, in path order) and drops every other tree node; the final token is appended."""
        return context + [proposal.token_ids[node - 1] for node in accepted] + [final]

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        """Generate ``max_new_tokens`` tokens after ``prompt_ids`` (surplus of the last step
        dropped); all randomness from one ``torch.Generator`` seeded with ``seed``.

        Raises:
            ValueError: naming ``max_new_tokens`` when negative.
            RuntimeError: the verifier returned a path that is not a root-to-node path of the
                tree, or tokens that are not its nodes' tokens plus one final token.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
        # Tensors here are a few rows of V floats: intra-op threads only add overhead (tens of
        # milliseconds per call on a loaded machine), so run single-threaded and restore.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._generate(prompt_ids, max_new_tokens, seed)
        finally:
            torch.set_num_threads(threads)

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        context = [int(token) for token in prompt_ids]
        output: list[int] = []
        while len(output) < max_new_tokens:
            proposal = self.proposer.propose(context, generator)
            nodes = len(proposal.token_ids)
            target_probs = torch.stack(
                [self.next_token_probs(context + proposal.path(n)) for n in range(nodes + 1)]
            ).to(torch.float64)
            parents = torch.tensor([proposal.parents], dtype=torch.int64)
            ids = torch.tensor([proposal.token_ids], dtype=torch.int64)
            if self.greedy:
                # Probabilities stand in for logits: the greedy verifier only takes argmaxes.
                out = self.greedy_verifier(target_probs.unsqueeze(0), parents, ids)
            else:
                out = self.verifier(
                    target_probs.unsqueeze(0),
                    proposal.draft_probs.unsqueeze(0),
                    parents,
                    ids,
                    proposal.draft_scheme,
                    generator,
                )
            accepted, emitted = self._check(proposal, out)
            self.counters.verify_steps += 1
            self.counters.drafted += nodes
            self.counters.accepted += len(accepted)
            self.counters.accepted_lengths[len(accepted)] += 1
            output += emitted
            context = self.rollback(context, proposal, accepted, emitted[-1])
        return output[:max_new_tokens]

    @staticmethod
    def _check(proposal: TreeProposal, out: TreeOutput) -> tuple[list[int], list[int]]:
        accepted = [int(n) for n in out.accepted_nodes[0].tolist() if n != PLACEHOLDER]
        tokens = [int(t) for t in out.tokens[0].tolist()]
        emitted = tokens[: tokens.index(PLACEHOLDER)] if PLACEHOLDER in tokens else tokens
        previous = 0
        for node in accepted:
            if not 1 <= node <= len(proposal.token_ids) or proposal.parents[node - 1] != previous:
                raise RuntimeError(
                    f"verifier accepted nodes {accepted}: not a root-to-node path of parents "
                    f"{proposal.parents}"
                )
            previous = node
        if len(emitted) != len(accepted) + 1 or emitted[:-1] != [
            proposal.token_ids[node - 1] for node in accepted
        ]:
            raise RuntimeError(
                f"verifier emitted {tokens} for accepted nodes {accepted}: not their tokens "
                "followed by one final token"
            )
        return accepted, emitted
