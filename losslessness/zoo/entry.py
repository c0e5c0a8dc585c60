"""One entry of the mutant zoo: a verifier with its protocol, mechanism, source and case."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from losslessness.adapters.base import Adapter
from losslessness.cases import ChainCase, GreedyCase, GreedyTreeCase, ServingCase, TreeCase
from losslessness.protocol import (
    PROTOCOLS,
    ChainVerifier,
    GreedyTreeVerifier,
    GreedyVerifier,
    ServingTreeVerifier,
    ServingVerifier,
    TreeVerifier,
)

MUTANT_PREFIX = "mutant/"
"""Target names starting with this resolve to a mutant (``mutant/<name>``)."""

ZooCase = ChainCase | GreedyCase | TreeCase | GreedyTreeCase | ServingCase
"""A case on which a mutant's mechanism acts, in the mutant's protocol."""

ZooVerifier = (
    ChainVerifier | GreedyVerifier | TreeVerifier | GreedyTreeVerifier | ServingVerifier
    | ServingTreeVerifier
)
"""A mutant's verifier, in one of the protocols of :mod:`losslessness.protocol`."""


@dataclass(frozen=True)
class Mutant:
    """One entry of the zoo. Its case and adapter are built on first use (cached), so listing
    or importing the zoo builds no case.

    Attributes:
        name: kebab-case, unique (``residual-clamped-1e-5``; tree entries ``tree-<name>``).
        verifier: the verifier function, in ``protocol``.
        protocol: ``chain``, ``greedy``, ``tree``, ``greedy-tree``, ``serving`` or
            ``serving-tree`` (:data:`losslessness.protocol.PROTOCOLS`).
        lossy: False for the lossless controls.
        mechanism: one line: what is wrong (for a control: why it is still lossless).
        source: URL of the bug report, PR, issue or code the mechanism comes from.
        build_case: builds :attr:`case` (deterministic: the same tensors on every machine).
        engine_profile: the engine profile a ``serving`` or ``serving-tree`` entry claims,
            else None.
        irreproducible: a ``serving`` entry whose seeded rows change with their batch (its law
            is right: ``lossy`` is False, and the audit's verdict is IRREPRODUCIBLE).

    Raises:
        ValueError: naming ``protocol``, when it is not one of
            :data:`~losslessness.protocol.PROTOCOLS`.
    """

    name: str
    verifier: ZooVerifier
    protocol: str
    lossy: bool
    mechanism: str
    source: str
    build_case: Callable[[], ZooCase] = field(repr=False, compare=False)
    engine_profile: str | None = None
    irreproducible: bool = False

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol: must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}"
            )

    @functools.cached_property
    def case(self) -> ZooCase:
        """One case, typical of real use, where the mechanism acts (for a lossy mutant its
        law, acceptance or output differs from the reference there)."""
        return self.build_case()

    @functools.cached_property
    def adapter(self) -> Adapter:
        """The :class:`~losslessness.adapters.base.Adapter` named ``mutant/<name>``, with the
        verifier in its protocol's slot; its description gives the kind, protocol, mechanism
        and source."""
        kind = "lossless control" if not self.lossy else "lossy mutant"
        if self.irreproducible:
            kind = "seed-contract mutant"
        protocol = self.protocol.replace("-", " ")
        return Adapter(
            name=MUTANT_PREFIX + self.name,
            description=f"{kind} ({protocol} protocol): {self.mechanism} [{self.source}]",
            chain=self.verifier if self.protocol == "chain" else None,  # type: ignore[arg-type]
            greedy=self.verifier if self.protocol == "greedy" else None,  # type: ignore[arg-type]
            tree=self.verifier if self.protocol == "tree" else None,  # type: ignore[arg-type]
            greedy_tree=(
                self.verifier if self.protocol == "greedy-tree" else None  # type: ignore[arg-type]
            ),
            serving=self.verifier if self.protocol == "serving" else None,  # type: ignore[arg-type]
            serving_tree=(
                self.verifier if self.protocol == "serving-tree" else None  # type: ignore[arg-type]
            ),
            engine_profile=self.engine_profile,
        )
