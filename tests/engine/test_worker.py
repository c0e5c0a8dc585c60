"""Targets in a worker process (:mod:`losslessness.worker`): the same samples, generator states
and decisions as in the audit's own process on fixed seeds; a hang, an exit, a crash or a signal
during a call is an ERROR for that case only (the worker restarts, the next case runs); writing
into an input is a protocol violation; nothing the target does at import or in its threads
reaches the parent. The hostile targets are in :mod:`tests.engine.hostile_targets`.

Every worker imports torch when it starts (2-4 s here), so the tests share them where they can;
the engine-level twins of what :mod:`tests.commands.test_red_team` pins through the command line
(input writes, monkeypatching, threads) run under the ``slow`` mark.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from losslessness.adapters import Adapter, AdapterNotFound, AdapterUnavailable, NotApplicable
from losslessness.batteries.chain import default_chain_battery
from losslessness.batteries.greedy import default_greedy_battery
from losslessness.batteries.tree import default_tree_battery
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.engine.draw import (
    ProtocolViolation,
    TargetTimeout,
    sample_chain,
    sample_greedy,
    sample_tree,
)
from losslessness.results import TargetVerdict
from losslessness.targets import (
    UnavailableTarget,
    resolve_adapter,
    resolve_targets,
    runs_in_process,
)
from losslessness.worker import TargetRaised, shutdown_workers, worker_of
from tests.engine.behaviour import _canonical, pinned
from tests.engine.test_behaviour_pinned import _differences
from tests.suite.runner import run_suite

HOSTILE = "tests.engine.hostile_targets"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def isolated_reference() -> Iterator[Adapter]:
    """The reference adapter in a worker process (shared by this module's tests)."""
    adapter = resolve_adapter("reference", in_process=False)
    yield adapter
    worker = worker_of(adapter)
    assert worker is not None
    worker.close()


def _case(case_id: str) -> object:
    return next(case for case in default_chain_battery() if case.case_id == case_id)


def test_isolation_rule_keeps_only_the_shipped_reference_toys_and_zoo_in_process() -> None:
    """The reference, the toy loops and the zoo run in the audit's process; third-party
    adapters and ``pkg.module:callable`` targets run in a worker process."""
    assert runs_in_process("reference") and runs_in_process("toy-tree")
    assert runs_in_process("mutant/residual-zeroes-rejected-token")
    assert not runs_in_process("transformers") and not runs_in_process("medusa")
    assert not runs_in_process("losslessness.reference:verify")


def test_isolated_reference_gives_bit_identical_outputs_and_generator_states(
    isolated_reference: Adapter,
) -> None:
    """On fixed seeds the reference in a worker returns exactly what it returns in process
    (chain, greedy and tree protocols) and leaves the caller's generator in the same state."""
    local = resolve_adapter("reference")
    assert worker_of(local) is None and worker_of(isolated_reference) is not None
    assert isolated_reference.chain is not None and local.chain is not None
    for case_id in ("v2-tilted", "v16-near-k4", "v32-mixed-batch"):
        case = _case(case_id)
        here = sample_chain(local.chain, case, 3000, seed=7)
        there = sample_chain(isolated_reference.chain, case, 3000, seed=7, timeout_s=60)
        assert np.array_equal(here.outputs, there.outputs)
        assert np.array_equal(here.drafts, there.drafts)
    case = _case("v8-far")
    generators = [torch.Generator().manual_seed(3) for _ in range(2)]
    inputs = (case.target_probs.repeat(64, 1, 1), case.draft_probs.repeat(64, 1, 1))
    drafts = torch.zeros((64 * case.n_rows, case.k), dtype=torch.int64)
    outputs = [
        verifier(*inputs, drafts, generator)
        for verifier, generator in zip((local.chain, isolated_reference.chain), generators,
                                       strict=True)
    ]
    assert torch.equal(torch.as_tensor(outputs[0]), torch.as_tensor(outputs[1]))
    assert torch.equal(generators[0].get_state(), generators[1].get_state())
    greedy = default_greedy_battery()[0]
    assert isolated_reference.greedy is not None and local.greedy is not None
    assert np.array_equal(sample_greedy(local.greedy, greedy), sample_greedy(
        isolated_reference.greedy, greedy, timeout_s=60))
    tree = default_tree_battery()[0]
    assert isolated_reference.tree is not None and local.tree is not None
    here_tree = sample_tree(local.tree, tree, 600, seed=5)
    there_tree = sample_tree(isolated_reference.tree, tree, 600, seed=5, timeout_s=60)
    assert np.array_equal(here_tree.tokens, there_tree.tokens)
    assert np.array_equal(here_tree.accepted_nodes, there_tree.accepted_nodes)


@pytest.mark.slow
def test_isolated_zoo_mutant_reproduces_the_pinned_audit_record() -> None:
    """The pinned ``chain-mutant`` scenario (a lossy zoo mutant, fixed design, a tenth of the CI
    plan) run with the mutant in a worker process gives exactly the pinned verdicts, p-values,
    steps and replay lines."""
    adapter = resolve_adapter("mutant/residual-zeroes-rejected-token", in_process=False)
    try:
        result = run_audit([adapter], RunConfig(step_multiplier=0.1, early_stop=False))
    finally:
        worker = worker_of(adapter)
        assert worker is not None
        worker.close()
    from reports.jsonio import audit_to_dict

    differences = _differences(pinned()["chain-mutant"], _canonical(audit_to_dict(result)))
    assert not differences, "\n".join(differences[:20])


def _audit_hostile(function: str, timeout_s: float = 60.0) -> tuple[object, float]:
    adapter = resolve_adapter(f"{HOSTILE}:{function}")
    began = time.perf_counter()
    try:
        result = run_audit(
            [adapter],
            RunConfig(cases=("v2-tilted", "v8-far"), step_multiplier=0.05, timeout_s=timeout_s),
        )
    finally:
        worker = worker_of(adapter)
        assert worker is not None
        worker.close()
    return result.targets[0], time.perf_counter() - began


def _verdicts_by_case(target: object) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for check in target.checks:  # type: ignore[attr-defined]
        found.setdefault(check.case_id, set()).add(check.verdict.value)
    return found


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("os_exits_on_small_vocab", "exited with code 0"),
        ("sys_exits_on_small_vocab", "target raised SystemExit"),
        ("segfaults_on_small_vocab", "killed by signal SIGSEGV"),
        pytest.param(
            "aborts_on_small_vocab", "killed by signal SIGABRT", marks=pytest.mark.slow
        ),
        pytest.param(
            "kills_itself_on_small_vocab", "killed by signal SIGTERM", marks=pytest.mark.slow
        ),
    ],
)
def test_exit_or_crash_in_a_call_is_an_error_for_that_case_and_the_next_case_runs(
    function: str, message: str
) -> None:
    """``os._exit(0)``, ``sys.exit(0)``, a segfault, ``abort()`` or a SIGTERM during the calls
    of the V = 2 case turn that case into ERROR naming the exit; the worker restarts and the
    V = 8 case still runs and passes."""
    target, _ = _audit_hostile(function)
    assert target.verdict is TargetVerdict.ERROR  # type: ignore[attr-defined]
    by_case = _verdicts_by_case(target)
    assert by_case["v2-tilted"] == {"ERROR"}
    assert "PASS" in by_case["v8-far"] <= {"PASS", "SKIPPED"}
    errors = [c.message for c in target.checks if c.case_id == "v2-tilted"]  # type: ignore[attr-defined]
    assert all(message in text for text in errors), errors


