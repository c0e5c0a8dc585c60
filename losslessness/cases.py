"""Domain case types: what one verification step is asked to verify.

One chain case (target/draft distributions of R row types), one greedy case (logits and
drafts), one tree case (a tree topology, a draft scheme and a Markov target/draft model that
gives p and q at every node), one greedy tree case (logits and trees). The engine's battery,
the Hypothesis strategies, the mutant zoo and the property suite
all produce these types; the checks and the engine consume them. Shapes follow the protocols of
:mod:`losslessness.protocol`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import torch

from losslessness.laws import ChainLaws, chain_laws
from losslessness.protocol import (
    DRAFT_SCHEMES,
    InvalidInputError,
    sample_siblings,
    tree_depths,
    validate_chain_inputs,
    validate_greedy_inputs,
    validate_greedy_tree_inputs,
    validate_tree_inputs,
)


def _tensor_hash(case_id: str, *tensors: torch.Tensor) -> str:
    digest = hashlib.sha256(case_id.encode())
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


class CaseShape:
    """``k``, ``vocab_size`` and ``batch_size`` of a case, read from its tensors: a chain case's
    ``draft_probs [B, k, V]`` and ``target_probs [B, k+1, V]``, a greedy case's
    ``draft_token_ids [B, k]`` and ``target_logits [B, k+1, V]``."""

    @property
    def target_shape(self) -> tuple[int, int, int]:
        """``(B, k+1, V)``: the shape of the case's target tensor."""
        raise NotImplementedError

    @property
    def batch_size(self) -> int:
        """``B``: rows (row types) of the case."""
        return self.target_shape[0]

    @property
    def k(self) -> int:
        """Draft length ``k``."""
        return self.target_shape[1] - 1

    @property
    def vocab_size(self) -> int:
        """Vocabulary size ``V``."""
        return self.target_shape[2]


@dataclass(frozen=True, eq=False)
class ChainCase(CaseShape):
    """A chain-verifier case: R row types, each with its own p_0..p_k and q_0..q_{k-1}.

    The audit draws d_i ~ q_i itself and calls the verifier on batches holding every row type,
    so a case with R > 1 exercises batches of different rows; R == 1 gives identical rows.

    Attributes:
        case_id: short unique name (used by ``--case``).
        summary: one line for humans (V, k, regime, TV).
        target_probs: ``[R, k+1, V]`` float64, rows summing to 1.
        draft_probs: ``[R, k, V]`` float64, rows summing to 1.
        tags: regimes and edge-case labels (``disjoint``, ``one-hot``, ``p-equals-q``, ...).

    Raises:
        InvalidInputError: if the tensors do not form valid chain inputs.
    """

    case_id: str
    summary: str
    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    tags: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        rows = self.draft_probs.shape[0] if self.draft_probs.dim() == 3 else 0
        ids = torch.zeros((rows, self.draft_probs.shape[1] if rows else 0), dtype=torch.int64)
        if rows and ids.shape[1]:
            ids = self.draft_probs.argmax(dim=-1)
        validate_chain_inputs(self.target_probs, self.draft_probs, ids)

    @property
    def target_shape(self) -> tuple[int, int, int]:
        """``(R, k+1, V)`` of :attr:`target_probs`."""
        batch, width, vocab = self.target_probs.shape
        return int(batch), int(width), int(vocab)

    @property
    def n_rows(self) -> int:
        """Number of distinct row types R (the case's :attr:`batch_size`)."""
        return self.batch_size

    @cached_property
    def case_hash(self) -> str:
        """First 12 hex digits of a SHA-256 over the id and the exact tensors."""
        return _tensor_hash(self.case_id, self.target_probs, self.draft_probs)

    @cached_property
    def laws(self) -> tuple[ChainLaws, ...]:
        """Exact laws of each row type (:func:`~losslessness.laws.chain_laws`),
        computed once per case: the plan, the monitors and every chain check read them."""
        return tuple(
            chain_laws(self.target_probs[r], self.draft_probs[r]) for r in range(self.n_rows)
        )


@dataclass(frozen=True, eq=False)
class GreedyCase(CaseShape):
    """A greedy-verifier case: a batch of target logits and drafts.

    Attributes:
        case_id: short unique name.
        summary: one line for humans.
        target_logits: ``[B, k+1, V]`` float (``-inf`` allowed).
        draft_token_ids: ``[B, k]`` int64.
        tags: regimes (``ties``, ``masked``, ...).

    Raises:
        InvalidInputError: if the tensors do not form valid greedy inputs.
    """

    case_id: str
    summary: str
    target_logits: torch.Tensor
    draft_token_ids: torch.Tensor
    tags: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        validate_greedy_inputs(self.target_logits, self.draft_token_ids)

    @property
    def target_shape(self) -> tuple[int, int, int]:
        """``(B, k+1, V)`` of :attr:`target_logits`."""
        batch, width, vocab = self.target_logits.shape
        return int(batch), int(width), int(vocab)

    @cached_property
    def case_hash(self) -> str:
        """First 12 hex digits of a SHA-256 over the id and the exact tensors."""
        return _tensor_hash(self.case_id, self.target_logits, self.draft_token_ids)


