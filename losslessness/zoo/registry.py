"""The zoo's registry: every mutant and control by name, and :func:`mutant`, the lookup behind
``mutant/<name>`` targets (:func:`losslessness.targets.resolve_adapter`).

Importing it builds no case: an entry's case and adapter are built on its first use
(:class:`~losslessness.zoo.entry.Mutant`), so resolving one mutant builds that mutant's case
only, and a plain audit, which never names a mutant, builds none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from losslessness.adapters.base import AdapterNotFound
from losslessness.zoo.chain import CHAIN_ZOO, PRECISION_ZOO
from losslessness.zoo.entry import MUTANT_PREFIX, Mutant
from losslessness.zoo.seeds import seed_zoo
from losslessness.zoo.serving import serving_zoo
from losslessness.zoo.serving_tree import serving_tree_zoo
from losslessness.zoo.tree import TREE_ZOO


def _by_name(entries: Iterable[Mutant]) -> dict[str, Mutant]:
    """Entries by name, the lossy ones first (a stable sort keeps each group's order).

    Raises:
        RuntimeError: two entries share a name.
    """
    ordered = sorted(entries, key=lambda entry: not entry.lossy)
    zoo = {entry.name: entry for entry in ordered}
    if len(zoo) != len(ordered):
        raise RuntimeError("mutant names must be unique")
    return zoo


MUTANTS: Mapping[str, Mutant] = _by_name((*CHAIN_ZOO, *TREE_ZOO))
"""Every mutant by name: the lossy ones first, then the lossless controls (chain and greedy
entries before tree entries within each)."""

MUTANT_NAMES: tuple[str, ...] = tuple(MUTANTS)
"""The names of :data:`MUTANTS`, in its order."""

PRECISION_MUTANTS: Mapping[str, Mutant] = _by_name(PRECISION_ZOO)
"""The precision mutants (:data:`losslessness.zoo.chain.PRECISION_ZOO`) by name: kept out of
:data:`MUTANTS`, whose lossy entries the default audit must each catch; ``mutant/<name>``
resolves them too."""


SERVING_MUTANTS: Mapping[str, Mutant] = _by_name(
    (*serving_zoo(), *seed_zoo(), *serving_tree_zoo())
)
"""The serving entries (:mod:`losslessness.zoo.serving`, the seed-contract mutants of
:mod:`losslessness.zoo.seeds` and the serving tree entries of
:mod:`losslessness.zoo.serving_tree`) by name, for the profile
:data:`~losslessness.zoo.serving.ZOO_PROFILE`: kept out of :data:`MUTANTS`, whose lossy
entries the default audit (which has no serving battery) must each catch; ``mutant/<name>``
resolves them too."""


def mutant(name: str) -> Mutant:
    """The mutant called ``name`` (with or without the ``mutant/`` prefix).

    Raises:
        AdapterNotFound: no mutant has that name; the message lists the known ones.
    """
    key = name.removeprefix(MUTANT_PREFIX)
    if key in PRECISION_MUTANTS:
        return PRECISION_MUTANTS[key]
    if key in SERVING_MUTANTS:
        return SERVING_MUTANTS[key]
    if key not in MUTANTS:
        raise AdapterNotFound(
            f"{name!r}: no such mutant; known mutants: {', '.join(MUTANT_NAMES)}"
        )
    return MUTANTS[key]