@pytest.mark.parametrize(
    "function",
    ["sleeps_on_small_vocab", pytest.param("spins_on_small_vocab", marks=pytest.mark.slow)],
)
def test_hanging_call_is_killed_at_the_timeout_and_the_next_case_runs(function: str) -> None:
    """A call hanging in ``time.sleep`` or in a tight loop that swallows every exception is
    killed within the timeout plus a second; its case is ERROR ("target hung") and the next case
    runs (the target is not skipped as hung)."""
    adapter = resolve_adapter(f"{HOSTILE}:{function}")
    assert adapter.chain is not None
    worker = worker_of(adapter)
    assert worker is not None
    try:
        began = time.perf_counter()
        with pytest.raises(TargetTimeout) as caught:
            sample_chain(adapter.chain, _case("v2-tilted"), 100, seed=1, timeout_s=1.0)
        assert time.perf_counter() - began < 2.0
        assert caught.value.worker_killed and worker.pid is None
    finally:
        worker.close()
    target, _ = _audit_hostile(function, timeout_s=1.0)
    by_case = _verdicts_by_case(target)
    assert by_case["v2-tilted"] == {"ERROR"}
    assert "PASS" in by_case["v8-far"] <= {"PASS", "SKIPPED"}
    assert all("target hung" in c.message for c in target.checks if c.case_id == "v2-tilted")  # type: ignore[attr-defined]


