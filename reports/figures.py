"""Figures of an audit for the HTML report, as self-contained PNG data URIs (matplotlib Agg).

Per target:

- **law**: for a bounded number of (case, row) pairs (failures first, then an even sample),
  one panel per position: target p_i (bars) against the empirical frequencies with
  Clopper-Pearson bands. A band's level is 1 - alpha / cells (Bonferroni over the cells
  shown, alpha the check's per-assertion level), so all of a panel's bands cover the true
  frequencies at once with probability >= 1 - alpha: a bar outside its band is significant at
  the check's own level. Cells are the kept ones of ``details`` (largest p first, at most
  :data:`losslessness.checks.conditional_law.LAW_CELLS_KEPT`) plus "other".
- **p-value QQ**: -log10 of the statistical checks' sorted p-values against uniform quantiles,
  with a pointwise 95% band from the uniform order statistics' Beta laws and the
  per-assertion rejection threshold. A correct target stays on the diagonal.
- **acceptance**: observed acceptance rate against sum min(p, q) with Clopper-Pearson
  intervals at the check's level, and the difference observed - expected: above zero is
  impossible for a lossless verifier (LOSSY), below is SUBOPTIMAL.
- **minimum detectable TV** per check against the design TV.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot global state).
Every target name, case id and summary in a title or label is :func:`reports.text.plot_text`
(no mathtext, control characters visible).
"""

from __future__ import annotations

import base64
import io
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from losslessness.checks.ids import (
    ACCEPTANCE_CHECK_ID,
    EDGE_DISJOINT_CHECK_ID,
    EDGE_ONE_HOT_CHECK_ID,
    EDGE_P_EQUALS_Q_CHECK_ID,
    LAW_CHECK_ID,
)
from losslessness.results import AuditResult, CheckKind, CheckResult, TargetResult, Verdict
from reports.style import MAX_LAW_FIGURES, MAX_LAW_FIGURES_TOTAL, VERDICT_COLORS
from reports.text import plot_text

DPI = 100
"""Resolution of the embedded PNGs."""

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
"""Marker per check id (cycled with the colours, so that more than ten ids stay distinct)."""

_LAW_CHECK_IDS = (LAW_CHECK_ID, EDGE_ONE_HOT_CHECK_ID)
_ACCEPTANCE_CHECK_IDS = (ACCEPTANCE_CHECK_ID, EDGE_DISJOINT_CHECK_ID, EDGE_P_EQUALS_Q_CHECK_ID)
_TICK_LABEL_CELLS = 16


@dataclass(frozen=True)
class Figure:
    """One rendered figure.

    Attributes:
        title: short heading.
        caption: what is plotted and how to read it.
        data_uri: ``data:image/png;base64,...``.
    """

    title: str
    caption: str
    data_uri: str


