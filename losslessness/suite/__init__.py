"""The property suite that runs on someone else's verifier, in their own CI.

``pytest --losslessness-target=pkg.module:verify [--losslessness-greedy=pkg.module:fn]`` (the
plugin in :mod:`losslessness.pytest_plugin`) collects the test modules of this package and runs
them against that target; ``--losslessness-tree=pkg.module:fn`` (a tree verifier) and
``--losslessness-tree-greedy=pkg.module:fn`` (a greedy tree verifier) add the tree module
(``test_tree.py``); ``--losslessness-protocol=serving`` makes ``--losslessness-target`` a
serving verifier and adds the serving module (``test_serving.py``), checked against the engine
profile of ``--losslessness-engine-profile`` or the function's ``engine_profile``. Hypothesis
chooses the cases from :mod:`strategies`; the samples of a case come from generators seeded
from the case's content hash, so a failure replays exactly.

Statistical soundness under Hypothesis
--------------------------------------
Hypothesis examples are not independent samples: the generate phase steers towards new code
paths, and after a failure the shrinker re-runs variations of the failing case. The suite's
false-alarm rate does not rely on their independence:

- the *budget* is a union bound. The suite makes at most ``max_examples`` generated examples
  per test (the active profile's), each with a fixed maximum number of statistical assertions
  (:data:`CHAIN_ASSERTIONS_PER_EXAMPLE` for the chain test, :data:`TREE_ASSERTIONS_PER_EXAMPLE`
  for the tree test, :data:`SERVING_ASSERTIONS_PER_EXAMPLE` for the serving test), and the
  explicit witness examples theirs; Bonferroni splits the family-wise rate
  :data:`losslessness.stats.SUITE_FAMILY_WISE_ALPHA`
  over ``max_examples x`` the tree test's plus the larger of the chain and serving tests'
  (:data:`SUITE_ASSERTIONS_PER_EXAMPLE`: a run collects the chain or the serving module, never
  both), whichever of the tests a run collects, which holds under any dependence between the
  examples, however Hypothesis picked them;
- each *assertion* is valid whatever case it is given: given the case, its samples come from a
  generator seeded by the case's hash, independent of how the case was chosen, so the
  probability that a correct verifier fails it is at most the per-assertion level;
- *shrinking* only starts after a failure (it cannot turn a pass into a failure), and re-runs
  of the same case reuse the same seed, so the shrunk case fails for the same reason;
- under the ``ci`` profile Hypothesis is derandomised: the same cases every run, so the suite
  is deterministic; its budget bounds the probability that a correct verifier is unlucky on
  this fixed set.
"""

from losslessness.suite.support import (
    CHAIN_ASSERTIONS_PER_EXAMPLE,
    MAX_BATCH,
    MAX_K,
    MAX_VOCAB,
    SERVING_ASSERTIONS_PER_EXAMPLE,
    SMALL_VOCAB,
    STEPS_PER_ROW,
    SUITE_ASSERTIONS_PER_EXAMPLE,
    TREE_ASSERTIONS_PER_EXAMPLE,
    TREE_LAW_CLASSES,
    SuiteBudget,
    suite_budget,
)

__all__ = [
    "CHAIN_ASSERTIONS_PER_EXAMPLE",
    "MAX_BATCH",
    "MAX_K",
    "MAX_VOCAB",
    "SERVING_ASSERTIONS_PER_EXAMPLE",
    "SMALL_VOCAB",
    "STEPS_PER_ROW",
    "SUITE_ASSERTIONS_PER_EXAMPLE",
    "TREE_ASSERTIONS_PER_EXAMPLE",
    "TREE_LAW_CLASSES",
    "SuiteBudget",
    "suite_budget",
]