@pytest.mark.slow
def test_target_writing_into_its_inputs_is_a_protocol_violation() -> None:
    """A verifier that writes q over p in its input buffer raises ProtocolViolation naming the
    argument; in an audit its case is LOSSY as malformed, never decided on altered inputs."""
    adapter = resolve_adapter(f"{HOSTILE}:writes_into_inputs")
    assert adapter.chain is not None
    case = _case("v8-far")
    try:
        with pytest.raises(ProtocolViolation, match="wrote into its input target_probs"):
            sample_chain(adapter.chain, case, 100, seed=1, timeout_s=60)
        result = run_audit([adapter], RunConfig(cases=("v8-far",), step_multiplier=0.05))
    finally:
        worker = worker_of(adapter)
        assert worker is not None
        worker.close()
    assert result.targets[0].verdict is TargetVerdict.LOSSY
    assert any("wrote into its input" in c.message for c in result.targets[0].checks)


def test_exceptions_keep_their_types_or_names(isolated_reference: Adapter) -> None:
    """NotApplicable and InvalidInputError from a target in a worker keep their types (the
    engine treats them specially); other exceptions come back by name with their message."""
    adapter = resolve_adapter(f"{HOSTILE}:refuses_small_vocab")
    try:
        target, _ = _audit_hostile("refuses_small_vocab")
        with pytest.raises(NotApplicable, match="needs V > 2"):
            sample_chain(adapter.chain, _case("v2-tilted"), 10, seed=1)  # type: ignore[arg-type]
    finally:
        worker = worker_of(adapter)
        assert worker is not None
        worker.close()
    assert _verdicts_by_case(target)["v2-tilted"] == {"SKIPPED"}
    assert isolated_reference.chain is not None
    with pytest.raises(ValueError, match="draft_probs"):
        isolated_reference.chain(
            torch.full((1, 2, 3), 1 / 3, dtype=torch.float64), torch.ones((1, 1, 4)),
            torch.zeros((1, 1), dtype=torch.int64), torch.Generator(),
        )
    with pytest.raises(TargetRaised) as caught:
        isolated_reference.chain()
    assert caught.value.type_name == "TypeError" and "missing" in caught.value.message


@pytest.mark.slow
def test_monkeypatching_the_auditor_in_the_target_does_not_reach_the_parent() -> None:
    """A lossy target whose module replaces the auditor's verdict function at import is still
    LOSSY: its module is imported only in the worker."""
    import losslessness.engine.finish as finish
    from losslessness.results import target_verdict

    target, _ = _audit_hostile("patches_the_auditor")
    assert target.verdict is TargetVerdict.LOSSY  # type: ignore[attr-defined]
    assert finish.target_verdict is target_verdict
    assert HOSTILE not in sys.modules


