"""The reference serving chain verifier and the exact laws of its outputs (issue 21).

The verifier is Leviathan et al. 2022, Alg. 1, per row of the batch, with the target law p' at
position i the engine profile's law (:mod:`losslessness.reference.profiles`) for the row's
request and history ``request.output_token_ids + drafts[:i]``; the draft law q is the row's
``draft_probs`` or, when the drafter passes none, the one-hot at the draft. Draft ``d_i`` is
accepted when ``u < p'(d_i) / q(d_i)``; at the first rejection the correction is drawn from
``norm(max(0, p' - q))``; after ``num_draft_tokens[b]`` accepted drafts the bonus is drawn from
p' at that position. A greedy request's profile law is one-hot at its argmax, so the same steps
give greedy verification exactly. Every emitted token then follows p' at its position (Thm.
3.5 of the paper, which holds with p' depending on the accepted prefix because the step at
position i conditions on that prefix).

Randomness: an unseeded row draws from the call's generator, in row order; a seeded row from
its own generator seeded with :func:`row_seed` (its seed and its history length): the seed
contract of the serving protocol.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch

from losslessness.cases import ServingCase
from losslessness.protocol import PLACEHOLDER, validate_serving_inputs
from losslessness.reference.profiles import EngineProfile, get_profile
from losslessness.requests import Request
from losslessness.seeding import derive_seed

__all__ = [
    "MAX_ENUMERATED_PREFIXES",
    "ProfileVerifier",
    "ServingReference",
    "ServingRowLaws",
    "inverse_cdf",
    "reach_probabilities",
    "reads_history",
    "row_seed",
]

MAX_ENUMERATED_PREFIXES = 50_000
"""Most draft prefixes :func:`reach_probabilities` enumerates for a history-dependent row."""


def row_seed(request: Request) -> int:
    """The seed of a seeded row's generator: ``derive_seed(request.seed, len(history))``.

    Raises:
        ValueError: the request has no seed.
    """
    if request.seed is None:
        raise ValueError("request: has no seed")
    return derive_seed(request.seed, len(request.output_token_ids))


def reads_history(request: Request) -> bool:
    """Whether a profile's law for ``request`` may depend on the output history: a frequency,
    presence or repetition penalty, or ``min_tokens`` (every other field is position-free)."""
    return bool(
        request.frequency_penalty
        or request.presence_penalty
        or request.repetition_penalty != 1.0
        or request.min_tokens
    )


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def inverse_cdf(weights: torch.Tensor, u: float) -> int:
    """The index whose cumulative mass first exceeds ``u`` times the total (never a token of
    zero weight)."""
    cdf = torch.cumsum(weights, dim=0)
    index = int(torch.searchsorted(cdf, u * float(cdf[-1]), right=True))
    if index >= weights.shape[0] or float(weights[index]) <= 0:
        index = int(torch.nonzero(weights > 0)[-1])
    return index


class ProfileVerifier:
    """A reference verifier of one engine profile's law: the profile, and a name that says
    which (``ServingReference[vllm-v1]``).

    Args:
        profile: the engine's non-speculative law, or its registered name (looked up on the
            first call, so that the zoo can name a profile before its module is imported).
    """

    def __init__(self, profile: EngineProfile | str) -> None:
        self._profile = profile
        name = profile if isinstance(profile, str) else profile.name
        self.__name__ = self.__qualname__ = f"{type(self).__name__}[{name}]"

    @property
    def profile(self) -> EngineProfile:
        """The engine profile (resolved from its name on first use).

        Raises:
            ValueError: no profile of that name is registered.
        """
        if isinstance(self._profile, str):
            self._profile = get_profile(self._profile)
        return self._profile


class ServingReference(ProfileVerifier):
    """A correct serving chain verifier for one engine profile (the serving protocol of
    :mod:`losslessness.protocol`).

    Args:
        profile: the engine's non-speculative law, or its registered name (looked up on the
            first call, so that the zoo can name a profile before its module is imported).

    Subclasses in the zoo override one step each (:meth:`target_law`, :meth:`correction`,
    :meth:`row_generator`) to reproduce an engine's bug.
    """

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int]
    ) -> torch.Tensor:
        """p' at one position: the profile's law, ``[V]`` float64."""
        return self.profile.law(logits, request, history)

    def correction(self, weights: torch.Tensor, accept_uniform: float,
                   generator: torch.Generator) -> int:
        """The token drawn from ``weights`` (the residual or the bonus law) with a fresh
        uniform of ``generator``."""
        return inverse_cdf(weights, _uniform(generator))

    def row_generator(self, request: Request, generator: torch.Generator,
                      requests: Sequence[Request]) -> torch.Generator:
        """The randomness of one row: the request's own seeded generator, else the call's."""
        if request.seed is None:
            return generator
        return torch.Generator().manual_seed(row_seed(request))

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> torch.Tensor:
        """One verify step of the batch (the serving protocol's call).

        Returns:
            ``[B, k+1]`` int64, the accepted drafts then one token per row, -1 padded.

        Raises:
            InvalidInputError: what :func:`~losslessness.protocol.validate_serving_inputs`
                raises.
        """
        batch, k, _ = validate_serving_inputs(
            target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
        )
        output = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64)
        for b in range(batch):
            request = requests[b]
            rows = self.row_generator(request, generator, requests)
            history = list(request.output_token_ids)
            for i in range(int(num_draft_tokens[b]) + 1):
                p = self.target_law(target_logits[b, i], request, history)
                if i == int(num_draft_tokens[b]):
                    output[b, i] = self.correction(p, _uniform(rows), rows)
                    break
                draft = int(draft_token_ids[b, i])
                if draft_probs is None:
                    q = torch.zeros_like(p)
                    q[draft] = 1.0
                else:
                    q = draft_probs[b, i].to(torch.float64)
                u = _uniform(rows)
                if u * float(q[draft]) < float(p[draft]):
                    output[b, i] = draft
                    history.append(draft)
                    continue
                residual = torch.clamp(p - q, min=0.0)
                output[b, i] = self.correction(residual, u, rows)
                break
        return output


def reach_probabilities(
    laws: Sequence[torch.Tensor] | None,
    law_at: Callable[[int, tuple[int, ...]], torch.Tensor],
    draft_law: torch.Tensor | None,
    drafts: Sequence[int] | None,
    num_draft_tokens: int,
) -> list[float]:
    """Probability that a row's verify step reaches each position ``0..num_draft_tokens``.

    Position ``i`` is reached when the drafts before it were accepted:
    ``prod_{j<i} P(accept d_j | d_<j)`` summed over the prefixes ``d_<i`` (each drawn from q),
    with ``P(accept d_j) = min(q(d_j), p'_j(d_j | d_<j))`` per draft.

    Args:
        laws: the position laws ``[V]`` float64 when they do not depend on the prefix, else
            None.
        law_at: a callable ``(i, prefix) -> [V]`` float64 law (used when ``laws`` is None).
        draft_law: ``[k, V]`` float64 q, or None for the fixed ``drafts``.
        drafts: the fixed drafts when ``draft_law`` is None.
        num_draft_tokens: n.

    Returns:
        ``n + 1`` floats; the first is 1.

    Raises:
        ValueError: a history-dependent row whose prefixes exceed
            :data:`MAX_ENUMERATED_PREFIXES`.
    """
    n = num_draft_tokens
    if draft_law is None:
        assert drafts is not None
        reach = [1.0]
        for i in range(n):
            p = laws[i] if laws is not None else law_at(i, tuple(drafts[:i]))
            reach.append(reach[-1] * float(p[drafts[i]]))
        return reach
    q = draft_law.to(torch.float64)
    if laws is not None:
        reach = [1.0]
        for i in range(n):
            reach.append(reach[-1] * float(torch.minimum(laws[i], q[i]).sum()))
        return reach
    supports = [torch.nonzero(q[i] > 0).flatten().tolist() for i in range(n)]
    if math.prod(len(s) for s in supports[: max(n - 1, 0)]) > MAX_ENUMERATED_PREFIXES:
        raise ValueError(
            f"draft_probs: a history-dependent row has more than {MAX_ENUMERATED_PREFIXES} "
            "draft prefixes to enumerate; give q a smaller support"
        )
    reach = [1.0]
    # mass[prefix]: probability that the prefix was drafted and accepted.
    mass: dict[tuple[int, ...], float] = {(): 1.0}
    for i in range(n):
        law_i = {prefix: law_at(i, prefix) for prefix in mass}
        step: dict[tuple[int, ...], float] = {}
        for prefix, token in itertools.product(mass, supports[i]):
            accepted = min(float(q[i, token]), float(law_i[prefix][token]))
            if accepted > 0:
                step[(*prefix, token)] = mass[prefix] * accepted
        mass = step
        reach.append(sum(mass.values()))
    return reach


class ServingRowLaws:
    """The exact laws of one row kind of a serving case under one engine profile.

    Position ``i`` (``0..n``, n the row's drafts, ``n`` the bonus) emits a token following
    ``law(i, prefix)``: the profile's law on the served logits at i with the accepted prefix
    appended to the request's history. It depends on the prefix only when the request reads
    its history (:func:`reads_history`); laws are computed on demand and cached.

    Args:
        profile: the engine profile.
        case: the serving case.
        kind: the row kind's index in ``case.rows``.

    Attributes:
        row: the row kind.
        history_dependent: whether the laws depend on the prefix.
        reach: ``n + 1`` probabilities of reaching each position.
        acceptance: ``P(accept d_0)``, ``sum min(p'_0, q_0)`` (``p'_0(d_0)`` for a fixed draft),
            or None when the row drafts nothing.

    Raises:
        ValueError: what the profile raises, or what :func:`reach_probabilities` raises.
    """

    def __init__(self, profile: EngineProfile, case: ServingCase, kind: int) -> None:
        self.profile = profile
        self.row = case.rows[kind]
        self.logits = case.served_logits[kind]
        q = case.served_draft_probs
        self.draft_law = None if q is None else q[kind].to(torch.float64)
        self.history_dependent = reads_history(self.row.request)
        self._cache: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
        n = self.row.num_draft_tokens
        fixed = None if self.history_dependent else [self.law(i, ()) for i in range(n + 1)]
        self.reach = reach_probabilities(fixed, self.law, self.draft_law, self.row.drafts, n)
        self.acceptance: float | None = None
        if n:
            p0 = self.law(0, ())
            if self.draft_law is None:
                assert self.row.drafts is not None
                self.acceptance = float(p0[self.row.drafts[0]])
            else:
                self.acceptance = float(torch.minimum(p0, self.draft_law[0]).sum())

    def law(self, position: int, prefix: tuple[int, ...]) -> torch.Tensor:
        """``[V]`` float64: the law at ``position`` after the accepted ``prefix``."""
        key = (position, prefix if self.history_dependent else ())
        if key not in self._cache:
            history = [*self.row.request.output_token_ids, *key[1]]
            self._cache[key] = self.profile.law(self.logits[position], self.row.request, history)
        return self._cache[key]