def _data_uri(figure: MplFigure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _band_alpha(check: CheckResult, fallback: float) -> float:
    """The check's level; exact checks (level 0) use the run's per-assertion level."""
    return check.alpha if check.alpha > 0 else fallback


def has_cells(check: CheckResult) -> bool:
    """Whether ``check`` carries the per-cell counts a law panel needs."""
    return check.cells is not None and check.n > 0


def law_groups(target: TargetResult, limit: int = MAX_LAW_FIGURES) -> list[list[CheckResult]]:
    """The law checks to plot, grouped by (case, row): failing groups first, then an even
    sample of the others, at most ``limit`` groups (each sorted by position).

    Raises:
        ValueError: ``limit`` is negative.
    """
    if limit < 0:
        raise ValueError(f"limit: must be >= 0, got {limit}")
    groups: dict[tuple[str, int | None], list[CheckResult]] = {}
    for check in target.checks:
        if check.check_id in _LAW_CHECK_IDS and has_cells(check):
            groups.setdefault((check.case_id, check.row), []).append(check)
    ordered = [sorted(group, key=lambda c: c.position or 0) for group in groups.values()]
    failing = [g for g in ordered if any(c.verdict is not Verdict.PASS for c in g)]
    passing = [g for g in ordered if all(c.verdict is Verdict.PASS for c in g)]
    chosen = failing[:limit]
    room = limit - len(chosen)
    if room > 0 and passing:
        picks = np.unique(np.linspace(0, len(passing) - 1, min(room, len(passing))).round())
        chosen += [passing[int(index)] for index in picks]
    return chosen


def _law_panel(ax: Axes, check: CheckResult, band_alpha: float) -> None:
    cells = check.cells
    assert cells is not None
    observed = list(cells.observed)
    p = list(cells.p)
    labels = [str(token) for token in cells.tokens]
    if cells.other_p > 0 or cells.other_observed > 0:
        observed.append(cells.other_observed)
        p.append(cells.other_p)
        labels.append("other")
    counts = np.asarray(observed, dtype=np.int64)
    total = int(counts.sum())
    x = np.arange(len(counts))
    low, high = proportion_confint(
        counts, max(total, 1), alpha=band_alpha / len(counts), method="beta"
    )
    empirical = counts / max(total, 1)
    ax.bar(x, p, color="#90caf9", width=0.8, label="target p")
    ax.errorbar(
        x,
        empirical,
        yerr=[empirical - np.asarray(low), np.asarray(high) - empirical],
        fmt="o",
        markersize=3,
        color=VERDICT_COLORS[check.verdict],
        ecolor="#424242",
        elinewidth=0.9,
        capsize=2,
        label="empirical (band)",
    )
    if len(labels) <= _TICK_LABEL_CELLS:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=90 if len(labels) > 8 else 0, fontsize=8)
        ax.set_xlabel("token")
    else:
        other = " (last: other)" if labels[-1] == "other" else ""
        ax.set_xlabel(f"{len(labels)} cells by decreasing p{other}")
    p_text = "-" if check.p_value is None else f"{check.p_value:.2g}"
    ax.set_title(
        f"pos {check.position}: n={check.n}, p-value {p_text}\n{check.verdict.value}",
        fontsize=9,
        color=VERDICT_COLORS[check.verdict],
    )
    ax.tick_params(labelsize=8)
    ax.set_ylim(bottom=0)


def law_figure(checks: Sequence[CheckResult], fallback_alpha: float) -> Figure:
    """Empirical vs target law at every position of one (case, row).

    Args:
        checks: law checks of one case and row, by position, each with cell counts.
        fallback_alpha: band level for exact checks (their own level is 0).

    Returns:
        :class:`Figure`.

    Raises:
        ValueError: ``checks`` is empty or lacks cell counts.
    """
    if not checks or not all(has_cells(check) for check in checks):
        raise ValueError("checks: need one or more law checks with cell counts in details")
    first = checks[0]
    width = max(5.5, 3.3 * len(checks) + 0.6)
    figure = MplFigure(figsize=(width, 3.5), layout="constrained")
    axes = figure.subplots(1, len(checks), squeeze=False)[0]
    for ax, check in zip(axes, checks, strict=True):
        _law_panel(ax, check, _band_alpha(check, fallback_alpha))
    axes[0].set_ylabel("probability")
    axes[0].legend(fontsize=7, loc="upper right")
    row = f" row {first.row}" if first.n_rows > 1 else ""
    summary = textwrap.shorten(first.case_summary, width=int(width * 13), placeholder="...")
    figure.suptitle(
        plot_text(f"{first.target}: {first.case_id}{row}") + "\n" + plot_text(summary),
        fontsize=10,
    )
    return Figure(
        title=f"law: {first.case_id}{row}",
        caption=(
            "Bars: target p_i; points: empirical frequency of the emitted token among steps "
            "reaching position i, with Clopper-Pearson bands simultaneous over the cells shown "
            "at the check's level. Position k of a case (draft length k) is the bonus token."
        ),
        data_uri=_data_uri(figure),
    )


def _qq_points(target: TargetResult) -> tuple[np.ndarray, list[CheckResult]]:
    usable = [
        check
        for check in target.checks
        if check.kind is CheckKind.STATISTICAL
        and check.p_value is not None
        and check.verdict not in (Verdict.ERROR, Verdict.SKIPPED)
    ]
    usable.sort(key=lambda check: check.p_value or 0.0)
    return np.array([check.p_value for check in usable], dtype=np.float64), usable


