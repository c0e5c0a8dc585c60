"""Medusa's tree verification (``medusa-llm`` on PyPI), wrapped into the tree protocols.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", section 2.3 and 2.3.1) verifies a tree of candidates in one forward pass and
keeps the longest accepted root-to-leaf path. Its decision function is
``medusa.model.utils.evaluate_posterior(logits, candidates, temperature, posterior_threshold,
posterior_alpha)`` (:data:`POSTERIOR_PARAMETERS`): ``candidates [P, L+1]`` are the tree's
root-to-leaf paths (column 0 the already decided root token, then the path's drafted tokens),
``logits [P, L+1, V]`` the target's logits at every position of every path. It returns
``(best_candidate, accept_length)``: the path kept and how many of its drafts are accepted.
The next token is then ``medusa.model.utils.generate_candidates``'s
``torch.argmax(logits[:, -1])`` on the target's logits after the last accepted token
(:data:`CANDIDATE_PARAMETERS`; ``update_inference_inputs`` keeps
``logits[best_candidate, accept_length]``): in medusa-llm 0.1 it is the argmax whatever the
temperature.

- ``temperature == 0`` (target ``medusa``, :class:`MedusaGreedyTreeVerifier`): a draft is
  accepted when it equals the argmax at its parent (``torch.argmax``, ties to the lowest
  index); the path with the most accepted drafts is kept, the first such path on ties. With
  distinct sibling tokens at most one child of a node matches, so this is greedy decoding along
  the tree and equals :func:`losslessness.reference.tree.verify_tree_greedy`. Siblings that
  repeat a token are not distinguished by Medusa (its trees are Cartesian products of distinct
  top-k tokens); there it keeps the *deepest* matching path, where the reference keeps the
  lowest-index child.
- ``temperature > 0`` (target ``medusa-typical``, :class:`MedusaTypicalTreeVerifier`),
  Medusa's *typical acceptance* (section 2.3.1): draft x at a node with target law p is accepted
  when ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))`` (H the entropy), the
  longest accepted path is kept (ties by the path's log-likelihood), and the next token is the
  argmax of p at the last accepted node. Deterministic given p: lossy by design (the paper says
  it trades the target's law for speed); the adapter lets the audit measure it. The protocol's
  ``target_probs`` are the processed law, passed as ``logits = log p`` with temperature 1.
  Defaults ``posterior_threshold = 0.09``, ``posterior_alpha = 0.3`` are
  ``MedusaModel.medusa_generate``'s.

**Layout**: a protocol tree becomes Medusa's paths by ``root_to_leaf_paths``, one path per leaf in
increasing leaf index, each path's logits the target's rows at its nodes. Shorter paths are
padded to ``D+1`` with an extra token id V whose logit is ``-inf`` in every row (probability 0),
so a padding position is never accepted, greedy or typical, and changes no real token's
probability or the entropy.

Checked against medusa-llm 0.1 (the only release on PyPI, :data:`MEDUSA`): ``pip install
--no-deps medusa-llm==0.1`` installs in about 2 s (36 kB wheel) and ``medusa.model.utils``
imports only torch, so the adapter runs on CPU with the project's own environment.
"""

from __future__ import annotations

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

MEDUSA = EngineSpec("medusa-llm", ("0.1",), "pip install --no-deps medusa-llm==0.1")
"""medusa-llm as this adapter was checked against it (its only PyPI release)."""

POSTERIOR_PARAMETERS = (
    "logits",
    "candidates",
    "temperature",
    "posterior_threshold",
    "posterior_alpha",
)
"""``medusa.model.utils.evaluate_posterior``'s parameters at medusa-llm 0.1."""

CANDIDATE_PARAMETERS = ("medusa_logits", "logits", "medusa_topk", "tree_indices", "temperature")
"""``medusa.model.utils.generate_candidates``'s parameters at medusa-llm 0.1."""

POSTERIOR_THRESHOLD = 0.09
"""``MedusaModel.medusa_generate``'s default ``posterior_threshold`` (medusa-llm 0.1)."""

POSTERIOR_ALPHA = 0.3
"""``MedusaModel.medusa_generate``'s default ``posterior_alpha`` (medusa-llm 0.1)."""


