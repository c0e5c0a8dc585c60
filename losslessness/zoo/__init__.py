"""The mutant zoo: verifiers with the mechanism of a real, publicly reported bug put back
(and lossless controls), with which the project measures the audit's power.

- :mod:`~losslessness.zoo.chain`: chain and greedy mutants and controls (and the precision
  mutants);
- :mod:`~losslessness.zoo.tree`: tree and greedy-tree mutants and controls;
- :mod:`~losslessness.zoo.steps`: the steps both share;
- :mod:`~losslessness.zoo.entry`: :class:`Mutant`, one entry;
- :mod:`~losslessness.zoo.registry`: :data:`MUTANTS` and :func:`mutant`, the lookup behind
  ``mutant/<name>`` targets; cases are built on first use.
"""

from losslessness.zoo.entry import MUTANT_PREFIX, Mutant
from losslessness.zoo.registry import MUTANT_NAMES, MUTANTS, PRECISION_MUTANTS, mutant

__all__ = ["MUTANTS", "MUTANT_NAMES", "MUTANT_PREFIX", "PRECISION_MUTANTS", "Mutant", "mutant"]