@dataclass(frozen=True, eq=False)
class TreeCase:
    """A tree-verifier case: one tree topology, a draft scheme and a Markov model for p and q.

    p and q at a node depend only on its depth and its token (a Markov chain per depth), so
    siblings repeating a token share their laws, as they would under a real language model, and
    the law check may pool nodes whose p is the same row.

    Attributes:
        case_id: short unique name (used by ``--case``).
        summary: one line for humans (shape, V, scheme, regime).
        parents: length-N tuple, ``parents[j]`` the parent of node ``j+1`` (``< j+1``).
        root_target: ``[V]`` float64, p at the root context.
        root_draft: ``[V]`` float64, q at the root (the root's children are drawn from it).
        target_table: ``[D, S, V]`` float64 (S = V unless ``token_rows`` is given); p at a node
            of depth ``d >= 1`` with token x is ``target_table[d-1, row(x)]``, ``row(x) = x``
            or ``token_rows[x]``.
        draft_table: ``[D, S, V]`` float64; q at such a node, ``draft_table[d-1, row(x)]``.
        draft_scheme: one of :data:`losslessness.protocol.DRAFT_SCHEMES`.
        batch_size: trees per verifier call (each an independent step).
        tags: regimes and edge-case labels (``star``, ``duplicates``, ``zeros``, ...).
        token_rows: ``[V]`` int64 in ``[0, S)`` or None: the table row of each token, so that
            tokens share rows and a case at a real vocabulary (V = 152k) holds ``S`` rows per
            depth instead of V (a ``[D, V, V]`` table would need V^2 cells).
        input_dtype: the dtype of the p and q the verifier receives (:meth:`inputs`):
            ``torch.float64`` or ``torch.float32``. The tables hold exactly the values the
            verifier receives (in float64; :func:`losslessness.batteries.tree.tree_case_in_dtype`
            rounds them), so the exact laws are computed from them.

    Raises:
        InvalidInputError: naming the field: a malformed tree, tables of the wrong shape or not
            distributions, an unknown scheme, or more ``without-replacement`` siblings than
            tokens with q > 0.
    """

    case_id: str
    summary: str
    parents: tuple[int, ...]
    root_target: torch.Tensor
    root_draft: torch.Tensor
    target_table: torch.Tensor
    draft_table: torch.Tensor
    draft_scheme: str
    batch_size: int = 64
    tags: frozenset[str] = field(default_factory=frozenset)
    token_rows: torch.Tensor | None = None
    input_dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if self.input_dtype not in (torch.float64, torch.float32):
            raise InvalidInputError(
                "input_dtype", f"must be torch.float64 or torch.float32, got {self.input_dtype}"
            )
        for name in ("root_target", "root_draft", "target_table", "draft_table"):
            table = getattr(self, name)
            if not torch.equal(table.to(self.input_dtype).to(table.dtype), table):
                raise InvalidInputError(
                    name, f"holds values that {self.input_dtype} cannot represent: round the "
                    "tables to the input dtype first"
                )
        if self.draft_scheme not in DRAFT_SCHEMES:
            raise InvalidInputError(
                "draft_scheme", f"{self.draft_scheme!r} is not one of {', '.join(DRAFT_SCHEMES)}"
            )
        if self.batch_size < 1:
            raise InvalidInputError("batch_size", f"must be >= 1, got {self.batch_size}")
        vocab = int(self.root_target.shape[-1])
        rows = vocab
        if self.token_rows is not None:
            rows = int(self.target_table.shape[1]) if self.target_table.dim() == 3 else 0
            if (tuple(self.token_rows.shape) != (vocab,) or self.token_rows.dtype != torch.int64
                    or bool((self.token_rows < 0).any()) or bool((self.token_rows >= rows).any())):
                raise InvalidInputError(
                    "token_rows", f"expected [{vocab}] int64 in [0, {rows}) (one table row per "
                    "token)"
                )
        shape = (self.depth, rows, vocab)
        for name in ("target_table", "draft_table"):
            if tuple(getattr(self, name).shape) != shape:
                raise InvalidInputError(
                    name, f"expected shape {shape} (depth, rows, V), got "
                    f"{tuple(getattr(self, name).shape)}"
                )
        if tuple(self.root_draft.shape) != (vocab,):
            raise InvalidInputError("root_draft", f"expected shape ({vocab},)")
        siblings = torch.bincount(self.parents_tensor, minlength=self.n_nodes + 1)
        if self.draft_scheme == "without-replacement":
            support = min(
                int((self.root_draft > 0).sum()),
                int((self.draft_table > 0).sum(dim=-1).min()),
            )
            if int(siblings.max()) > support:
                raise InvalidInputError(
                    "parents",
                    f"a node has {int(siblings.max())} children, more than the {support} tokens "
                    "with q > 0 that drafting without replacement can give",
                )
        # A one-row draw validates the tree, the laws and the scheme through the protocol.
        ids = self.draw_trees(1, torch.Generator().manual_seed(0))
        target, draft = self.inputs(ids)
        validate_tree_inputs(target, draft, self.parents_tensor.unsqueeze(0), ids,
                             self.draft_scheme)

    @property
    def n_nodes(self) -> int:
        """N, the drafted nodes of the tree."""
        return len(self.parents)

    @property
    def vocab_size(self) -> int:
        """Vocabulary size V."""
        return int(self.root_target.shape[-1])

    @cached_property
    def parents_tensor(self) -> torch.Tensor:
        """``[N]`` int64 parents."""
        return torch.tensor(self.parents, dtype=torch.int64)

    @cached_property
    def depths(self) -> torch.Tensor:
        """``[N+1]`` int64 depth of every node (root 0)."""
        if not self.parents:
            raise InvalidInputError("parents", "N = 0: a tree needs at least one drafted node")
        return tree_depths(self.parents_tensor.unsqueeze(0)).squeeze(0)

    @property
    def depth(self) -> int:
        """D, the depth of the deepest node."""
        return int(self.depths.max())

    @cached_property
    def case_hash(self) -> str:
        """First 12 hex digits of a SHA-256 over the id, scheme, tree and exact tables."""
        rows = () if self.token_rows is None else (self.token_rows,)
        dtype = "" if self.input_dtype == torch.float64 else f"/{self.input_dtype}"
        return _tensor_hash(
            f"{self.case_id}/{self.draft_scheme}/{self.batch_size}{dtype}", self.parents_tensor,
            self.root_target, self.root_draft, self.target_table, self.draft_table, *rows,
        )

    def table_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The table row of each token (``tokens`` itself when :attr:`token_rows` is None).

        Args:
            tokens: int64 token ids in ``[0, V)``, any shape.

        Returns:
            int64 rows of the same shape, indices into the tables' second axis.
        """
        return tokens if self.token_rows is None else self.token_rows[tokens]

    def draw_trees(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """Draft ``count`` independent trees: every node's children drawn from q at the node
        under :attr:`draft_scheme` (:func:`losslessness.protocol.sample_siblings`), parents
        before children, siblings jointly.

        Args:
            count: trees to draw, >= 0.
            generator: the randomness.

        Returns:
            ``[count, N]`` int64 token ids.
        """
        ids = torch.zeros((count, self.n_nodes), dtype=torch.int64)
        depths = self.depths
        for parent in range(self.n_nodes + 1):
            children = [j for j, p in enumerate(self.parents) if p == parent]
            if not children or count == 0:
                continue
            if parent == 0:
                q = self.root_draft.to(torch.float64).expand(count, -1)
            else:
                table = self.draft_table[int(depths[parent]) - 1].to(torch.float64)
                q = table[self.table_rows(ids[:, parent - 1])]
            ids[:, children] = sample_siblings(q, len(children), self.draft_scheme, generator)
        return ids

    def inputs(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's ``target_probs`` and ``draft_probs`` for drafted trees.

        Args:
            token_ids: ``[B, N]`` int64, e.g. from :meth:`draw_trees`.

        Returns:
            ``([B, N+1, V], [B, N+1, V])`` of :attr:`input_dtype`: row 0 the root's p and q,
            row n the tables' rows at node n's depth and token.
        """
        batch = token_ids.shape[0]
        depth_index = (self.depths[1:] - 1).expand(batch, -1)
        rows = self.table_rows(token_ids)
        target = torch.cat(
            [self.root_target.to(torch.float64).expand(batch, 1, -1),
             self.target_table.to(torch.float64)[depth_index, rows]], dim=1
        )
        draft = torch.cat(
            [self.root_draft.to(torch.float64).expand(batch, 1, -1),
             self.draft_table.to(torch.float64)[depth_index, rows]], dim=1
        )
        return target.to(self.input_dtype), draft.to(self.input_dtype)


@dataclass(frozen=True, eq=False)
class GreedyTreeCase:
    """A greedy tree-verifier case: a batch of target logits and trees.

    Attributes:
        case_id: short unique name.
        summary: one line for humans.
        target_logits: ``[B, N+1, V]`` float (``-inf`` allowed).
        parents: ``[B, N]`` int64, ``parents[b, j] < j + 1``.
        token_ids: ``[B, N]`` int64.
        tags: regimes (``ties``, ``masked``, ``duplicates``, ...).

    Raises:
        InvalidInputError: if the tensors do not form valid greedy tree inputs.
    """

    case_id: str
    summary: str
    target_logits: torch.Tensor
    parents: torch.Tensor
    token_ids: torch.Tensor
    tags: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        validate_greedy_tree_inputs(self.target_logits, self.parents, self.token_ids)

    @property
    def batch_size(self) -> int:
        """B, the trees of the case."""
        return int(self.target_logits.shape[0])

    @cached_property
    def case_hash(self) -> str:
        """First 12 hex digits of a SHA-256 over the id and the exact tensors."""
        return _tensor_hash(self.case_id, self.target_logits, self.parents, self.token_ids)
