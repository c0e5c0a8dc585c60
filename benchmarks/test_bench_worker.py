"""The cost of running a target in a worker process (:mod:`losslessness.worker`): one chain
verifier call of the reference in the audit's own process and in a worker, at a small batch
(B = 8 rows, k = 2, V = 32) and a large one (B * (2k+1) * V at
:data:`~losslessness.engine.draw.BATCH_ELEMENT_BUDGET`, 32 MiB of float64 inputs), with the
input buffers reused across calls (a chain case's calls, the copy skipped and the inputs only
compared) and fresh per call (interleaved cases: copied and compared); plus the start of a
worker (a fresh Python, torch and the target imported, until the target is ready).

Run by ``tox -e bench`` (``pytest benchmarks/test_bench_worker.py -p no:randomly -n 0
--benchmark-only``); the overhead of a call is the isolated median minus the in-process one.
The figures in the closing note of issue 20 were taken on the shared 2-core VM under load from
other agents.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from losslessness.adapters import Adapter
from losslessness.engine.draw import BATCH_ELEMENT_BUDGET, call_target
from losslessness.targets import resolve_adapter
from losslessness.worker import worker_of

K = 2
V = 32
SMALL_BATCH = 8
LARGE_BATCH = BATCH_ELEMENT_BUDGET // ((2 * K + 1) * V)
TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def adapters() -> Iterator[dict[str, Adapter]]:
    """The reference in this process and in a worker process."""
    isolated = resolve_adapter("reference", in_process=False)
    yield {"in-process": resolve_adapter("reference"), "isolated": isolated}
    worker = worker_of(isolated)
    assert worker is not None
    worker.close()


def _inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch)
    target = torch.rand((batch, K + 1, V), generator=generator, dtype=torch.float64)
    draft = torch.rand((batch, K, V), generator=generator, dtype=torch.float64)
    target /= target.sum(-1, keepdim=True)
    draft /= draft.sum(-1, keepdim=True)
    drafts = torch.randint(0, V, (batch, K), generator=generator)
    return target, draft, drafts


@pytest.mark.parametrize("inputs", ["reused", "fresh"])
@pytest.mark.parametrize("batch", [SMALL_BATCH, LARGE_BATCH], ids=["B8", "Bmax"])
@pytest.mark.parametrize("where", ["in-process", "isolated"])
def test_bench_chain_call(
    benchmark: Any, adapters: dict[str, Adapter], where: str, batch: int, inputs: str
) -> None:
    """One reference chain call through ``call_target`` (the engine's path)."""
    verifier = adapters[where].chain
    assert verifier is not None
    target, draft, drafts = _inputs(batch)
    generator = torch.Generator().manual_seed(1)

    def call() -> object:
        if inputs == "fresh":
            return call_target(verifier, target.clone(), draft.clone(), drafts, generator,
                               timeout_s=TIMEOUT_S)
        return call_target(verifier, target, draft, drafts, generator, timeout_s=TIMEOUT_S)

    benchmark.pedantic(call, rounds=20 if batch == SMALL_BATCH else 5, warmup_rounds=1)
    benchmark.extra_info.update(batch=batch, elements=batch * (2 * K + 1) * V)


def test_bench_worker_start(benchmark: Any) -> None:
    """Start a worker and load the reference in it (until its first call could run)."""

    def start() -> float:
        began = time.perf_counter()
        adapter = resolve_adapter("reference", in_process=False)
        seconds = time.perf_counter() - began
        worker = worker_of(adapter)
        assert worker is not None
        worker.close()
        return seconds

    benchmark.pedantic(start, rounds=3, warmup_rounds=0)
