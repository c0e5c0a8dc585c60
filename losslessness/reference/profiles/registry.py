"""The engine profile protocol, its registry and :func:`position_laws` (re-exported by
:mod:`losslessness.reference.profiles`, which imports every engine module so that the registry
is full)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from losslessness.requests import Request

__all__ = ["PROFILES", "EngineProfile", "get_profile", "position_laws", "register"]


class EngineProfile(Protocol):
    """One engine's non-speculative sampling law.

    Attributes:
        name: the registry key (``vllm-v1``, ``sglang``, ``transformers``, ...).
        source: the engine version and the files and functions the law is read from.
    """

    @property
    def name(self) -> str:
        """The registry key."""
        ...

    @property
    def source(self) -> str:
        """The engine version, files and functions the law is read from."""
        ...

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution the engine samples one token from.

        Args:
            logits: ``[V]`` float target logits of one position (any float dtype; ``-inf``
                masks a token).
            request: the request's sampling parameters.
            history: the output tokens before this position (the request's
                ``output_token_ids`` followed by the accepted drafts).

        Returns:
            ``[V]`` float64, non-negative, summing to 1 within 1e-12; a greedy request
            (``temperature == 0``) gives the one-hot of the token the engine's argmax picks.

        Raises:
            ValueError: malformed logits, or a request naming a token outside the vocabulary.
            losslessness.requests.UnsupportedRequest: a field this engine does not implement.
        """
        ...


PROFILES: dict[str, EngineProfile] = {}
"""Profiles by name, filled by :func:`register` as their modules are imported."""


def register(profile: EngineProfile) -> EngineProfile:
    """Add ``profile`` to :data:`PROFILES` under its name.

    Raises:
        ValueError: a profile of that name is already registered.
    """
    if profile.name in PROFILES:
        raise ValueError(f"profile {profile.name!r} is registered twice")
    PROFILES[profile.name] = profile
    return profile


def get_profile(name: str) -> EngineProfile:
    """The profile called ``name``.

    Raises:
        ValueError: no such profile (the message lists the known ones).
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown engine profile {name!r}; known: {', '.join(sorted(PROFILES))}"
        ) from None


def position_laws(
    profile: EngineProfile, logits: torch.Tensor, request: Request, drafts: Sequence[int]
) -> torch.Tensor:
    """The law at each position of one verify step: position ``i`` sees the history
    ``request.output_token_ids + drafts[:i]`` (the drafts accepted before it).

    Args:
        profile: the engine's profile.
        logits: ``[k+1, V]`` float target logits of the step.
        request: the row's request.
        drafts: the ``k`` draft token ids of the row.

    Returns:
        ``[k+1, V]`` float64 laws (row ``k`` is the bonus position).

    Raises:
        ValueError: ``logits`` is not ``[k+1, V]`` for ``k = len(drafts)``, or what
            ``profile.law`` raises.
    """
    if logits.dim() != 2 or logits.shape[0] != len(drafts) + 1:
        raise ValueError(
            f"logits must have shape [k+1, V] with k = len(drafts) = {len(drafts)}, "
            f"got {tuple(logits.shape)}"
        )
    history = list(request.output_token_ids)
    laws = []
    for i in range(len(drafts) + 1):
        laws.append(profile.law(logits[i], request, history))
        if i < len(drafts):
            history.append(int(drafts[i]))
    return torch.stack(laws)