@pytest.mark.slow
def test_non_daemon_thread_of_the_target_does_not_keep_the_audit_alive() -> None:
    """A process that called a target which left a non-daemon thread running exits at once."""
    script = (
        "import torch\n"
        "from losslessness.targets import resolve_adapter\n"
        f"a = resolve_adapter('{HOSTILE}:leaves_a_thread')\n"
        "p = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)\n"
        "a.chain(p, p[:, :1], torch.zeros((1, 1), dtype=torch.int64), torch.Generator())\n"
        "print('called')\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True,
        text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "called" in completed.stdout
    assert time.perf_counter() - began < 60


IMPORT_FAILURES = {
    "syntax_error": ("def verify(:\n", "SyntaxError"),
    "exits_at_import": ("import sys\nsys.exit(0)\n", "SystemExit"),
    "raises_at_import": ("raise RuntimeError('broken at import')\n", "RuntimeError"),
    "os_exits_at_import": ("import os\nos._exit(0)\n", "exited with code 0"),
    "segfaults_at_import": ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
}
"""Target modules that fail at import (module name -> source, what the reason names)."""


def test_import_failures_in_the_worker_are_unavailable_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target module with a syntax error, an exception, ``sys.exit``, ``os._exit`` or a
    segfault at import is an unavailable target named with the reason (ERROR, exit 3), as in
    process; a missing attribute is AdapterNotFound (a usage error). The workers load
    together."""
    for module, (source, _) in IMPORT_FAILURES.items():
        (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    names = [f"{module}:verify" for module in IMPORT_FAILURES]
    resolved = resolve_targets(names)
    for target, (module, (_, reason)) in zip(resolved, IMPORT_FAILURES.items(), strict=True):
        assert isinstance(target, UnavailableTarget) and target.named, target
        assert target.name == f"{module}:verify" and reason in target.reason, target.reason
    with pytest.raises(AdapterUnavailable, match="SyntaxError"):
        resolve_adapter("syntax_error:verify")
    with pytest.raises(AdapterNotFound):
        resolve_adapter(f"{HOSTILE}:not_there")


def test_crashed_worker_restarts_lazily(isolated_reference: Adapter) -> None:
    """After its worker is killed, the next call of an isolated target starts a fresh one and
    returns the same outputs."""
    worker = worker_of(isolated_reference)
    assert worker is not None and isolated_reference.chain is not None
    case = _case("v2-tilted")
    before = sample_chain(isolated_reference.chain, case, 200, seed=2)
    pid = worker.pid
    worker.kill()
    after = sample_chain(isolated_reference.chain, case, 200, seed=2)
    assert worker.pid not in (None, pid)
    assert np.array_equal(before.outputs, after.outputs)


def test_shutdown_kills_every_worker() -> None:
    """:func:`shutdown_workers` (also run at exit) kills the workers and frees their memory."""
    adapter = resolve_adapter(f"{HOSTILE}:leaves_a_thread")
    worker = worker_of(adapter)
    assert worker is not None and worker.pid is not None
    pid = worker.pid
    shutdown_workers()
    assert worker.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_pytest_plugin_fails_a_call_past_its_timeout_once_then_at_once(tmp_path: Path) -> None:
    """``pytest --losslessness-target=... --losslessness-timeout=2`` on a verifier that hangs
    fails the chain test, naming the option, within seconds (the worker is killed); the calls
    Hypothesis makes after that (replays, shrinking) fail at once naming the inputs that hung,
    instead of waiting out the timeout each (24 s here before; with the default 300 s timeout,
    about 25 minutes)."""
    began = time.perf_counter()
    result = run_suite(
        tmp_path, f"--losslessness-target={HOSTILE}:sleeps", "--losslessness-timeout=2",
        "--losslessness-profile=ci", isolated=True,
    )
    assert result.returncode == 1, result.output
    assert "did not return within 2 s (--losslessness-timeout)" in result.stdout
    assert re.search(
        r"not called: the call of \S+:sleeps \(chain\) did not return within 2 s "
        r"\(--losslessness-timeout\) on inputs target_probs \[\d+, \d+, \d+\] float64",
        result.stdout,
    ), result.stdout
    assert time.perf_counter() - began < 120