def pvalue_qq_figure(target: TargetResult, per_assertion_alpha: float) -> Figure | None:
    """QQ plot of the target's statistical p-values against the uniform law, or None when
    it has fewer than two."""
    pvalues, checks = _qq_points(target)
    m = pvalues.size
    if m < 2:
        return None
    ranks = np.arange(1, m + 1)
    expected = ranks / (m + 1)
    band_low = stats.beta.ppf(0.975, ranks, m - ranks + 1)
    band_high = stats.beta.ppf(0.025, ranks, m - ranks + 1)
    floor = 1e-300
    figure = MplFigure(figsize=(5.2, 4.4), layout="constrained")
    ax = figure.subplots()
    x = -np.log10(expected)
    ax.fill_between(x, -np.log10(band_low), -np.log10(band_high), color="#e0e0e0", label="95% band")
    top = float(x.max()) * 1.05
    ax.plot([0, top], [0, top], color="#757575", linewidth=0.8)
    ax.axhline(
        -math.log10(per_assertion_alpha),
        color=VERDICT_COLORS[Verdict.LOSSY],
        linestyle="--",
        linewidth=0.9,
        label=f"alpha {per_assertion_alpha:.2g}",
    )
    for index, check_id in enumerate(sorted({check.check_id for check in checks})):
        chosen = [i for i, check in enumerate(checks) if check.check_id == check_id]
        ax.scatter(
            x[chosen],
            -np.log10(np.maximum(pvalues[chosen], floor)),
            s=14,
            marker=_MARKERS[index % len(_MARKERS)],
            label=plot_text(check_id),
            zorder=3,
        )
    ax.set_xlabel("-log10 expected p-value (uniform)")
    ax.set_ylabel("-log10 observed p-value")
    ax.set_title(plot_text(target.name) + f": p-values of {m} statistical checks", fontsize=10)
    ax.legend(fontsize=8)
    return Figure(
        title="p-value QQ plot",
        caption=(
            "A correct target's p-values follow the uniform law: points stay near the diagonal "
            "and inside the grey pointwise 95% band. Points above the dashed line are "
            "rejections at the per-assertion level."
        ),
        data_uri=_data_uri(figure),
    )


