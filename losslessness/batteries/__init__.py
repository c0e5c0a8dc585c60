"""The default audit's case batteries: chain, greedy, tree and greedy-tree cases, each built
deterministically from a fixed seed (so every case and its hash is the same on every machine).

- :mod:`~losslessness.batteries.chain`: :func:`default_chain_battery`, and
  :func:`chain_battery_at_vocab` (``--vocab-size``);
- :mod:`~losslessness.batteries.greedy`: :func:`default_greedy_battery`;
- :mod:`~losslessness.batteries.tree`: :func:`default_tree_battery`,
  :func:`default_greedy_tree_battery` and the tree plan's cap :data:`TREE_CI_MAX_STEPS`;
- :mod:`~losslessness.batteries.serving`: :func:`default_serving_battery` (serving targets)
  and its cap :data:`SERVING_CI_MAX_STEPS`;
- :mod:`~losslessness.batteries.builders`: the steps every case builder shares (the mutant
  zoo's included).
"""

from losslessness.batteries.chain import (
    BATTERY_SEED,
    chain_battery_at_vocab,
    default_chain_battery,
)
from losslessness.batteries.greedy import default_greedy_battery
from losslessness.batteries.serving import (
    SERVING_BATTERY_SEED,
    SERVING_CI_MAX_STEPS,
    default_serving_battery,
)
from losslessness.batteries.tree import (
    TREE_BATTERY_SEED,
    TREE_CI_MAX_STEPS,
    default_greedy_tree_battery,
    default_tree_battery,
)

__all__ = [
    "BATTERY_SEED",
    "SERVING_BATTERY_SEED",
    "SERVING_CI_MAX_STEPS",
    "TREE_BATTERY_SEED",
    "TREE_CI_MAX_STEPS",
    "chain_battery_at_vocab",
    "default_chain_battery",
    "default_greedy_battery",
    "default_greedy_tree_battery",
    "default_serving_battery",
    "default_tree_battery",
]
