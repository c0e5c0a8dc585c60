"""The nightly's shards run as Ray tasks (``losslessness nightly --ray``) merge to the
one-process night of the same seed, count for count and verdict for verdict; a Ray session the
night starts is shut down, also when a shard fails (the other shards are cancelled), and a
session it found open is left open; ``--ray`` with ``--shard`` is a usage error; a missing
Ray, or a cluster without the GPUs a shard asks for, is reported instead of waited on.

The tests that run shards on Ray share one local instance per pytest process (module-scoped
fixture; ``address="local"`` always starts a new instance with its own session directory and
free ports, so pytest-xdist workers that each start one neither share nor collide), shut down
after the module. The start/stop logic is pinned with a stand-in ``ray`` module, without the
7-10 s a real instance takes to start.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine import ShardSpec, finish_run, make_plan, run_shard
from losslessness.engine.cluster import (
    INSTALL_HINT,
    InsufficientResources,
    RayNotInstalled,
    default_shard_count,
    import_ray,
    require_gpus,
    run_shards_on_ray,
)
from losslessness.results import CheckResult, TargetVerdict
from tests.engine.outcomes import check_outcome

LOSSY_TARGET = "mutant/residual-zeroes-rejected-token"
"""A registered wrong verifier (it resolves by name on every Ray worker), LOSSY on v8-far."""

# Small chunks: every chain case spans several chunks, so the shards hold parts of the same
# case and the merge really sums their tables; the night samples in about a second.
CASES = ("v2-tilted", "v8-far", "edge-disjoint", "greedy-v2-random")
CONFIG = RunConfig.nightly(
    "cpu",
    step_multiplier=0.05,
    cases=CASES,
    suite=False,
    device_checks=False,
    targets=("reference", LOSSY_TARGET),
    chunk_steps=64,
    seed=7,
)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A new local Ray instance (2 CPUs, no dashboard, no usage statistics, quiet), shut down
    after the module's tests, whatever they did."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        try:
            yield ray
        finally:
            ray.shutdown()


class _Ref:
    def __init__(self, spec: ShardSpec, value: object) -> None:
        self.spec, self.value = spec, value


class _FakeRemote:
    def __init__(self, fake: FakeRay, function: Callable[..., Any]) -> None:
        self.fake, self.function = fake, function

    def options(self, **options: Any) -> _FakeRemote:
        self.fake.calls.append(("options", options))
        return self

    def remote(self, config: RunConfig, spec: ShardSpec, work_dir: str) -> _Ref:
        if spec.index in self.fake.failing:
            return _Ref(spec, RuntimeError(f"shard {spec} failed"))
        return _Ref(spec, self.function(config, spec, work_dir))


class FakeRay:
    """Stands in for the ``ray`` module: records init, shutdown, task options and cancels;
    runs each task in this process when it is submitted (``failing``: shard indices whose
    task raises instead); returns finished tasks in submission order."""

    def __init__(
        self, resources: dict[str, float], initialized: bool = False, failing: tuple[int, ...] = ()
    ) -> None:
        self.resources, self.initialized, self.failing = resources, initialized, failing
        self.calls: list[tuple[str, Any]] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, address: str | None = None, **options: Any) -> None:
        self.calls.append(("init", (address, options)))
        self.initialized = True

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))
        self.initialized = False

    def cluster_resources(self) -> dict[str, float]:
        return self.resources

    def remote(self, function: Callable[..., Any]) -> _FakeRemote:
        return _FakeRemote(self, function)

    def wait(self, refs: list[_Ref], num_returns: int) -> tuple[list[_Ref], list[_Ref]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: _Ref) -> object:
        if isinstance(ref.value, BaseException):
            raise ref.value
        return ref.value

    def cancel(self, ref: _Ref, force: bool = False) -> None:
        self.calls.append(("cancel", str(ref.spec)))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _outcomes(checks: list[CheckResult]) -> list[tuple[object, ...]]:
    return [check_outcome(check) for check in checks]


# Slow (about 70 s on 2 cores, most of it Ray's start): the nightly --ray test below runs
# shards on Ray in the default run.
@pytest.mark.slow
def test_ray_shards_merged_equal_the_one_process_night_count_for_count_and_verdict_for_verdict(
    tmp_path: Path, local_ray: Any
) -> None:
    """Three shards run as tasks on a local Ray instance, merged, give the one-process night's
    count tables exactly and the same statistic, p-value and verdict for every check (the
    reference LOSSLESS, the wrong verifier LOSSY, so both verdicts are compared); the results
    come back in shard order, and the session the call found open stays open."""
    shards = run_shards_on_ray(CONFIG, tmp_path / "ray", 3)
    assert local_ray.is_initialized()
    assert [shard.shard for shard in shards] == [ShardSpec(i, 3) for i in range(3)]
    plan = make_plan(CONFIG)
    assert {shard.fingerprint for shard in shards} == {plan.fingerprint}
    on_ray = finish_run(shards)
    one = finish_run([run_shard(plan, ShardSpec(0, 1), tmp_path / "one")])
    assert on_ray.tables.keys() == one.tables.keys()
    for key, table in one.tables.items():
        assert on_ray.tables[key] == table, key
    # Shards really split cases: some case's chunks ran on more than one shard.
    owners: dict[tuple[str, str], set[int]] = {}
    for unit in plan.units:
        if unit.kind == "chain":
            owner = next(shard.shard.index for shard in shards if unit.index in shard.units)
            owners.setdefault((unit.target, unit.case_id), set()).add(owner)
    assert any(len(owner) > 1 for owner in owners.values())
    assert [_outcomes(t.checks) for t in on_ray.audit.targets] == [
        _outcomes(t.checks) for t in one.audit.targets
    ]
    verdicts = {target.name: target.verdict for target in on_ray.audit.targets}
    assert verdicts == {"reference": TargetVerdict.LOSSLESS, LOSSY_TARGET: TargetVerdict.LOSSY}
    assert on_ray.exit_code == one.exit_code == 1


def test_nightly_command_with_ray_writes_every_shard_file_and_reports_what_merge_reports(
    tmp_path: Path, local_ray: Any
) -> None:
    """``losslessness nightly --ray --shards 2 --out DIR`` (on the open local session) writes
    both shard files and the reports, with exit code 1 (the wrong verifier is LOSSY);
    ``losslessness merge`` of those files reports the same checks (statistics, p-values,
    verdicts) and exit code. (The equality with the one-process night is pinned above on the
    same night.)"""
    runner = CliRunner()
    options = ["--targets", f"reference,{LOSSY_TARGET}", "--budget", "0.05", "--seed", "7"]
    options += [f"--case={case}" for case in CASES]
    options += ["--no-suite", "--no-device-checks", "--no-progress"]
    out = tmp_path / "ray"
    result = runner.invoke(main, ["nightly", *options, "--ray", "--shards", "2", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "ran 2 shards on Ray" in result.output
    assert local_ray.is_initialized()
    files = sorted(out.glob("shard-*.npz"))
    assert [path.name for path in files] == ["shard-0-of-2.npz", "shard-1-of-2.npz"]
    for name in ("report.html", "report.md", "junit.xml", "report.json", "nightly.json"):
        assert (out / name).stat().st_size > 0, name
    merged = runner.invoke(main, ["merge", *map(str, files), "--out", str(tmp_path / "merged")])
    assert merged.exit_code == 1, merged.output

    def checks(folder: Path) -> list[list[object]]:
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
        fields = ("target", "check_id", "case_id", "position", "n", "statistic", "p_value")
        return [
            [*(check[name] for name in fields), check["verdict"]]
            for target in report["targets"]
            for check in target["checks"]
        ]

    assert checks(out) == checks(tmp_path / "merged")
    assert {"PASS", "LOSSY"} <= {check[-1] for check in checks(out)}
    summary = json.loads((out / "nightly.json").read_text(encoding="utf-8"))
    assert [shard["shard"] for shard in summary["shards"]] == ["0/2", "1/2"]


def test_a_session_the_call_starts_is_shut_down_and_a_failed_shard_cancels_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a stand-in ``ray`` module: a call that finds no session calls ``ray.init`` once
    (the address, no dashboard), asks one CPU and ``gpus_per_shard`` GPUs per task, runs one
    shard per cluster CPU by default, returns them in shard order and shuts the session down;
    when a shard fails, the pending shards are cancelled, the session is shut down and the
    error propagates; a cluster short of GPUs is refused before any task, and shut down; a
    session found open is used and left open, and naming an address then is a ValueError."""
    fake = FakeRay({"CPU": 3.0, "GPU": 1.0})
    monkeypatch.setitem(sys.modules, "ray", fake)
    shards = run_shards_on_ray(CONFIG, tmp_path, address="HOST:6379", gpus_per_shard=1.0)
    assert [shard.shard for shard in shards] == [ShardSpec(i, 3) for i in range(3)]
    assert fake.names() == ["init", "options", "shutdown"]
    address, options = fake.calls[0][1]
    assert address == "HOST:6379" and options["include_dashboard"] is False
    assert fake.calls[1][1]["num_cpus"] == 1 and fake.calls[1][1]["num_gpus"] == 1.0
    assert not fake.initialized

    failing = FakeRay({"CPU": 3.0}, failing=(0,))
    monkeypatch.setitem(sys.modules, "ray", failing)
    with pytest.raises(RuntimeError, match="shard 0/3 failed"):
        run_shards_on_ray(CONFIG, tmp_path)
    assert failing.calls[2:] == [("cancel", "1/3"), ("cancel", "2/3"), ("shutdown", None)]

    no_gpu = FakeRay({"CPU": 3.0})
    monkeypatch.setitem(sys.modules, "ray", no_gpu)
    with pytest.raises(InsufficientResources, match="gpus_per_shard"):
        run_shards_on_ray(CONFIG, tmp_path, 2, gpus_per_shard=1.0)
    assert no_gpu.names() == ["init", "shutdown"]

    open_session = FakeRay({"CPU": 2.0}, initialized=True)
    monkeypatch.setitem(sys.modules, "ray", open_session)
    with pytest.raises(ValueError, match="address: this process is already connected"):
        run_shards_on_ray(CONFIG, tmp_path, 2, address="auto")
    assert len(run_shards_on_ray(CONFIG, tmp_path, 2)) == 2
    assert open_session.names() == ["options"] and open_session.initialized


