"""Domain case types: what one verification step is asked to verify.

One chain case (target/draft distributions of R row types), one greedy case (logits and
drafts). The engine's battery, the Hypothesis strategies, the mutant zoo and the property suite
all produce these types; the checks and the engine consume them. Shapes follow the protocols of
:mod:`losslessness.protocol`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import torch

from losslessness.protocol import validate_chain_inputs, validate_greedy_inputs


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