def _path_inputs(
    logits: torch.Tensor, tokens: torch.Tensor, paths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa's ``(logits [P, D+1, V+1], candidates [P, D+1])`` for one tree: position i of a
    path holds its node at depth i (the root at 0); padding is token V of logit ``-inf``."""
    vocab = logits.shape[-1]
    count = paths.shape[0]
    padded = torch.cat([torch.zeros((count, 1), dtype=torch.int64), paths], dim=1)
    real = padded >= 0
    # A padding position repeats the leaf's row (never read for a decision: its token is V).
    leaf = torch.where(real, padded, 0).cummax(dim=1).values
    rows = torch.where(real, padded, leaf)
    extended = torch.cat(
        [logits, torch.full((logits.shape[0], 1), float("-inf"), dtype=logits.dtype)], dim=1
    )
    node_tokens = torch.cat([torch.zeros(1, dtype=torch.int64), tokens.long()])
    candidates = torch.where(real, node_tokens[padded.clamp(min=0)], vocab)
    return extended[rows], candidates


class _MedusaVerifier:
    """Shared loop: one ``evaluate_posterior`` call per tree of the batch.

    Args:
        evaluate_posterior: ``medusa.model.utils.evaluate_posterior``.
        generate_candidates: ``medusa.model.utils.generate_candidates`` (the next token).
    """

    def __init__(
        self, evaluate_posterior: Callable[..., Any], generate_candidates: Callable[..., Any]
    ) -> None:
        self.evaluate_posterior = evaluate_posterior
        self.generate_candidates = generate_candidates

    def _verify(
        self,
        logits: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        temperature: float,
        posterior_threshold: float,
        posterior_alpha: float,
    ) -> TreeOutput:
        batch = logits.shape[0]
        parents = parents.long().cpu()
        depth = int(tree_depths(parents).max())
        tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
        accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
        empty_heads = torch.zeros((0, 1, 1, logits.shape[-1] + 1), dtype=logits.dtype)
        for b in range(batch):
            paths = root_to_leaf_paths(parents[b])
            path_logits, candidates = _path_inputs(logits[b].cpu(), token_ids[b].cpu(), paths)
            best, length = self.evaluate_posterior(
                path_logits, candidates, temperature, posterior_threshold, posterior_alpha
            )
            best, length = int(best), int(length)
            nodes = paths[best, :length]
            accepted[b, :length] = nodes
            tokens[b, :length] = candidates[best, 1 : length + 1]
            # Medusa's next root token: argmax of the target's logits after the last accepted
            # token (update_inference_inputs keeps logits[best, accept_length]).
            next_token, _ = self.generate_candidates(
                empty_heads,
                path_logits[None, best, length : length + 1],
                [],
                torch.zeros(1, dtype=torch.int64),
                temperature,
            )
            tokens[b, length] = int(next_token.reshape(-1)[0])
        return TreeOutput(tokens, accepted)


class MedusaGreedyTreeVerifier(_MedusaVerifier):
    """Medusa's greedy tree verification (``evaluate_posterior`` at temperature 0), in the
    :class:`~losslessness.protocol.GreedyTreeVerifier` protocol (module docstring)."""

    def __call__(
        self, target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
    ) -> TreeOutput:
        """One greedy tree verification step; :class:`TreeOutput` (tokens ``[B, D+1]``,
        accepted nodes ``[B, D]``, int64 on CPU).

        Raises:
            InvalidInputError: see :func:`losslessness.protocol.validate_greedy_tree_inputs`.
        """
        validate_greedy_tree_inputs(target_logits, parents, token_ids)
        return self._verify(target_logits, parents, token_ids, 0.0, POSTERIOR_THRESHOLD,
                            POSTERIOR_ALPHA)


TYPICAL_EXCLUSIONS = "draft schemes other than top-k (Medusa's trees are its heads' top-k tokens)"
"""The cases ``medusa-typical`` declares it does not take (:class:`MedusaTypicalTreeVerifier`
raises :class:`~losslessness.adapters.NotApplicable` on them)."""


class MedusaTypicalTreeVerifier(_MedusaVerifier):
    """Medusa's typical acceptance (``evaluate_posterior`` at temperature 1 on ``log p``) in the
    :class:`~losslessness.protocol.TreeVerifier` protocol; lossy by design (module docstring).

    Medusa's trees are the top-k tokens of its heads, so the verifier declares
    ``draft_schemes = ("top-k",)`` and refuses the others. It consumes no randomness.

    Args:
        evaluate_posterior: ``medusa.model.utils.evaluate_posterior``.
        generate_candidates: ``medusa.model.utils.generate_candidates``.
        posterior_threshold: epsilon of typical acceptance (a probability in (0, 1]).
        posterior_alpha: delta of typical acceptance (> 0).
    """

    draft_schemes: tuple[str, ...] = ("top-k",)
    """The draft schemes whose inputs this verifier accepts; others raise InvalidInputError."""

    def __init__(
        self,
        evaluate_posterior: Callable[..., Any],
        generate_candidates: Callable[..., Any],
        posterior_threshold: float = POSTERIOR_THRESHOLD,
        posterior_alpha: float = POSTERIOR_ALPHA,
    ) -> None:
        super().__init__(evaluate_posterior, generate_candidates)
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

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
                draft scheme other than ``top-k``.
        """
        validate_tree_inputs(
            target_probs, draft_probs, parents, token_ids, draft_scheme, generator
        )
        if draft_scheme not in self.draft_schemes:
            raise NotApplicable(
                f"{draft_scheme!r} is not supported: Medusa's trees are the top-k tokens of "
                "its heads and typical acceptance ignores q; it supports 'top-k' only",
                argument="draft_scheme",
            )
        logits = target_probs.to(torch.float64).log()
        return self._verify(logits, parents, token_ids, 1.0, self.posterior_threshold,
                            self.posterior_alpha)


def _load() -> tuple[str, Callable[..., Any], Callable[..., Any]]:
    version = installed_version(MEDUSA.distribution)
    if version is None:
        raise AdapterUnavailable(
            f"{MEDUSA.distribution} is not installed; install it with: {MEDUSA.install} "
            "(medusa.model.utils needs only torch)"
        )
    try:
        from medusa.model import utils
    except Exception as error:  # a broken install can fail with more than ImportError
        raise AdapterUnavailable(
            f"{MEDUSA.distribution} {version}: importing medusa.model.utils failed "
            f"({type(error).__name__}: {error}); install the checked version with: "
            f"{MEDUSA.install}"
        ) from error
    functions = []
    for name, expected in (
        ("evaluate_posterior", POSTERIOR_PARAMETERS),
        ("generate_candidates", CANDIDATE_PARAMETERS),
    ):
        function = getattr(utils, name, None)
        if not callable(function):
            raise AdapterUnavailable(
                f"{MEDUSA.distribution} {version}: API changed, medusa.model.utils.{name} is "
                f"missing; install the checked version with: {MEDUSA.install}"
            )
        require_parameters(MEDUSA, version, function, name, expected)
        functions.append(function)
    return version, functions[0], functions[1]


def adapter() -> Adapter:
    """The ``medusa`` target: Medusa's greedy tree verification (temperature 0).

    Raises:
        AdapterUnavailable: medusa-llm missing, or an API that differs from 0.1's (the reason
            gives the install command).
    """
    version, evaluate_posterior, generate_candidates = _load()
    return Adapter(
        name="medusa",
        description=f"{version_note(MEDUSA, version)} medusa.model.utils.evaluate_posterior "
        "at temperature 0 (longest path of drafts equal to the parent's argmax) and "
        "generate_candidates' argmax for the next token; trees as root-to-leaf paths",
        greedy_tree=MedusaGreedyTreeVerifier(evaluate_posterior, generate_candidates),
    )


def typical_adapter() -> Adapter:
    """The ``medusa-typical`` target: Medusa's typical acceptance (lossy by design).

    Raises:
        AdapterUnavailable: as :func:`adapter`.
    """
    version, evaluate_posterior, generate_candidates = _load()
    return Adapter(
        name="medusa-typical",
        description=f"{version_note(MEDUSA, version)} medusa.model.utils.evaluate_posterior "
        f"typical acceptance (temperature 1 on log p, posterior_threshold "
        f"{POSTERIOR_THRESHOLD}, posterior_alpha {POSTERIOR_ALPHA}, medusa_generate's "
        "defaults) and generate_candidates' argmax for the next token; draft scheme top-k "
        "only; lossy by design (Cai et al. 2024, section 2.3.1)",
        tree=MedusaTypicalTreeVerifier(evaluate_posterior, generate_candidates),
        exclusions=TYPICAL_EXCLUSIONS,
        expected_verdict="LOSSY",
        expected_reason="typical acceptance is deterministic given p: it trades the target's "
        "law for speed (Cai et al. 2024, section 2.3.1)",
    )
