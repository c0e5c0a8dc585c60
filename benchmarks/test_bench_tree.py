"""Throughput of the reference tree verifier, in tree verify steps (batch rows) per second.

Issue 11's goal on a 2-core machine: at least 1 million tree steps/s for 8-node trees at
V = 32, B = 1e5, every row its own p and q (``[B, 9, V]`` float64 each, Dirichlet(1) rows) and
its own drafted tokens (each node's siblings drawn from its parent's q of that row under the
scheme, :func:`losslessness.protocol.sample_siblings`), for the three draft schemes and
two shapes: ``binary`` (parents 0,0,1,1,2,2,3,3: depth 3, two children per inner node) and
``star`` (parents 0,0,0,0,1,2,3,4: four root drafts, each with one child). Every call includes
the protocol's input validation (``losslessness.protocol.validate_tree_inputs``), whose time is
reported separately as ``validation_s``. Run by ``tox -e bench`` (or
``pytest benchmarks/test_bench_tree.py --benchmark-only -p no:randomly``); each result's
``extra_info`` holds ``steps_per_s`` (batch / median) and ``verifier_steps_per_s``. Other jobs
share the 2 cores, so ``extra_info`` also records the load average and the CPU time of one call
(``cpu_s``, ``time.process_time``, all torch threads together) and ``steps_per_cpu_s``, which a
loaded machine distorts far less than the wall-clock median.

On CPU the call walks each row's tree in the compiled kernel
(``losslessness.reference.tree_kernel.verify_tree_rows``), which also makes the protocol's value
checks on its way; ``validation_s`` is the full validator alone, which the call no longer runs.
Measured 2026-11-25 on the shared 2-core AMD EPYC VM (load average about 1.1), million tree
steps/s, best / median round, 1 thread and 2 threads:

==========================  ===========  ===========
shape, scheme               1 thread     2 threads
==========================  ===========  ===========
binary, iid                 2.07 / 2.00  2.94 / 2.40
binary, without-replacement 2.07 / 2.07  2.51 / 2.23
binary, top-k               1.77 / 1.76  2.54 / 2.20
star, iid                   2.10 / 2.09  2.90 / 2.50
star, without-replacement   2.06 / 2.05  2.46 / 2.29
star, top-k                 1.59 / 1.58  2.22 / 2.04
==========================  ===========  ===========

Before the kernel (torch operations vectorised over the batch, after the full validator), the
same calls ran 0.26-0.66 M/s on one thread, of which the validator alone took 75-290 ms.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from losslessness.protocol import sample_siblings, validate_tree_inputs
from losslessness.reference.tree import verify_tree

BATCH = 100_000
VOCAB = 32
SEED = 11
SHAPES = {
    "binary": (0, 0, 1, 1, 2, 2, 3, 3),
    "star": (0, 0, 0, 0, 1, 2, 3, 4),
}


def _tree_inputs(
    parents: tuple[int, ...], scheme: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """p and q ``[B, N+1, V]`` float64 (one Dirichlet(1) row per batch row and node), parents
    ``[B, N]`` and token ids ``[B, N]`` drafted per row under ``scheme``."""
    generator = torch.Generator().manual_seed(SEED)
    nodes = len(parents)
    shape = (BATCH, nodes + 1, VOCAB)
    p = -torch.rand(shape, generator=generator, dtype=torch.float64).log_()
    q = -torch.rand(shape, generator=generator, dtype=torch.float64).log_()
    p /= p.sum(dim=-1, keepdim=True)
    q /= q.sum(dim=-1, keepdim=True)
    ids = torch.zeros((BATCH, nodes), dtype=torch.int64)
    for parent in range(nodes + 1):
        children = [j for j, node in enumerate(parents) if node == parent]
        if children:
            ids[:, children] = sample_siblings(q[:, parent], len(children), scheme, generator)
    tree = torch.tensor(parents, dtype=torch.int64).expand(BATCH, -1).contiguous()
    return p, q, tree, ids


@pytest.fixture
def torch_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the benchmark on ``request.param`` torch threads; restore the count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(request.param))
    yield torch.get_num_threads()
    torch.set_num_threads(before)


def _cpu_seconds(*inputs: Any) -> float:
    """Median of 3 CPU times (``time.process_time``) of one ``verify_tree`` call, in seconds."""
    times = []
    for _ in range(3):
        start = time.process_time()
        verify_tree(*inputs, torch.Generator().manual_seed(SEED))
        times.append(time.process_time() - start)
    return sorted(times)[1]


def _validation_seconds(*inputs: Any) -> float:
    """Median of 3 timings of the protocol's input validation alone, in seconds."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        validate_tree_inputs(*inputs, torch.Generator())
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


@pytest.mark.parametrize("torch_threads", [1, 2], indirect=True, ids=["1thread", "2threads"])
@pytest.mark.parametrize("scheme", ["iid", "without-replacement", "top-k"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_reference_tree_verify_throughput_8_nodes_v32_batch_1e5(
    benchmark: Any, shape: str, scheme: str, torch_threads: int
) -> None:
    """Tree verify steps per second of ``losslessness.reference.tree.verify_tree`` on 8-node
    trees, V = 32, B = 1e5 distinct rows (goal: 1 million)."""
    parents = SHAPES[shape]
    p, q, tree, ids = _tree_inputs(parents, scheme)
    generator = torch.Generator().manual_seed(SEED)
    output = benchmark.pedantic(
        verify_tree, args=(p, q, tree, ids, scheme, generator), rounds=5, warmup_rounds=1
    )
    assert output.tokens.shape[0] == BATCH
    median = benchmark.stats.stats.median
    validation = _validation_seconds(p, q, tree, ids, scheme)
    cpu = _cpu_seconds(p, q, tree, ids, scheme)
    benchmark.extra_info.update(
        shape=shape,
        parents=list(parents),
        scheme=scheme,
        vocab=VOCAB,
        batch=BATCH,
        steps_per_s=BATCH / median,
        validation_s=validation,
        verifier_steps_per_s=BATCH / max(median - validation, 1e-9),
        cpu_s=cpu,
        steps_per_cpu_s=BATCH / cpu,
        load_average=os.getloadavg()[0],
        torch_threads=torch_threads,
    )
