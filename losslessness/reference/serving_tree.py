"""The reference serving tree verifier (issue 21): tree speculative sampling on an engine
profile's law at every node (:class:`~losslessness.protocol.ServingTreeVerifier`).

At node n of tree b the target law is ``profile.law(target_logits[b, n], requests[b],
history)``, the history being the request's output followed by the tokens on the path from
the root to n; then :func:`losslessness.reference.tree.verify_tree` (Leviathan et al. 2022,
Alg. 1 and its multi-draft extension; Chen et al. 2023) verifies the tree on those laws. A
verifier that processes each node's logits as the engine's non-speculative sampler does and
verifies with a lossless tree rule is lossless for the engine's law.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from losslessness.protocol import TreeOutput, validate_serving_tree_inputs
from losslessness.reference.serving import ProfileVerifier
from losslessness.reference.tree import verify_tree
from losslessness.requests import Request

__all__ = ["ServingTreeReference", "path_histories"]


def path_histories(parents: torch.Tensor, token_ids: torch.Tensor) -> list[list[list[int]]]:
    """The tokens on the path from the root to every node.

    Args:
        parents: ``[B, N]`` int64, ``parents[b, j] < j + 1``.
        token_ids: ``[B, N]`` int64.

    Returns:
        ``paths[b][n]``: node n's path tokens (``[]`` for the root), for n in ``0..N``.
    """
    paths = []
    for b in range(parents.shape[0]):
        tree: list[list[int]] = [[]]
        for j in range(parents.shape[1]):
            tree.append(tree[int(parents[b, j])] + [int(token_ids[b, j])])
        paths.append(tree)
    return paths


class ServingTreeReference(ProfileVerifier):
    """Tree speculative sampling on ``profile``'s law at every node (module docstring).

    Args:
        profile: the engine's non-speculative law, or its registered name (looked up on the
            first call).

    Subclasses in the zoo override :meth:`target_law` to reproduce an engine's bug.
    """

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int], depth: int
    ) -> torch.Tensor:
        """p' at one node of depth ``depth``: the profile's law, ``[V]`` float64."""
        return self.profile.law(logits, request, history)

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> TreeOutput:
        """One verification step per tree (serving tree protocol).

        Raises:
            InvalidInputError: see :func:`losslessness.protocol.validate_serving_tree_inputs`.
            UnsupportedRequest: a request field the profile does not implement.
            NoTokenLeft: a node where the request's masks leave no token.
        """
        validate_serving_tree_inputs(
            target_logits, draft_probs, parents, token_ids, draft_scheme, requests, generator
        )
        # The profiles compute on CPU; so does the verification here.
        logits = target_logits.detach().to("cpu", torch.float64)
        parents, token_ids = parents.cpu(), token_ids.cpu()
        paths = path_histories(parents, token_ids)
        # The law is a function of (logits, request, history, depth): nodes of the call that
        # repeat all four (the root of every tree of one request, above all) are computed once.
        laws: dict[tuple[bytes, Request, tuple[int, ...]], torch.Tensor] = {}

        def law(row: torch.Tensor, request: Request, path: list[int]) -> torch.Tensor:
            history = (*request.output_token_ids, *path)
            key = (row.numpy().tobytes(), request, history)
            if key not in laws:
                laws[key] = self.target_law(row, request, list(history), len(path))
            return laws[key]

        probs = torch.stack([
            torch.stack([law(logits[b, n], request, path) for n, path in enumerate(paths[b])])
            for b, request in enumerate(requests)
        ])
        return verify_tree(
            probs, draft_probs.detach().to("cpu", torch.float64), parents, token_ids,
            draft_scheme, generator,
        )
