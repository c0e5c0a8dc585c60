"""The nightly's shards as tasks on a Ray cluster (``losslessness nightly --ray [ADDRESS]``).

The run's unit grid does not depend on how it is split (:mod:`losslessness.engine.plan`), so
N shards run anywhere merge to the one-process run count for count and verdict for verdict.
This module only dispatches them: one Ray task per shard ``i/N``, each of which plans the run
again from the (picklable) :class:`~losslessness.config.RunConfig` with
:func:`~losslessness.engine.plan.make_plan` (plans hold adapters with closures, which are not
shipped), runs :func:`~losslessness.engine.scheduler.run_shard` and returns its
:class:`~losslessness.engine.shards.ShardResult` (plain dataclasses and numpy arrays; it
pickles). The caller merges them with :func:`~losslessness.engine.finish.finish_run`, or saves
them with :func:`~losslessness.engine.shards.save_shard` for ``losslessness merge``.

Every task must plan the same night: a worker on which a target does not load plans without
it, and the merge then refuses the shards (different plan fingerprints), naming the
difference. Ray retries a task whose worker died; a shard's samples depend only on the grid,
so a retried shard gives the same result.

Ray is an optional dependency (``pip install 'losslessness[ray]'``), imported only when a
function here is called.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from losslessness.config import RunConfig
from losslessness.engine.plan import make_plan
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import ShardResult, ShardSpec

INSTALL_HINT = "pip install 'losslessness[ray]'"
"""The command that installs Ray for this package."""

ShardProgress = Callable[[int, int, str], None]
"""Called on the driver with (shards done, shards, label of the last shard finished)."""


class RayNotInstalled(ImportError):
    """Ray is not installed; the message names :data:`INSTALL_HINT`."""


class InsufficientResources(ValueError):
    """The Ray cluster lacks what each shard task asks for (the message says what)."""


def import_ray() -> Any:
    """Import and return the ``ray`` module.

    Raises:
        RayNotInstalled: Ray does not import; the message says how to install it.
    """
    try:
        import ray
    except ImportError as error:
        raise RayNotInstalled(
            f"running the nightly on Ray needs the ray package, which does not import "
            f"({error}); install it with: {INSTALL_HINT}"
        ) from error
    return ray


def require_gpus(resources: Mapping[str, float], gpus_per_shard: float) -> None:
    """Check that a cluster with ``resources`` can schedule a task asking ``gpus_per_shard``
    GPUs, so that such a task fails fast instead of waiting forever for a GPU.

    Args:
        resources: the cluster's total resources (``ray.cluster_resources()``; GPUs under
            ``"GPU"``).
        gpus_per_shard: GPUs each shard task asks for (>= 0).

    Raises:
        ValueError: ``gpus_per_shard`` negative.
        InsufficientResources: naming ``gpus_per_shard``, when it is more than the cluster has
            (a cluster whose autoscaler would add GPUs later is not waited for).
    """
    if not gpus_per_shard >= 0:
        raise ValueError(f"gpus_per_shard: must be >= 0, got {gpus_per_shard}")
    available = float(resources.get("GPU", 0.0))
    if gpus_per_shard > available:
        raise InsufficientResources(
            f"gpus_per_shard: each shard asks for {gpus_per_shard:g} GPU(s) but the Ray cluster "
            f"has {available:g}; run on a cluster with GPUs, or on the CPU (--device cpu)"
        )


def default_shard_count(resources: Mapping[str, float]) -> int:
    """One shard per CPU the cluster reports (``resources["CPU"]``, rounded down), at least 1.

    The night's result does not depend on the count; only how the work is spread does.
    """
    return max(1, int(resources.get("CPU", 1.0)))


def _run_shard_task(config: RunConfig, spec: ShardSpec, work_dir: str) -> ShardResult:
    """Body of one Ray task: plan the night on the worker and run shard ``spec``."""
    return run_shard(make_plan(config), spec, work_dir)


def run_shards_on_ray(
    config: RunConfig,
    work_dir: str | Path,
    shards: int | None = None,
    *,
    address: str | None = None,
    gpus_per_shard: float = 0.0,
    progress: ShardProgress | None = None,
    init_options: Mapping[str, Any] | None = None,
) -> list[ShardResult]:
    """Run every shard ``i/N`` of the night ``config`` as one Ray task each.

    When this process is already connected to Ray (``ray.is_initialized()``), that session is
    used and left running. Otherwise ``ray.init(address=address, **init_options)`` connects and
    ``ray.shutdown()`` ends the session afterwards, also on errors (a local instance it started
    stops with it). ``address`` None follows Ray: the cluster ``RAY_ADDRESS`` names, else the
    one the last ``ray start`` on this machine started, else a new local instance; ``"local"``
    always starts a new local instance. A local instance is started without its dashboard,
    with usage statistics off unless ``RAY_USAGE_STATS_ENABLED`` is set, logging at WARNING.

    Args:
        config: the night (the same one on every shard; it is pickled to the tasks).
        work_dir: where each task's property-suite runs go (``work_dir/suite/<target>``),
            made absolute on this process; the path must be writable on every node.
        shards: N, the number of shards (>= 1); None: one per CPU the cluster reports (see
            :func:`default_shard_count`). The merged result does not depend on N.
        address: a Ray address (``local``, ``auto``, ``host:port``, ``ray://host:10001``) or
            None.
        gpus_per_shard: GPUs each shard task asks Ray for (1 for a night with
            ``device="cuda"``); Ray makes them the task's ``CUDA_VISIBLE_DEVICES``.
        progress: called on this process after each shard finishes.
        init_options: more keyword arguments of ``ray.init`` when this function connects (for
            a local instance: ``num_cpus``, ``num_gpus``, ...).

    Returns:
        The N :class:`ShardResult` in shard order (``shard 0/N`` first); merge them with
        :func:`losslessness.engine.finish.finish_run`.

    Raises:
        RayNotInstalled: Ray does not import (the message names :data:`INSTALL_HINT`).
        ValueError: ``shards`` below 1, ``gpus_per_shard`` negative, or ``address`` given
            while this process is already connected to Ray.
        InsufficientResources: each shard asks for more GPUs than the cluster has.
        ConnectionError: from ``ray.init``, when no cluster answers at ``address``.
        Exception: what a task raised (Ray re-raises it as a ``RayTaskError`` that is also an
            instance of the original exception's class).
    """
    if shards is not None and shards < 1:
        raise ValueError(f"shards: must be >= 1, got {shards}")
    if not gpus_per_shard >= 0:
        raise ValueError(f"gpus_per_shard: must be >= 0, got {gpus_per_shard}")
    ray = import_ray()
    started = not ray.is_initialized()
    if not started and address is not None:
        raise ValueError(
            f"address: this process is already connected to Ray, so {address!r} cannot be "
            "used; pass address=None to use that session, or call ray.shutdown() first"
        )
    if started:
        # Both only matter when ray.init starts an instance (it ignores include_dashboard when
        # it connects to a running cluster).
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
        options.update(init_options or {})
        ray.init(address=address, **options)
    try:
        resources = ray.cluster_resources()
        require_gpus(resources, gpus_per_shard)
        count = default_shard_count(resources) if shards is None else shards
        specs = [ShardSpec(index, count) for index in range(count)]
        task = ray.remote(_run_shard_task).options(
            num_cpus=1, num_gpus=gpus_per_shard, name="losslessness-nightly-shard"
        )
        # Absolute: a worker's working directory need not be this process's.
        folder = str(Path(work_dir).resolve())
        pending = {task.remote(config, spec, folder): spec for spec in specs}
        results: dict[ShardSpec, ShardResult] = {}
        if progress is not None:
            progress(0, count, f"{count} shards on Ray")
        try:
            while pending:
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    spec = pending.pop(ref)
                    results[spec] = ray.get(ref)
                    if progress is not None:
                        progress(len(results), count, f"shard {spec} done")
        except BaseException:
            # A shard failed (or the wait was interrupted): the night cannot finish, so the
            # other shards are not left running on a cluster that outlives this call.
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return [results[spec] for spec in specs]
    finally:
        if started:
            ray.shutdown()


__all__ = [
    "INSTALL_HINT",
    "InsufficientResources",
    "RayNotInstalled",
    "ShardProgress",
    "default_shard_count",
    "import_ray",
    "require_gpus",
    "run_shards_on_ray",
]
