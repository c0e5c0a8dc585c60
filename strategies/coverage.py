"""How often the strategies reach each named regime, relation, dtype and sampling filter.

Every strategy here reports what it drew with ``hypothesis.event`` (``"regime=dense"``,
``"relation=near"``, ``"dtype=float16"``, ...), which Hypothesis shows with
``pytest --hypothesis-show-statistics``. :func:`recording_labels` also hands those labels to
Python code, and :func:`label_frequencies` draws a fixed number of examples from a strategy with
a fixed seed and counts them, so a test can assert that every regime is reached and a script
(``benchmarks/strategy_coverage.py``) can print the frequencies.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies._common import check_int, recording_labels

__all__ = ["LabelFrequencies", "label_frequencies", "recording_labels"]


@dataclass(frozen=True)
class LabelFrequencies:
    """Labels reported while drawing ``examples`` examples from one strategy.

    Attributes:
        examples: number of examples drawn to completion.
        examples_with: label -> number of examples that reported it at least once.
        reports: label -> number of times it was reported (a chain case reports one regime
            per vector, so this counts vectors and pairs).
    """

    examples: int
    examples_with: Counter[str] = field(default_factory=Counter)
    reports: Counter[str] = field(default_factory=Counter)

    def share_of_examples(self, label: str) -> float:
        """Fraction of the examples that reported ``label`` at least once."""
        return self.examples_with[label] / self.examples if self.examples else 0.0

    def share_of_reports(self, label: str, prefix: str) -> float:
        """``label``'s share among all reports whose label starts with ``prefix``."""
        total = sum(count for name, count in self.reports.items() if name.startswith(prefix))
        return self.reports[label] / total if total else 0.0

    def table(self, prefix: str) -> list[tuple[str, int, float, int, float]]:
        """Rows ``(label, examples_with, share_of_examples, reports, share_of_reports)`` for
        the labels starting with ``prefix``, most frequent first."""
        names = sorted(
            (name for name in self.reports if name.startswith(prefix)),
            key=lambda name: (-self.reports[name], name),
        )
        return [
            (
                name,
                self.examples_with[name],
                self.share_of_examples(name),
                self.reports[name],
                self.share_of_reports(name, prefix),
            )
            for name in names
        ]


def label_frequencies(
    strategy: SearchStrategy[Any], *, examples: int = 200, seed_value: int = 0
) -> LabelFrequencies:
    """Draw ``examples`` examples of ``strategy`` (generate phase only, fixed seed, no
    database, no deadline, health checks off) and count the labels they report.

    Args:
        strategy: any strategy built from :mod:`strategies`.
        examples: ``max_examples``, an int ``>= 1``.
        seed_value: the Hypothesis seed (same seed, same code: same examples, same counts).

    Returns:
        The :class:`LabelFrequencies`.

    Raises:
        hypothesis.errors.InvalidArgument: naming ``examples`` or ``seed_value``.
    """
    n_examples = check_int(examples, "examples", 1)
    fixed_seed = check_int(seed_value, "seed_value", 0)
    result = LabelFrequencies(examples=0)
    drawn = 0

    @seed(fixed_seed)
    @settings(
        max_examples=n_examples,
        derandomize=False,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def draw_examples(data: st.DataObject) -> None:
        nonlocal drawn
        with recording_labels() as labels:
            data.draw(strategy)
        drawn += 1
        result.examples_with.update(set(labels))
        result.reports.update(labels)

    draw_examples()
    return LabelFrequencies(drawn, result.examples_with, result.reports)
