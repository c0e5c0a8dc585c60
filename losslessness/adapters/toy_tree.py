"""The reference tree spec-decode loop on toy Markov models, as end-to-end targets
(``toy-tree``).

``losslessness audit toy-tree`` audits :func:`adapter`: an EAGLE-2-like dynamic tree, a
Medusa-like static tree (``tree_choices`` :data:`MEDUSA_CHOICES`), a SpecInfer-like i.i.d.
multi-draft, an MCSD-like multi-draft without replacement, and the dynamic tree decoded
greedily. Every target runs
:class:`~losslessness.reference.tree_decoding.TreeSpeculativeDecoder` with the reference tree
verifiers (:mod:`losslessness.reference.tree`), so the audit must find them LOSSLESS (the
sampled ones on the sequence law, the greedy one equal to greedy decoding) with drafts accepted
in most verify steps.
"""

from __future__ import annotations

from losslessness.adapters.base import Adapter, EndToEndTarget
from losslessness.adapters.toy import toy_models
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.tree_decoding import (
    DynamicTreeProposer,
    MultiDraftProposer,
    StaticTreeProposer,
    TreeSpeculativeDecoder,
)

__all__ = [
    "MEDUSA_CHOICES",
    "TREE_SAMPLING",
    "adapter",
    "dynamic_tree_decoder",
    "multi_draft_decoder",
    "static_tree_decoder",
]

TREE_SAMPLING = SamplingParameters(temperature=0.8)
"""Sampling parameters of the sampled targets (applied identically to target and draft)."""

MEDUSA_CHOICES: tuple[tuple[int, ...], ...] = ((0,), (0, 0), (1,), (0, 1), (0, 0, 0), (1, 0))
"""The static tree: two children of the root, two below the first, one below the second, and a
third level under the most likely path (every node's children are ranks 0..c-1)."""

_VOCAB = 4
_PROMPT = (1, 3, 2)
_NEW_TOKENS = 2
_MAX_SEQUENCES = 1200
_GREEDY_NEW_TOKENS = 24
_TOP_K = 2
_DEPTH = 3
_MAX_NODES = 6
_N_DRAFTS = 3


def dynamic_tree_decoder(
    sampling: SamplingParameters | None = TREE_SAMPLING, greedy: bool = False
) -> TreeSpeculativeDecoder:
    """EAGLE-2-like dynamic tree (top-k 2, depth 3, 6 nodes) on
    :func:`losslessness.adapters.toy.toy_models`."""
    target, draft = toy_models(vocab_size=_VOCAB)
    proposer = DynamicTreeProposer(draft, sampling, _TOP_K, _DEPTH, _MAX_NODES)
    return TreeSpeculativeDecoder(target, proposer, sampling, greedy=greedy)


def static_tree_decoder(
    sampling: SamplingParameters | None = TREE_SAMPLING,
) -> TreeSpeculativeDecoder:
    """Medusa-like static tree :data:`MEDUSA_CHOICES` on the toy models."""
    target, draft = toy_models(vocab_size=_VOCAB)
    choices = [list(path) for path in MEDUSA_CHOICES]
    return TreeSpeculativeDecoder(target, StaticTreeProposer(draft, sampling, choices), sampling)


def multi_draft_decoder(
    sampling: SamplingParameters | None = TREE_SAMPLING, scheme: str = "iid"
) -> TreeSpeculativeDecoder:
    """Multi-draft (3 chains of 2 tokens) on the toy models: SpecInfer-like i.i.d. first tokens
    (``scheme="iid"``) or MCSD-like distinct ones (``"without-replacement"``)."""
    target, draft = toy_models(vocab_size=_VOCAB)
    proposer = MultiDraftProposer(draft, sampling, _N_DRAFTS, 2, scheme)
    return TreeSpeculativeDecoder(target, proposer, sampling)


def adapter() -> Adapter:
    """The ``toy-tree`` adapter: five end-to-end targets on the reference tree loop."""
    return Adapter(
        name="toy-tree",
        description="losslessness.reference.tree_decoding.TreeSpeculativeDecoder on toy Markov "
        f"models (V={_VOCAB}, L={_NEW_TOKENS}, at most {_MAX_SEQUENCES} sequences per sampled "
        "target), "
        "reference tree and greedy tree verifiers",
        end_to_end=(
            EndToEndTarget(
                "toy-tree/eagle-dynamic",
                f"EAGLE-2-like dynamic tree (top-k {_TOP_K}, depth {_DEPTH}, {_MAX_NODES} nodes), "
                f"scheme top-k, {TREE_SAMPLING}",
                dynamic_tree_decoder(),
                _PROMPT,
                _NEW_TOKENS,
                max_sequences=_MAX_SEQUENCES,
            ),
            EndToEndTarget(
                "toy-tree/medusa-static",
                f"Medusa-like static tree {[list(p) for p in MEDUSA_CHOICES]}, scheme top-k, "
                f"{TREE_SAMPLING}",
                static_tree_decoder(),
                _PROMPT,
                _NEW_TOKENS,
                max_sequences=_MAX_SEQUENCES,
            ),
            EndToEndTarget(
                "toy-tree/specinfer-iid",
                f"SpecInfer-like i.i.d. multi-draft ({_N_DRAFTS} chains of 2), scheme iid, "
                f"{TREE_SAMPLING}",
                multi_draft_decoder(),
                _PROMPT,
                _NEW_TOKENS,
                max_sequences=_MAX_SEQUENCES,
            ),
            EndToEndTarget(
                "toy-tree/mcsd-without-replacement",
                f"MCSD-like multi-draft ({_N_DRAFTS} chains of 2, distinct first tokens), "
                f"scheme without-replacement, {TREE_SAMPLING}",
                multi_draft_decoder(scheme="without-replacement"),
                _PROMPT,
                _NEW_TOKENS,
                max_sequences=_MAX_SEQUENCES,
            ),
            EndToEndTarget(
                "toy-tree/eagle-greedy",
                f"EAGLE-2-like dynamic tree (top-k {_TOP_K}, depth {_DEPTH}, {_MAX_NODES} nodes), "
                "greedy tree verifier",
                dynamic_tree_decoder(None, greedy=True),
                _PROMPT,
                _GREEDY_NEW_TOKENS,
                greedy=True,
            ),
        ),
    )
