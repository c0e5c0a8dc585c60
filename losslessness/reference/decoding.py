"""The reference speculative decoding loop, and plain decoding to compare it with.

One iteration of :meth:`SpeculativeDecoder.generate` (Leviathan et al. 2022, Alg. 1 run in a
loop; Chen et al. 2023, Alg. 2):

1. the proposer drafts ``k' <= k`` tokens after the context, with their laws q_i;
2. the target's processed laws p_0..p_k' are computed after ``context + d_<i`` (one
   "forward pass" over the context and the drafts, row k' being the bonus position);
3. the chain verifier (or, when greedy, the greedy verifier) emits the accepted drafts plus
   one correction or bonus token;
4. the context, the stand-in for the KV cache, is cropped to ``context + accepted drafts`` and
   the emitted correction/bonus token is appended (:meth:`SpeculativeDecoder.rollback`).

Sampling parameters (temperature, top-k, top-p, min-p) are applied identically to the target
and the draft, in the order :mod:`losslessness.reference.processing` documents (temperature,
top-k, top-p, min-p, then softmax, as transformers does). Greedy decoding takes the argmax of
the processed target law (equal to the argmax of the raw logits: every filter keeps the top
token and temperature preserves order), lowest index on ties.

The loop is an :class:`~losslessness.protocol.EndToEndGenerator` that also reports its
accepted lengths (:class:`~losslessness.protocol.ReportsAcceptedLengths`), so the sequence-law
check audits it like any engine; its methods :meth:`~SpeculativeDecoder.target_law` and
:meth:`~SpeculativeDecoder.rollback` are where the end-to-end mutants put their bugs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from losslessness.protocol import PLACEHOLDER, ChainVerifier, GreedyVerifier
from losslessness.reference.chain import verify
from losslessness.reference.greedy import argmax_lowest_index, verify_greedy
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.proposers import LanguageModel, Proposal, Proposer
from losslessness.reference.sampling import sample_inverse_cdf

__all__ = [
    "DecodingCounters",
    "SpeculativeDecoder",
    "VerifyStep",
    "greedy_decode",
    "sample_autoregressive",
]


@dataclass
class DecodingCounters:
    """What a spec-decode loop did, summed over its ``generate`` calls.

    Attributes:
        drafted: draft tokens proposed.
        accepted: draft tokens accepted.
        rejected: draft tokens rejected (at most one per verify step; the drafts after it are
            discarded unverified, ``drafted - accepted - rejected`` of them in all).
        verify_steps: target verification steps (one per loop iteration).
        emitted: tokens emitted (accepted drafts plus one correction or bonus per step),
            counted before truncation to ``max_new_tokens``.
        accepted_lengths: verify steps by number of drafts accepted (0..k).
    """

    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    verify_steps: int = 0
    emitted: int = 0
    accepted_lengths: Counter[int] = field(default_factory=Counter)

    @property
    def tokens_per_step(self) -> float:
        """Emitted tokens per verify step, E[tokens / verify] (1.0 is plain decoding);
        ``nan`` before any step."""
        return self.emitted / self.verify_steps if self.verify_steps else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified drafts: the per-position acceptance rate alpha (drafts after a
        rejection are never verified and do not count); ``nan`` before any verified draft."""
        verified = self.accepted + self.rejected
        return self.accepted / verified if verified else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per verify step (``tokens_per_step - 1``); ``nan`` before any."""
        return self.accepted / self.verify_steps if self.verify_steps else float("nan")


@dataclass(frozen=True)
class VerifyStep:
    """One verification step, as passed to ``generate``'s ``on_step`` callback.

    Attributes:
        context: the tokens the models conditioned on (prompt and generated so far).
        draft_token_ids: the ``k'`` drafts.
        draft_probs: ``[k', V]`` float64, their laws q_i.
        target_probs: ``[k'+1, V]`` float64, the target's processed laws p_i.
        emitted: the tokens the verifier emitted (accepted drafts, then one more).
    """

    context: tuple[int, ...]
    draft_token_ids: tuple[int, ...]
    draft_probs: torch.Tensor
    target_probs: torch.Tensor
    emitted: tuple[int, ...]

    @property
    def accepted_length(self) -> int:
        """Number of drafts accepted."""
        return len(self.emitted) - 1


class SpeculativeDecoder:
    """The reference spec-decode loop (module docstring), an end-to-end generator.

    Args:
        target: the target model.
        proposer: the drafter (:mod:`losslessness.reference.proposers`); a draft model must
            use the same ``sampling`` for the loop to be lossless.
        k: draft length, ``>= 0`` (0 is plain decoding through the verifier).
        sampling: sampling parameters of the target (None: temperature 1, no filters).
        greedy: decode greedily (argmax) and verify with the greedy verifier.
        verifier: the chain verifier (default: the reference,
            :func:`losslessness.reference.chain.verify`).
        greedy_verifier: the greedy verifier (default: the reference).

    Attributes:
        vocab_size: V.
        counters: :class:`DecodingCounters`, summed over every ``generate`` call.

    Raises:
        ValueError: naming ``k`` when negative, or ``proposer`` when its vocabulary differs.
    """

    def __init__(
        self,
        target: LanguageModel,
        proposer: Proposer,
        k: int,
        sampling: SamplingParameters | None = None,
        greedy: bool = False,
        verifier: ChainVerifier = verify,
        greedy_verifier: GreedyVerifier = verify_greedy,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k: must be an int >= 0, got {k!r}")
        if proposer.vocab_size != target.vocab_size:
            raise ValueError(
                f"proposer: vocabulary size {proposer.vocab_size} differs from the target's "
                f"{target.vocab_size}"
            )
        self.target = target
        self.proposer = proposer
        self.k = k
        self.sampling = sampling
        self.greedy = greedy
        self.verifier = verifier
        self.greedy_verifier = greedy_verifier
        self.vocab_size = target.vocab_size
        self.counters = DecodingCounters()

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        """The target's processed next-token law after ``prefix_ids``: ``[V]`` float64."""
        return self.target.next_token_probs(prefix_ids, self.sampling)

    def target_law(self, context: Sequence[int]) -> torch.Tensor:
        """p after ``context`` as the verifier sees it: ``[V]`` float64 (mutants override)."""
        return self.target.next_token_probs(context, self.sampling)

    def rollback(self, context: list[int], proposal: Proposal, emitted: list[int]) -> list[int]:
        """The context after a verify step: ``context`` plus the accepted drafts (the KV cache
        cropped to them) plus the emitted correction or bonus token, i.e. ``context +
        emitted``. Mutants override it."""
        del proposal
        return context + emitted

    def accepted_length_counts(self) -> dict[int, int]:
        """Verify steps by number of accepted drafts, summed since construction."""
        return dict(sorted(self.counters.accepted_lengths.items()))

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        seed: int,
        on_step: Callable[[VerifyStep], None] | None = None,
    ) -> list[int]:
        """Generate ``max_new_tokens`` tokens after ``prompt_ids``.

        Args:
            prompt_ids: the prompt, ids in ``[0, V)``.
            max_new_tokens: number of tokens to return, ``>= 0`` (the last verify step may emit
                more; the surplus is dropped, which leaves the law of the returned prefix
                unchanged).
            seed: seeds the one ``torch.Generator`` that drafts and verification draw from.
            on_step: called after every verify step with its :class:`VerifyStep`.

        Returns:
            ``max_new_tokens`` token ids.

        Raises:
            ValueError: naming ``max_new_tokens`` when negative.
            RuntimeError: the verifier emitted a malformed row.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
        generator = torch.Generator().manual_seed(seed)
        context = [int(token) for token in prompt_ids]
        output: list[int] = []
        while len(output) < max_new_tokens:
            proposal = self.proposer.propose(context, self.k, generator)
            drafts = proposal.token_ids
            target_probs = torch.stack(
                [self.target_law(context + drafts[:i]) for i in range(len(drafts) + 1)]
            )
            emitted = self._verify(target_probs, proposal, generator)
            self._count(len(drafts), len(emitted) - 1)
            if on_step is not None:
                on_step(
                    VerifyStep(
                        tuple(context), tuple(drafts), proposal.probs, target_probs, tuple(emitted)
                    )
                )
            output += emitted
            context = self.rollback(context, proposal, emitted)
        return output[:max_new_tokens]

    def _verify(
        self, target_probs: torch.Tensor, proposal: Proposal, generator: torch.Generator
    ) -> list[int]:
        ids = torch.tensor([proposal.token_ids], dtype=torch.int64).reshape(1, -1)
        if self.greedy:
            # Probabilities stand in for logits: the greedy verifier only takes argmaxes.
            row = self.greedy_verifier(target_probs.unsqueeze(0), ids)[0]
        else:
            row = self.verifier(
                target_probs.unsqueeze(0), proposal.probs.unsqueeze(0), ids, generator
            )[0]
        tokens = [int(token) for token in row.tolist()]
        length = tokens.index(PLACEHOLDER) if PLACEHOLDER in tokens else len(tokens)
        emitted = tokens[:length]
        accepted = length - 1
        if (
            not emitted
            or any(token != PLACEHOLDER for token in tokens[length:])
            or emitted[:accepted] != proposal.token_ids[:accepted]
        ):
            raise RuntimeError(
                f"verifier emitted {row.tolist()} for drafts {proposal.token_ids}: not the "
                "accepted drafts followed by one token"
            )
        return emitted

    def _count(self, drafted: int, accepted: int) -> None:
        counters = self.counters
        counters.drafted += drafted
        counters.accepted += accepted
        counters.rejected += int(accepted < drafted)
        counters.verify_steps += 1
        counters.emitted += accepted + 1
        counters.accepted_lengths[accepted] += 1


def sample_autoregressive(
    next_token_probs: Callable[[list[int]], torch.Tensor],
    prompt_ids: Sequence[int],
    new_tokens: int,
    generator: torch.Generator,
) -> list[int]:
    """Plain autoregressive sampling: ``new_tokens`` tokens, each by inverting the CDF of
    ``next_token_probs(prefix)`` ``[V]`` at one float64 uniform from ``generator``."""
    context = [int(token) for token in prompt_ids]
    for _ in range(new_tokens):
        uniform = torch.rand((1,), generator=generator, dtype=torch.float64)
        context.append(int(sample_inverse_cdf(next_token_probs(context), uniform)[0]))
    return context[len(prompt_ids) :]


def greedy_decode(
    next_token_probs: Callable[[list[int]], torch.Tensor],
    prompt_ids: Sequence[int],
    new_tokens: int,
) -> list[int]:
    """Plain greedy decoding: ``new_tokens`` tokens, each the argmax of
    ``next_token_probs(prefix)`` ``[V]`` (lowest index on ties)."""
    context = [int(token) for token in prompt_ids]
    for _ in range(new_tokens):
        context.append(int(argmax_lowest_index(next_token_probs(context))))
    return context[len(prompt_ids) :]