def test_ray_with_shard_or_shards_without_ray_is_a_usage_error() -> None:
    """``--ray`` with ``--shard i/N``, and ``--shards N`` without ``--ray``, exit 2 with a
    message naming the conflicting options (before anything is planned or started)."""
    runner = CliRunner()
    both = runner.invoke(main, ["nightly", "--ray", "--shard", "0/2", "--no-progress"])
    assert both.exit_code == 2
    assert "--ray" in both.output and "--shard i/N" in both.output
    with_address = runner.invoke(main, ["nightly", "--ray", "auto", "--shard", "0/2"])
    assert with_address.exit_code == 2 and "--shard i/N" in with_address.output
    alone = runner.invoke(main, ["nightly", "--shards", "2"])
    assert alone.exit_code == 2 and "--shards N needs --ray" in alone.output


def test_missing_ray_raises_an_error_naming_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without Ray, the library raises RayNotInstalled (an ImportError) and the CLI exits 2,
    both naming ``pip install 'losslessness[ray]'``."""
    monkeypatch.setitem(sys.modules, "ray", None)  # makes ``import ray`` raise ImportError
    with pytest.raises(RayNotInstalled, match=INSTALL_HINT.replace("[", r"\[").replace("]", r"\]")):
        import_ray()
    with pytest.raises(ImportError):
        run_shards_on_ray(CONFIG, tmp_path, 2)
    result = CliRunner().invoke(
        main,
        [
            "nightly",
            "--ray",
            "--targets",
            "reference",
            "--case",
            "v2-tilted",
            "--no-suite",
            "--no-device-checks",
            "--no-progress",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and INSTALL_HINT in result.output


def test_gpu_requests_beyond_the_cluster_fail_fast_and_shard_count_follows_its_cpus() -> None:
    """A shard asking for more GPUs than the cluster has raises InsufficientResources naming
    ``gpus_per_shard`` (Ray would wait for it forever); one fitting, or none, passes; the
    default shard count is the cluster's CPUs, at least 1."""
    with pytest.raises(InsufficientResources, match=r"gpus_per_shard: .* has 0"):
        require_gpus({"CPU": 16.0}, 1.0)
    with pytest.raises(InsufficientResources, match="has 1"):
        require_gpus({"CPU": 16.0, "GPU": 1.0}, 2.0)
    with pytest.raises(ValueError, match="gpus_per_shard"):
        require_gpus({}, -1.0)
    require_gpus({"CPU": 2.0, "GPU": 2.0}, 1.0)
    require_gpus({"CPU": 2.0}, 0.0)
    assert default_shard_count({"CPU": 8.0, "GPU": 1.0}) == 8
    assert default_shard_count({"CPU": 2.5}) == 2
    assert default_shard_count({"CPU": 0.5}) == default_shard_count({}) == 1
    with pytest.raises(ValueError, match="shards"):
        run_shards_on_ray(CONFIG, ".", 0)
