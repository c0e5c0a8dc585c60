"""What the audit calls: an :class:`Adapter` wraps an implementation into the protocols."""

from __future__ import annotations

from dataclasses import dataclass

from losslessness.protocol import ChainVerifier, GreedyVerifier


class AdapterUnavailable(RuntimeError):
    """The adapter's implementation cannot be loaded here (package missing, API not found)."""


class AdapterNotFound(LookupError):
    """No adapter, entry point or ``pkg.module:callable`` matches the requested name."""


@dataclass(frozen=True)
class Adapter:
    """An implementation under audit, in the protocols of :mod:`losslessness.protocol`.

    Attributes:
        name: how the audit reports it (``reference``, ``transformers``, ``pkg.mod:fn``).
        description: what exactly is wrapped (package, version, function, conventions).
        chain: the chain sampling verifier, or None if the implementation has none.
        greedy: the greedy verifier, or None.
    """

    name: str
    description: str
    chain: ChainVerifier | None = None
    greedy: GreedyVerifier | None = None

    def __post_init__(self) -> None:
        if self.chain is None and self.greedy is None:
            raise ValueError(f"adapter {self.name!r}: needs a chain or a greedy verifier")
