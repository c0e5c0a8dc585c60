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

from losslessness.laws import ChainLaws, chain_laws, law_after_cast
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
from losslessness.requests import Request


def _tensor_hash(case_id: str, *tensors: torch.Tensor) -> str:
    digest = hashlib.sha256(case_id.encode())
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


CHAIN_INPUT_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}
"""The input dtypes a chain case can hand its verifier (``ChainCase.dtype``), by name (the
names of ``--dtype`` and of case files)."""


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

    Two *call conditions* say how the verifier is called (issue 21: a verifier may be lossy
    only in small batches, only for float32 inputs, or only when a batch's rows all differ):

    - ``call_batch_size`` B: rows per verifier call. None (the default) fills each call with
      as many copies of every row type as :data:`losslessness.engine.draw.BATCH_ELEMENT_BUDGET`
      allows; an integer makes every call (but the last of a chunk) exactly B rows of the
      stream of row types ``0, 1, .., R-1, 0, 1, ..``: B = 1 calls one row at a time, and
      B = R with R distinct row types makes every call a batch of distinct rows.
    - ``dtype``: the precision of the ``target_probs`` and ``draft_probs`` the verifier
      receives (:data:`CHAIN_INPUT_DTYPES`): :attr:`input_target_probs`, the float64 rows
      cast. The exact laws are those of the values it receives, in float64
      (:attr:`law_target_probs`, :func:`~losslessness.laws.law_after_cast`), and the drafts
      are drawn from them, so a correct verifier is lossless at every dtype.

    Attributes:
        case_id: short unique name (used by ``--case``).
        summary: one line for humans (V, k, regime, TV).
        target_probs: ``[R, k+1, V]`` float64, rows summing to 1.
        draft_probs: ``[R, k, V]`` float64, rows summing to 1.
        tags: regimes and edge-case labels (``disjoint``, ``one-hot``, ``p-equals-q``, ...).
        call_batch_size: rows per verifier call, >= 1, or None (as many as the budget allows).
        dtype: a key of :data:`CHAIN_INPUT_DTYPES`.

    Raises:
        InvalidInputError: if the tensors do not form valid chain inputs, or naming
            ``call_batch_size`` or ``dtype`` when those are out of range.
    """

    case_id: str
    summary: str
    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    tags: frozenset[str] = field(default_factory=frozenset)
    call_batch_size: int | None = None
    dtype: str = "float64"

    def __post_init__(self) -> None:
        if self.call_batch_size is not None and (
            isinstance(self.call_batch_size, bool)
            or not isinstance(self.call_batch_size, int)
            or self.call_batch_size < 1
        ):
            raise InvalidInputError(
                "call_batch_size", f"must be an integer >= 1 or None, got {self.call_batch_size!r}"
            )
        if self.dtype not in CHAIN_INPUT_DTYPES:
            raise InvalidInputError(
                "dtype", f"{self.dtype!r} is not one of {', '.join(CHAIN_INPUT_DTYPES)}"
            )
        rows = self.draft_probs.shape[0] if self.draft_probs.dim() == 3 else 0
        ids = torch.zeros((rows, self.draft_probs.shape[1] if rows else 0), dtype=torch.int64)
        if rows and ids.shape[1]:
            ids = self.draft_probs.argmax(dim=-1)
        validate_chain_inputs(self.target_probs, self.draft_probs, ids)
        if self.dtype != "float64":
            validate_chain_inputs(self.input_target_probs, self.input_draft_probs, ids)

    @property
    def input_dtype(self) -> torch.dtype:
        """The torch dtype of :attr:`dtype`."""
        return CHAIN_INPUT_DTYPES[self.dtype]

    @cached_property
    def input_target_probs(self) -> torch.Tensor:
        """``[R, k+1, V]`` in :attr:`input_dtype`: the p rows the verifier receives
        (:attr:`target_probs` itself at float64)."""
        return self.target_probs.to(self.input_dtype)

    @cached_property
    def input_draft_probs(self) -> torch.Tensor:
        """``[R, k, V]`` in :attr:`input_dtype`: the q rows the verifier receives."""
        return self.draft_probs.to(self.input_dtype)

    @cached_property
    def law_target_probs(self) -> torch.Tensor:
        """``[R, k+1, V]`` float64: the p the exact laws use, the received rows in float64 and
        renormalised (:func:`~losslessness.laws.law_after_cast`; :attr:`target_probs` itself
        at float64, untouched)."""
        if self.dtype == "float64":
            return self.target_probs
        return law_after_cast(self.target_probs, self.input_dtype)

    @cached_property
    def law_draft_probs(self) -> torch.Tensor:
        """``[R, k, V]`` float64: the q the drafts are drawn from and the laws use (see
        :attr:`law_target_probs`)."""
        if self.dtype == "float64":
            return self.draft_probs
        return law_after_cast(self.draft_probs, self.input_dtype)

    @property
    def conditions(self) -> str:
        """The call conditions in words, ``""`` for the defaults (``"B=1 float32"``)."""
        parts = [] if self.call_batch_size is None else [f"B={self.call_batch_size}"]
        if self.dtype != "float64":
            parts.append(self.dtype)
        return " ".join(parts)

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
        """First 12 hex digits of a SHA-256 over the id, the call conditions (when not the
        defaults, so that the battery's hashes predate them) and the exact tensors."""
        conditions = f"/{self.call_batch_size}/{self.dtype}" if self.conditions else ""
        return _tensor_hash(self.case_id + conditions, self.target_probs, self.draft_probs)

    @cached_property
    def laws(self) -> tuple[ChainLaws, ...]:
        """Exact laws of each row type (:func:`~losslessness.laws.chain_laws` of
        :attr:`law_target_probs` and :attr:`law_draft_probs`), computed once per case: the
        plan, the monitors and every chain check read them."""
        return tuple(
            chain_laws(self.law_target_probs[r], self.law_draft_probs[r])
            for r in range(self.n_rows)
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


SERVING_TREE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                       "float64": torch.float64}
"""The logits dtypes a serving tree case may give its verifier, by name."""


@dataclass(frozen=True, eq=False)
class ServingTree:
    """What makes a :class:`TreeCase` a serving tree case: the raw logits its target tables
    were processed from, the request every tree of the case carries, and the engine profile
    that processed them (:func:`losslessness.batteries.serving_tree.serving_tree_case`).

    Attributes:
        request: every tree's request (its history is the history before the root).
        profile: the engine profile whose law the case's target tables hold.
        root_logits: ``[V]`` float64, the raw logits at the root, exactly as the verifier
            receives them in :attr:`dtype`.
        logit_table: ``[D, S, V]`` float64, the raw logits at a node of depth ``d >= 1`` with
            token x: ``logit_table[d-1, row(x)]`` (the case's ``token_rows``), as received.
        dtype: the name of the logits' dtype, a key of :data:`SERVING_TREE_DTYPES`.
        companions: the requests of the other trees of every call (a mixed batch): after each
            of the case's trees come copies of it (same drafted tokens, logits and draft laws),
            one per companion, each carrying that request. Only the case's own trees are
            checked (each companion request has unmixed cases of its own), so a verifier
            whose law for a tree depends on the other requests of its batch (a batch-level
            greedy or filtering flag) fails here. Empty: every tree carries ``request``.
    """

    request: Request
    profile: str
    root_logits: torch.Tensor
    logit_table: torch.Tensor
    dtype: str = "float32"
    companions: tuple[Request, ...] = ()

    @property
    def torch_dtype(self) -> torch.dtype:
        """The logits' torch dtype."""
        return SERVING_TREE_DTYPES[self.dtype]


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
        serving: None for a tree case; for a serving tree case, the raw logits and request its
            target tables were processed from (a serving tree verifier gets :meth:`logits`,
            not the target tables).

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
    serving: ServingTree | None = None

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
        root, table = self.root_target, self.target_table
        if self.serving is not None:
            spec = self.serving
            # A serving tree case is its raw logits, request and profile: its target tables,
            # the profile's law computed with this CPU's exp kernels, may differ in the last
            # bit from one machine to the next, and its seeds derive from this hash.
            dtype += f"/{spec.profile}/{spec.dtype}/{spec.request!r}"
            if spec.companions:
                dtype += f"/with {spec.companions!r}"
            root, table = spec.root_logits, spec.logit_table
        return _tensor_hash(
            f"{self.case_id}/{self.draft_scheme}/{self.batch_size}{dtype}", self.parents_tensor,
            root, self.root_draft, table, self.draft_table, *rows,
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

    def logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """A serving tree verifier's ``target_logits`` for drafted trees.

        Args:
            token_ids: ``[B, N]`` int64, e.g. from :meth:`draw_trees`.

        Returns:
            ``[B, N+1, V]`` in :attr:`ServingTree.dtype`: row 0 the root's raw logits, row n
            the logit table's row at node n's depth and token.

        Raises:
            ValueError: the case is not a serving tree case.
        """
        if self.serving is None:
            raise ValueError(f"{self.case_id}: not a serving tree case (no raw logits)")
        batch = token_ids.shape[0]
        depth_index = (self.depths[1:] - 1).expand(batch, -1)
        logits = torch.cat(
            [self.serving.root_logits.expand(batch, 1, -1),
             self.serving.logit_table[depth_index, self.table_rows(token_ids)]], dim=1
        )
        return logits.to(self.serving.torch_dtype)


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


SERVING_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
"""The logits dtypes a serving case may serve its rows in, by name."""


@dataclass(frozen=True)
class ServingRow:
    """One row kind of a serving case: what one request's verify step looks like.

    Attributes:
        label: what the row kind exercises (``"top-k 5 + top-p 0.8, T 0.7"``).
        logits: ``[k+1, V]`` float64 raw target logits (the case casts them to its dtype).
        request: the request's sampling parameters and history. A seeded request
            (``seed`` not None) gets a fresh seed drawn by the audit at every call, so its
            rows are independent across calls while each obeys the seed contract.
        num_draft_tokens: drafts of this row, ``0..k``.
        draft_probs: ``[k, V]`` float64 draft laws the audit draws the drafts from, or None
            (a drafter that passes no probabilities: the drafts are :attr:`drafts`).
        drafts: the fixed draft token ids (``num_draft_tokens`` of them) when
            ``draft_probs`` is None, else None.

    Raises:
        InvalidInputError: naming the field, for shapes, counts or drafts that disagree.
    """

    label: str
    logits: torch.Tensor
    request: Request
    num_draft_tokens: int
    draft_probs: torch.Tensor | None = None
    drafts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.logits.dim() != 2 or self.logits.dtype != torch.float64:
            raise InvalidInputError("logits", "expected [k+1, V] float64")
        positions, vocab = self.logits.shape
        if not 0 <= self.num_draft_tokens < positions:
            raise InvalidInputError(
                "num_draft_tokens", f"{self.num_draft_tokens} is outside 0..k = 0..{positions - 1}"
            )
        if (self.draft_probs is None) == (self.drafts is None):
            raise InvalidInputError("drafts", "give draft_probs or fixed drafts, exactly one")
        if self.draft_probs is not None and tuple(self.draft_probs.shape) != (positions - 1, vocab):
            raise InvalidInputError("draft_probs", f"expected [k, V] = {(positions - 1, vocab)}")
        if self.drafts is not None and (
            len(self.drafts) != self.num_draft_tokens
            or any(not 0 <= d < vocab for d in self.drafts)
        ):
            raise InvalidInputError(
                "drafts", f"expected {self.num_draft_tokens} ids in [0, {vocab})"
            )
        try:
            self.request.check_vocabulary(vocab)
        except ValueError as error:
            raise InvalidInputError("request", str(error)) from None


@dataclass(frozen=True)
class ServingCase:
    """A serving batch: R row kinds, each repeated ``copies`` times per call, served in one
    logits dtype (issue 21; the serving protocol of :mod:`losslessness.protocol`).

    Row ``b`` of a call is kind ``b % R``; B = R * copies. Either every kind has draft
    probabilities or none has (a call passes ``draft_probs`` for the whole batch or None).

    Attributes:
        case_id: the case's name.
        summary: one line: what the batch mixes.
        rows: the row kinds.
        copies: rows of each kind per call (1: every row of a call distinct).
        dtype: ``float64``, ``float32`` or ``bfloat16`` (:data:`SERVING_DTYPES`).
        max_steps: a cap on the rows per kind built into the case's design (large
            vocabularies, whose reference laws are slow), or None (the battery's cap); its
            results state the TV they reach.

    Raises:
        InvalidInputError: naming the field: no rows, rows of different k or V, a mix of rows
            with and without draft probabilities, copies < 1, an unknown dtype.
    """

    case_id: str
    summary: str
    rows: tuple[ServingRow, ...]
    copies: int = 1
    dtype: str = "float32"
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if not self.rows:
            raise InvalidInputError("rows", "a serving case needs at least one row kind")
        shapes = {tuple(row.logits.shape) for row in self.rows}
        if len(shapes) != 1:
            raise InvalidInputError("rows", f"row kinds disagree on [k+1, V]: {sorted(shapes)}")
        if len({row.draft_probs is None for row in self.rows}) != 1:
            raise InvalidInputError(
                "rows", "either every row kind has draft probabilities or none has"
            )
        if self.copies < 1:
            raise InvalidInputError("copies", f"must be >= 1, got {self.copies}")
        if self.dtype not in SERVING_DTYPES:
            raise InvalidInputError(
                "dtype", f"{self.dtype!r} is not one of {', '.join(SERVING_DTYPES)}"
            )

    @property
    def k(self) -> int:
        """Draft length ``k`` (the batch's widest draft block)."""
        return int(self.rows[0].logits.shape[0]) - 1

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return int(self.rows[0].logits.shape[1])

    @property
    def n_rows(self) -> int:
        """R, the row kinds."""
        return len(self.rows)

    @property
    def batch_size(self) -> int:
        """B = R * copies, rows per call."""
        return self.n_rows * self.copies

    @property
    def with_draft_probs(self) -> bool:
        """Whether calls pass ``draft_probs`` (else None: one-hot drafts)."""
        return self.rows[0].draft_probs is not None

    @cached_property
    def served_logits(self) -> torch.Tensor:
        """``[R, k+1, V]`` the rows' logits in the case's dtype: what the verifier sees and
        what the profile's law is computed from."""
        return torch.stack([row.logits for row in self.rows]).to(SERVING_DTYPES[self.dtype])

    @cached_property
    def served_draft_probs(self) -> torch.Tensor | None:
        """``[R, k, V]`` the draft laws as the verifier sees them (float32, renormalised), or
        None; the audit draws the drafts from exactly these (in float64)."""
        if not self.with_draft_probs:
            return None
        q = torch.stack([row.draft_probs for row in self.rows if row.draft_probs is not None])
        q = q.to(torch.float32)
        return q / q.sum(dim=-1, keepdim=True)

    @cached_property
    def case_hash(self) -> str:
        """Hash of the id, the tensors, the requests, drafts, copies and dtype."""
        digest = hashlib.sha256(self.case_id.encode())
        digest.update(f"{self.copies}/{self.dtype}".encode())
        for row in self.rows:
            digest.update(repr((row.request, row.num_draft_tokens, row.drafts)).encode())
            digest.update(row.logits.contiguous().numpy().tobytes())
            if row.draft_probs is not None:
                digest.update(row.draft_probs.contiguous().numpy().tobytes())
        return digest.hexdigest()[:12]
