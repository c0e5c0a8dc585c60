"""``losslessness speedup``: the speedup model's numbers for one (alpha, k, c), and its curves."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.console import Console
from rich.table import Table

from losslessness.theory import (
    expected_tokens_per_verify,
    marginal_value,
    optimal_k,
    speedup,
    tokens_per_verify_ceiling,
)

PLOT_ALPHAS = (0.3, 0.5, 0.7, 0.9)
"""Acceptance rates drawn by ``--plot`` besides the requested one."""

PLOT_COST = 0.3
"""Second draft cost drawn by ``--plot`` (dashed): an expensive drafter, where speculation
with a weak one stops paying."""


def plot_speedup_curves(
    path: str, alphas: Sequence[float], costs: Sequence[float], max_k: int
) -> None:
    """Save speedup versus k (0..max_k) for every (alpha, c) to ``path`` (format from the
    suffix, matplotlib's Agg backend: no display needed). One colour per alpha, one line
    style per cost; the optimum of each curve is marked and speedup 1 drawn as a reference.

    Raises:
        ValueError: from :func:`losslessness.theory.speedup` for an out-of-range alpha or c.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    ks = list(range(max_k + 1))
    styles = ["-", "--", ":", "-."]
    for colour, alpha in enumerate(alphas):
        for index, cost in enumerate(costs):
            values = [speedup(alpha, k, cost) for k in ks]
            best = optimal_k(alpha, cost, max_k)
            axes.plot(
                ks,
                values,
                linestyle=styles[index % len(styles)],
                color=f"C{colour}",
                label=f"alpha={alpha:g}, c={cost:g}",
            )
            axes.plot([best], [values[best]], marker="o", color=f"C{colour}")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("draft length k")
    axes.set_ylabel("speedup = E[tokens/verify] / (k c + 1)")
    axes.set_title("Speculative decoding speedup model (dots: optimal k)")
    axes.legend(fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


@click.command(name="speedup")
@click.option(
    "--alpha",
    type=click.FloatRange(0.0, 1.0),
    required=True,
    help="Per-token acceptance rate alpha = E[sum min(p, q)].",
)
@click.option("--k", "k", type=click.IntRange(min=0), required=True, help="Draft length k.")
@click.option(
    "--c",
    "c",
    type=click.FloatRange(min=0.0),
    required=True,
    help="Cost of one draft token, in target forward passes.",
)
@click.option(
    "--max-k",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Largest k searched for the optimum and plotted.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Save speedup-vs-k curves (alpha 0.3/0.5/0.7/0.9 and --alpha; --c and c=0.3).",
)
def speedup_command(alpha: float, k: int, c: float, max_k: int, plot_path: str | None) -> None:
    """Print the speedup model for ALPHA, K, C: tokens per verify, speedup, the optimal k
    (0: speculation loses), the marginal value alpha^i of each draft token, the ceiling.

    The model (Leviathan et al. 2022, eq. 1 and Thm. 3.8) assumes i.i.d. acceptance; it is an
    upper bound that omits verify cost growing with k and per-cycle overheads.
    """
    console = Console()
    best = optimal_k(alpha, c, max_k)
    table = Table(title=f"speedup model: alpha={alpha:g}, c={c:g}", title_justify="left")
    for column in ("k", "tokens/verify E", "speedup", "marginal alpha^k"):
        table.add_column(column, justify="right")
    for drafts in sorted({k, best, *range(min(max_k, max(k, best, 8)) + 1)}):
        marker = " (requested)" if drafts == k else ""
        marker += " (optimal)" if drafts == best else ""
        table.add_row(
            f"{drafts}{marker}",
            f"{expected_tokens_per_verify(alpha, drafts):.4g}",
            f"{speedup(alpha, drafts, c):.4g}",
            "-" if drafts == 0 else f"{marginal_value(alpha, drafts):.4g}",
        )
    console.print(table)
    gain = speedup(alpha, k, c)
    console.print(
        f"k={k}: {expected_tokens_per_verify(alpha, k):.4g} tokens/verify, "
        f"speedup {gain:.4g}x ({'a loss' if gain < 1 else 'a gain'})"
    )
    console.print(
        f"optimal k in 0..{max_k}: {best}, speedup {speedup(alpha, best, c):.4g}x"
        + (" (speculation loses: turn it off)" if best == 0 else "")
    )
    console.print(f"ceiling with free drafts: {tokens_per_verify_ceiling(alpha):.4g} tokens/verify")
    if plot_path:
        alphas = sorted({*PLOT_ALPHAS, alpha})
        plot_speedup_curves(plot_path, alphas, sorted({c, PLOT_COST}), max_k)
        console.print(f"wrote {plot_path}")
