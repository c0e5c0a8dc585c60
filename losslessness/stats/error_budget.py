"""Error budget: one family-wise false-alarm rate per run, split over its statistical assertions.

Contract: if every assertion is run at :attr:`ErrorBudget.per_assertion_alpha`, a correct
implementation fails *any* of the ``n_assertions`` assertions with probability at most
``family_wise_alpha``. Exact checks (zero-mass, structure, greedy equality) never fire on correct
code and take no share of the budget.

References:
    Bonferroni, C. E. (1936). Teoria statistica delle classi e calcolo delle probabilita.
    Pubblicazioni del R. Istituto Superiore di Scienze Economiche e Commerciali di Firenze 8.
    (The union bound: P(any false alarm) <= sum of the per-assertion levels.)
"""

from __future__ import annotations

from dataclasses import dataclass

from losslessness.stats.validation import check_nonnegative_int, check_open_unit_interval

__all__ = ["DEFAULT_FAMILY_WISE_ALPHA", "SUITE_FAMILY_WISE_ALPHA", "ErrorBudget"]

DEFAULT_FAMILY_WISE_ALPHA = 1e-3
"""Default probability that a run on a correct implementation reports any false alarm."""

SUITE_FAMILY_WISE_ALPHA = 1e-3
"""Probability that a correct verifier fails any statistical assertion of one property-suite
run (:mod:`losslessness.suite`); a night's bound adds it once per suite run."""


@dataclass(frozen=True)
class ErrorBudget:
    """Bonferroni split of a family-wise false-alarm rate over ``n_assertions`` assertions.

    Attributes:
        n_assertions: number of statistical assertions in the run, integer ``>= 1``.
        family_wise_alpha: probability of any false alarm in the run, in (0, 1).

    Raises:
        ValueError: on construction, naming ``n_assertions`` (not an integer ``>= 1``) or
            ``family_wise_alpha`` (outside (0, 1)).

    Notes:
        Bonferroni (1936). The union bound holds under *any* dependence between the assertions,
        which matters here because checks share samples (the per-position identity tests and
        the acceptance test read the same verification steps).
    """

    n_assertions: int
    family_wise_alpha: float = DEFAULT_FAMILY_WISE_ALPHA

    def __post_init__(self) -> None:
        count = check_nonnegative_int(self.n_assertions, "n_assertions")
        if count < 1:
            raise ValueError(f"n_assertions: must be >= 1, got {count}")
        check_open_unit_interval(self.family_wise_alpha, "family_wise_alpha")

    @property
    def per_assertion_alpha(self) -> float:
        """``family_wise_alpha / n_assertions``: the level each assertion runs at (Bonferroni)."""
        return float(self.family_wise_alpha) / int(self.n_assertions)

    def rejects(self, pvalue: float) -> bool:
        """Whether ``pvalue`` is significant at the per-assertion level: ``pvalue <= alpha``.

        Args:
            pvalue: a p-value in [0, 1].

        Raises:
            ValueError: naming ``pvalue`` when it is NaN or outside [0, 1].
        """
        value = float(pvalue)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"pvalue: must lie in [0, 1], got {value!r}")
        return value <= self.per_assertion_alpha