def acceptance_figure(target: TargetResult, fallback_alpha: float) -> Figure | None:
    """Observed acceptance rate vs sum min(p, q) with Clopper-Pearson intervals, or None
    when the target has no acceptance checks with samples."""
    checks = [
        check
        for check in target.checks
        if check.check_id in _ACCEPTANCE_CHECK_IDS
        and check.n > 0
        and check.acceptance is not None
    ]
    if not checks:
        return None
    counts = [check.acceptance for check in checks if check.acceptance is not None]
    expected = np.array([c.expected_rate for c in counts], dtype=np.float64)
    accepted = np.array([c.accepted for c in counts], dtype=np.int64)
    n = np.array([check.n for check in checks], dtype=np.int64)
    levels = np.array([_band_alpha(check, fallback_alpha) for check in checks])
    low, high = proportion_confint(accepted, n, alpha=levels, method="beta")
    observed = accepted / n
    colors = [VERDICT_COLORS[check.verdict] for check in checks]
    figure = MplFigure(figsize=(10, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    left.plot([0, 1], [0, 1], color="#757575", linewidth=0.8)
    right.axhline(0, color="#757575", linewidth=0.8)
    for index in range(len(checks)):
        bounds = [[observed[index] - low[index]], [high[index] - observed[index]]]
        for ax, y in ((left, observed[index]), (right, observed[index] - expected[index])):
            ax.errorbar(
                [expected[index]],
                [y],
                yerr=bounds,
                fmt="o",
                markersize=4,
                color=colors[index],
                elinewidth=0.9,
                capsize=2,
            )
    left.set_xlabel("sum min(p, q) (exact)")
    left.set_ylabel("observed acceptance rate")
    left.set_xlim(-0.02, 1.02)
    left.set_ylim(-0.02, 1.02)
    right.set_xlabel("sum min(p, q) (exact)")
    right.set_ylabel("observed - sum min(p, q)")
    for y, va, verdict, side in (
        (0.97, "top", Verdict.LOSSY, "above"),
        (0.03, "bottom", Verdict.SUBOPTIMAL, "below"),
    ):
        right.text(
            0.02,
            y,
            f"{side} 0: {verdict.value}",
            transform=right.transAxes,
            va=va,
            fontsize=8,
            color=VERDICT_COLORS[verdict],
        )
    figure.suptitle(
        plot_text(target.name) + f": acceptance at {len(checks)} draft positions", fontsize=10
    )
    return Figure(
        title="acceptance rate vs sum min(p, q)",
        caption=(
            "Each point is one draft position of one case; bars are Clopper-Pearson intervals "
            "at the check's level. Colour is the verdict."
        ),
        data_uri=_data_uri(figure),
    )


def min_detectable_tv_figure(target: TargetResult, design_tv: float) -> Figure | None:
    """Minimum detectable TV of every check with a finite one, by case, against the design
    TV; None when there is none."""
    checks = [
        check
        for check in target.checks
        if math.isfinite(check.min_detectable_tv)
        and check.min_detectable_tv > 0
        and check.verdict not in (Verdict.ERROR, Verdict.SKIPPED)
    ]
    if not checks:
        return None
    cases = list(dict.fromkeys(check.case_id for check in checks))
    figure = MplFigure(figsize=(8, 1.2 + 0.32 * len(cases)), layout="constrained")
    ax = figure.subplots()
    for offset, check_id in enumerate(sorted({check.check_id for check in checks})):
        chosen = [check for check in checks if check.check_id == check_id]
        ax.scatter(
            [check.min_detectable_tv for check in chosen],
            [cases.index(check.case_id) + 0.12 * (offset % 3 - 1) for check in chosen],
            s=16,
            marker=_MARKERS[offset % len(_MARKERS)],
            label=plot_text(check_id),
            zorder=3,
        )
    ax.axvline(design_tv, color="#424242", linestyle="--", linewidth=0.9, label="design TV")
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([plot_text(case, 60) for case in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("minimum detectable TV at the n used (log scale)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(axis="x", color="#eeeeee")
    figure.suptitle(plot_text(target.name) + ": power of every check", fontsize=10)
    return Figure(
        title="minimum detectable TV per check",
        caption=(
            f"Left of the dashed line (design TV {design_tv:g}): the check detects smaller "
            "violations than designed. For acceptance the value is the smallest shift of the "
            "rate, for exact checks the smallest per-sample violation rate, detected with the "
            "design power."
        ),
        data_uri=_data_uri(figure),
    )


def report_figures(
    result: AuditResult,
    max_law_figures: int = MAX_LAW_FIGURES,
    max_law_figures_total: int = MAX_LAW_FIGURES_TOTAL,
) -> list[list[Figure]]:
    """Every target's figures, in ``result.targets`` order: QQ, acceptance, minimum
    detectable TV, then law figures: at most ``max_law_figures`` per target and
    ``max_law_figures_total`` in all, failing (case, row) pairs of every target first.

    Raises:
        ValueError: a limit is negative.
    """
    if max_law_figures_total < 0:
        raise ValueError(f"max_law_figures_total: must be >= 0, got {max_law_figures_total}")
    alpha = result.per_assertion_alpha
    groups = [law_groups(target, max_law_figures) for target in result.targets]
    ranked = sorted(
        ((index, rank) for index, chosen in enumerate(groups) for rank in range(len(chosen))),
        key=lambda pair: (
            all(check.verdict is Verdict.PASS for check in groups[pair[0]][pair[1]]),
            pair[1],
            pair[0],
        ),
    )
    kept = set(ranked[:max_law_figures_total])
    figures = []
    for index, target in enumerate(result.targets):
        summary = [
            pvalue_qq_figure(target, alpha),
            acceptance_figure(target, alpha),
            min_detectable_tv_figure(target, result.config.tv),
        ]
        laws = [
            law_figure(group, alpha)
            for rank, group in enumerate(groups[index])
            if (index, rank) in kept
        ]
        figures.append([figure for figure in summary if figure is not None] + laws)
    return figures
