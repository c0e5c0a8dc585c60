"""What the HTML report and its figures share without importing matplotlib: the verdict
colours and the default number of law figures (the CLI imports :mod:`reports.html` at start-up,
and matplotlib costs each process about 0.7 s to import; the figures import it only when a
report is rendered)."""

from __future__ import annotations

from losslessness.results import Verdict

VERDICT_COLORS = {
    Verdict.PASS: "#2e7d32",
    Verdict.LOSSY: "#c62828",
    Verdict.SUBOPTIMAL: "#ef6c00",
    Verdict.ERROR: "#8e24aa",
    Verdict.SKIPPED: "#9e9e9e",
    Verdict.IRREPRODUCIBLE: "#00838f",
}
"""Colour of each verdict in every figure (and the HTML's CSS)."""

MAX_LAW_FIGURES = 4
"""Law figures per target by default: failing (case, row) pairs first, then an even sample."""

MAX_LAW_FIGURES_TOTAL = 12
"""Law figures in a whole report by default (each costs about 0.2 s and 60 kB)."""
