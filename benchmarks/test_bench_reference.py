"""Throughput of the reference chain verifier, in verify steps (batch rows) per second.

Issue 4's goal on a 2-core machine: at least 10 million steps/s at k = 4, V = 32, batch 1e5
for rows that share p and q (``p.expand(B, k+1, V)``: the shared-table path, inverse CDF on one
cumulative table per position). V = 32,000 shows the ``log V`` cost of the binary searches.

Issue 13 (item 4): rows that do not share memory. ``V32-rows`` materialises copies of one row;
``V32-distinct-*`` gives every row its own p and q (float64 and float32 inputs, on 1 and 2
torch threads). On CPU such rows are verified by the compiled kernel
(``losslessness.reference.chain_kernel.verify_rows``: one pass per row, the protocol's value
checks made on what it reads, the batch split over ``torch.get_num_threads()`` threads).
``mode``: ``verify`` is the full public call (uniforms drawn from the generator, validation
included); ``torch`` is the accelerators' per-row path run on CPU on the same inputs without
validation (``chain._verify_per_row``: about 50 tensor operations per chunk of rows, what CPU
ran before the kernel); ``validation_s`` in ``extra_info`` is the time of
``validate_chain_inputs`` alone (two passes over the input).

Measured on the shared 2-core AMD EPYC development VM (32 MiB L3, ~28 GB/s from memory on one
core), 2026-11-25, load average about 1.1, in million steps/s (B / seconds per call), best
round / median round (``pytest benchmarks/test_bench_reference.py -p no:randomly -n 0
--benchmark-only``):

=============================  ==================  ==================
configuration                  1 thread            2 threads
=============================  ==================  ==================
verify, f64                    5.15 / 5.11         6.67 / 6.09
verify, f32                    4.30 / 4.30         5.71 / 5.39
torch path (unvalidated), f64  2.19 / 2.02         2.96 / 2.74
torch path (unvalidated), f32  2.11 / 2.05         2.98 / 2.79
=============================  ==================  ==================

In the same run, on 2 threads: shared rows (``V32``) 14.5 / 14.2, ``V32000`` 8.7 / 8.6,
``V32-rows`` (materialised copies of one row, the kernel) 6.3 / 6.2.

Goal: 5 million steps/s on distinct rows. Of the ~20 ms of a float64 call on one thread,
about 3.5 ms draw the 5e5 uniforms from the generator (the protocol's draws, unchanged),
9 ms read the 230 MB input once (the row sums, at about the memory's bandwidth: a bare
``numpy`` minimum over it takes 8 ms) and 6-7 ms are the acceptance decisions, final weights
and searches. Float32 inputs read half the bytes but pay a scalar conversion per entry (the
float64 sums are the validator's and the law's). Before the kernel (the torch path, screened):
1.8-2.0 (f64) and 1.9-2.2 (f32) on one thread, 2.5 on two.
Run by ``tox -e bench``; each result's ``extra_info`` holds ``steps_per_s`` (batch / median).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import losslessness.reference.chain as chain
from losslessness.protocol import validate_chain_inputs
from losslessness.reference import ChainUniforms, sample_inverse_cdf, shares_rows, verify

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


def _distinct_inputs(
    vocab: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row its own p ``[B, k+1, V]`` and q ``[B, k, V]`` (Dirichlet(1) rows, normalised
    in ``dtype``) and drafts ``[B, k]`` d_i ~ q_i of its own row."""
    generator = torch.Generator().manual_seed(SEED)
    p = -torch.rand((BATCH, K + 1, vocab), generator=generator, dtype=torch.float64).log_()
    q = -torch.rand((BATCH, K, vocab), generator=generator, dtype=torch.float64).log_()
    p = (p / p.sum(dim=-1, keepdim=True)).to(dtype)
    q = (q / q.sum(dim=-1, keepdim=True)).to(dtype)
    ids = torch.stack(
        [
            sample_inverse_cdf(q[:, i], torch.rand(BATCH, generator=generator, dtype=torch.float64))
            for i in range(K)
        ],
        dim=1,
    )
    return p, q, ids


@pytest.fixture
def torch_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the benchmark on ``request.param`` torch threads; restore the count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(request.param))
    yield torch.get_num_threads()
    torch.set_num_threads(before)


def _validation_seconds(target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor) -> float:
    """Median of 5 timings of the protocol's input validation alone, in seconds."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        validate_chain_inputs(target, draft, ids, torch.Generator())
        times.append(time.perf_counter() - start)
    return sorted(times)[2]


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
        verify, args=(target, draft, ids, generator), rounds=15 if shared else 5, warmup_rounds=1
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


def _torch_path(
    target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """The accelerators' per-row torch path alone (no validation), run on CPU, on freshly
    drawn uniforms."""
    drawn = ChainUniforms.draw(ids.shape[0], ids.shape[1], generator)
    return chain._verify_per_row(target, draft, ids, drawn.accept_uniforms, drawn.sample_uniforms)


@pytest.mark.parametrize("torch_threads", [1, 2], indirect=True, ids=["1thread", "2threads"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("mode", ["verify", "torch"])
def test_reference_chain_verify_throughput_on_distinct_rows_at_v32_k4_batch_1e5(
    benchmark: Any, mode: str, dtype: torch.dtype, torch_threads: int
) -> None:
    """Verify steps per second on rows that share nothing at V = 32, k = 4, B = 1e5: the full
    public call (``verify``: the compiled kernel, screened, validation included; issue 13's
    goal is 5 million) or the accelerators' torch per-row path run on CPU without validation
    (``torch``). ``validation_s`` is the time of ``validate_chain_inputs`` alone."""
    target, draft, ids = _distinct_inputs(32, dtype)
    assert not shares_rows(target, draft)
    assert chain._screenable(target, draft, ids)
    generator = torch.Generator().manual_seed(SEED)
    function = verify if mode == "verify" else _torch_path
    output = benchmark.pedantic(
        function, args=(target, draft, ids, generator), rounds=9, warmup_rounds=1
    )
    assert tuple(output.shape) == (BATCH, K + 1)
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(
        vocab=32,
        k=K,
        batch=BATCH,
        dtype=str(dtype),
        mode=mode,
        path="compiled kernel, screened" if mode == "verify" else "torch per row, unvalidated",
        steps_per_s=BATCH / median,
        best_steps_per_s=BATCH / benchmark.stats.stats.min,
        validation_s=_validation_seconds(target, draft, ids),
        torch_threads=torch_threads,
    )
