"""The reference spec-decode loop on toy Markov models, as end-to-end targets (``toy``), and
three end-to-end mutants whose bugs live in the plumbing around a correct verifier.

``losslessness audit toy`` audits :func:`adapter`: a draft model sampled with temperature and
top-p, the same greedy, and n-gram prompt lookup sampled and greedy. Every target uses the
reference chain (or greedy) verifier inside :class:`~losslessness.reference.decoding.
SpeculativeDecoder`; the audit must find them LOSSLESS with drafts accepted in most verify
steps.

:func:`mutant_adapter` holds the mutants (each must come out LOSSY):

- ``untempered-draft``: the drafter samples from its raw softmax (temperature not applied to
  the draft) while the loop hands the verifier the draft law with the temperature applied,
  believing the sampling parameters were applied to both. (Had it reported the law it really
  sampled from, rejection sampling would stay lossless: losslessness needs ``d ~ q``, not
  ``q`` close to ``p``.)
- ``greedy-draft-softmax-q``: the drafter takes the argmax of q but reports the softmax q as
  the law the draft was drawn from.
- ``rejected-token-kept``: the rollback keeps the rejected draft token in the context (the
  KV cache cropped one token too late), so later tokens are drawn from the wrong logit row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from losslessness.adapters.base import Adapter, EndToEndTarget
from losslessness.reference.decoding import SpeculativeDecoder
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.proposers import DraftModelProposer, NgramProposer, Proposal
from losslessness.reference.toy import MarkovLM

__all__ = [
    "DRAFT_SAMPLING",
    "NGRAM_SAMPLING",
    "GreedyDraftSoftmaxQ",
    "RejectedTokenKept",
    "UntemperedDraft",
    "adapter",
    "draft_model_decoder",
    "mutant_adapter",
    "ngram_decoder",
    "toy_models",
]

DRAFT_SAMPLING = SamplingParameters(temperature=0.8, top_p=0.9)
"""Sampling parameters of the draft-model targets (temperature and nucleus filtering, applied
identically to target and draft)."""

NGRAM_SAMPLING = SamplingParameters(temperature=1.2, top_k=3)
"""Sampling parameters of the n-gram target."""

MUTANT_TEMPERATURE = SamplingParameters(temperature=0.5)
"""The ``untempered-draft`` mutant's parameters: temperature only, so the draft law with and
without it has the same support (every drafted token stays valid for the verifier)."""

_VOCAB = 6
_PROMPT = (1, 4, 2)
_NEW_TOKENS = 3
_GREEDY_NEW_TOKENS = 24
_K = 3


def toy_models(
    vocab_size: int = _VOCAB, sharpness: float = 1.5, noise: float = 0.6, seed: int = 11
) -> tuple[MarkovLM, MarkovLM]:
    """A second-order target and a draft near it (the target's table plus Gaussian noise of
    std ``noise``): acceptance rate about 0.8 at the defaults."""
    target = MarkovLM.random(vocab_size, order=2, sharpness=sharpness, seed=seed)
    return target, target.perturbed(noise, seed=seed + 1)


def draft_model_decoder(
    sampling: SamplingParameters | None = DRAFT_SAMPLING, greedy: bool = False, k: int = _K
) -> SpeculativeDecoder:
    """The reference loop with a draft model on :func:`toy_models`."""
    target, draft = toy_models()
    return SpeculativeDecoder(
        target, DraftModelProposer(draft, sampling, greedy=greedy), k, sampling, greedy=greedy
    )


def ngram_decoder(
    sampling: SamplingParameters | None = NGRAM_SAMPLING, greedy: bool = False, k: int = _K
) -> SpeculativeDecoder:
    """The reference loop with n-gram prompt lookup on a sharp first-order target, whose text
    repeats (its greedy text cycles 3, 2, 1, 4; so lookups succeed)."""
    target = MarkovLM.random(5, order=1, sharpness=3.0, seed=0)
    return SpeculativeDecoder(target, NgramProposer(5, max_ngram=2), k, sampling, greedy=greedy)


_NGRAM_PROMPT = (0, 3, 2, 1, 4, 3, 2, 1)


def adapter() -> Adapter:
    """The ``toy`` adapter: four end-to-end targets on the reference loop (module docstring)."""
    return Adapter(
        name="toy",
        description="losslessness.reference.decoding.SpeculativeDecoder on toy Markov models "
        f"(V={_VOCAB}, k={_K}), reference chain and greedy verifiers",
        end_to_end=(
            EndToEndTarget(
                "toy/draft-sampling",
                f"draft model, {DRAFT_SAMPLING}, k={_K}",
                draft_model_decoder(),
                _PROMPT,
                _NEW_TOKENS,
            ),
            EndToEndTarget(
                "toy/draft-greedy",
                f"draft model, greedy, k={_K}",
                draft_model_decoder(greedy=True),
                _PROMPT,
                _GREEDY_NEW_TOKENS,
                greedy=True,
            ),
            EndToEndTarget(
                "toy/ngram-sampling",
                f"n-gram prompt lookup (n<=2), {NGRAM_SAMPLING}, k={_K}",
                ngram_decoder(),
                _NGRAM_PROMPT,
                _NEW_TOKENS,
            ),
            EndToEndTarget(
                "toy/ngram-greedy",
                f"n-gram prompt lookup (n<=2), greedy, k={_K}",
                ngram_decoder(greedy=True),
                _NGRAM_PROMPT,
                _GREEDY_NEW_TOKENS,
                greedy=True,
            ),
        ),
    )


class UntemperedDraft(DraftModelProposer):
    """Mutant proposer: samples each draft from the draft model's raw softmax (no sampling
    parameters) but reports the processed law as q."""

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        """``k`` drafts from the raw softmax, reported with the processed laws."""
        extended = list(context)
        tokens: list[int] = []
        rows = []
        for _ in range(k):
            token = self.choose(self.model.next_token_probs(extended, None), generator)
            rows.append(self.draft_law(extended))
            tokens.append(token)
            extended.append(token)
        return Proposal(tokens, torch.stack(rows))


class GreedyDraftSoftmaxQ(DraftModelProposer):
    """Mutant proposer: takes the argmax of q but reports the softmax q as its law."""

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        """``k`` argmax drafts, reported with the full processed laws."""
        extended = list(context)
        tokens: list[int] = []
        rows = []
        for _ in range(k):
            law = self.draft_law(extended)
            token = int(argmax_lowest_index(law))
            rows.append(law)
            tokens.append(token)
            extended.append(token)
        return Proposal(tokens, torch.stack(rows))


class RejectedTokenKept(SpeculativeDecoder):
    """Mutant loop: after a rejection the context keeps the rejected draft token before the
    correction (the cache cropped one position too late)."""

    def rollback(self, context: list[int], proposal: Proposal, emitted: list[int]) -> list[int]:
        """``context + accepted + [rejected draft] + [correction]`` on a rejection."""
        accepted = len(emitted) - 1
        if accepted < len(proposal.token_ids):
            return context + emitted[:-1] + [proposal.token_ids[accepted], emitted[-1]]
        return context + emitted


def mutant_adapter() -> Adapter:
    """The three end-to-end mutants (module docstring) as targets of one adapter."""
    target, draft = toy_models()
    return Adapter(
        name="toy-mutants",
        description="the reference loop with plumbing bugs around a correct chain verifier",
        end_to_end=(
            EndToEndTarget(
                "toy-mutant/untempered-draft",
                f"draft sampled without temperature, q reported with it ({MUTANT_TEMPERATURE})",
                SpeculativeDecoder(
                    target, UntemperedDraft(draft, MUTANT_TEMPERATURE), _K, MUTANT_TEMPERATURE
                ),
                _PROMPT,
                _NEW_TOKENS,
            ),
            EndToEndTarget(
                "toy-mutant/greedy-draft-softmax-q",
                f"argmax drafts reported with the softmax q ({DRAFT_SAMPLING})",
                SpeculativeDecoder(
                    target, GreedyDraftSoftmaxQ(draft, DRAFT_SAMPLING), _K, DRAFT_SAMPLING
                ),
                _PROMPT,
                _NEW_TOKENS,
            ),
            EndToEndTarget(
                "toy-mutant/rejected-token-kept",
                f"rollback keeps the rejected draft in the context ({DRAFT_SAMPLING})",
                RejectedTokenKept(
                    target, DraftModelProposer(draft, DRAFT_SAMPLING), _K, DRAFT_SAMPLING
                ),
                _PROMPT,
                _NEW_TOKENS,
            ),
        ),
    )
