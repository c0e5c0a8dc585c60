"""Throughput of the reference chain verifier, in verify steps (batch rows) per second.

Issue 4's goal on a 2-core machine: at least 10 million steps/s at k = 4, V = 32, batch 1e5
for rows that share p and q (``p.expand(B, k+1, V)``: the shared-table path, inverse CDF on one
cumulative table per position). V = 32,000 shows the ``log V`` cost of the binary searches;
the per-row path (materialised rows, ``O(B k V)``) is measured at V = 32 for comparison.
Run by ``tox -e bench``; each result's ``extra_info`` holds ``steps_per_s`` (batch / median).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from losslessness.reference import sample_inverse_cdf, shares_rows, verify

K = 4
BATCH = 100_000
SEED = 4


def _inputs(vocab: int, shared: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p ``[B, k+1, V]``, q ``[B, k, V]`` (one Dirichlet(1) row each, expanded or copied) and
    drafts ``[B, k]`` d_i ~ q_i."""
    torch.manual_seed(SEED)
    concentration = torch.ones(vocab, dtype=torch.float64)
    p = torch.distributions.Dirichlet(concentration).sample((K + 1,))
    q = torch.distributions.Dirichlet(concentration).sample((K,))
    generator = torch.Generator().manual_seed(SEED)
    ids = torch.stack(
        [
            sample_inverse_cdf(q[i], torch.rand(BATCH, generator=generator, dtype=torch.float64))
            for i in range(K)
        ],
        dim=1,
    )
    target, draft = p.expand(BATCH, -1, -1), q.expand(BATCH, -1, -1)
    if not shared:
        target, draft = target.contiguous(), draft.contiguous()
    return target, draft, ids


@pytest.mark.parametrize(
    ("vocab", "shared"),
    [(32, True), (32_000, True), (32, False)],
    ids=["V32", "V32000", "V32-rows"],
)
def test_reference_chain_verify_throughput_at_k4_batch_1e5(
    benchmark: Any, vocab: int, shared: bool
) -> None:
    """Verify steps per second of ``losslessness.reference.verify`` at k = 4, B = 1e5."""
    target, draft, ids = _inputs(vocab, shared)
    assert shares_rows(target, draft) == shared
    generator = torch.Generator().manual_seed(SEED)
    output = benchmark.pedantic(
        verify, args=(target, draft, ids, generator), rounds=15 if shared else 3, warmup_rounds=1
    )
    assert tuple(output.shape) == (BATCH, K + 1)
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(
        vocab=vocab,
        k=K,
        batch=BATCH,
        path="shared tables" if shared else "per row",
        steps_per_s=BATCH / median,
        torch_threads=torch.get_num_threads(),
    )
