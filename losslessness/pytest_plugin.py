"""pytest plugin: run the property suite against someone else's verifier.

Registered under the ``pytest11`` entry point, so installing losslessness makes these options
available to every pytest run::

    pytest --losslessness-target=pkg.module:verify [--losslessness-greedy=pkg.module:fn]
           [--losslessness-tree=pkg.module:fn] [--losslessness-tree-greedy=pkg.module:fn]
           [--losslessness-profile=ci] [--losslessness-timeout=SECONDS]
    pytest --losslessness-target=pkg.module:verify --losslessness-protocol=serving
           [--losslessness-engine-profile=NAME]
    pytest --losslessness-target=pkg.module:verify_tree --losslessness-protocol=serving-tree
           [--losslessness-engine-profile=NAME]

With ``--losslessness-target`` or ``--losslessness-greedy`` the chain and greedy test modules
(:mod:`losslessness.suite`) join the collection, with ``--losslessness-tree`` or
``--losslessness-tree-greedy`` the tree module; with ``--losslessness-protocol=serving`` the
``--losslessness-target`` is a serving verifier (the serving protocol of
:mod:`losslessness.protocol`) and the serving module joins instead of the chain module, its
law the engine profile named by ``--losslessness-engine-profile`` or the function's
``engine_profile`` attribute; with ``--losslessness-protocol=serving-tree`` it is a serving
tree verifier and the serving tree module joins (the tree suite's properties on the profile's
law); without any target, the plugin does nothing. A tree
target is a tree verifier function, an :class:`~losslessness.adapters.Adapter` (its ``tree``
or ``greedy_tree``), a registered adapter name or ``mutant/tree-<name>``. Targets resolve like
``losslessness audit`` targets (registered adapter names work too) and run where the audit runs
them (:func:`losslessness.targets.resolve_adapter`): every target but the reference, the toy
loops and the zoo in a worker process, so an exit, a crash or a hang fails the test at hand
instead of the pytest run. Every call of a target may take ``--losslessness-timeout`` seconds
(default: the audit's ``--timeout`` default); a longer call fails its test, naming the option.
torch and the library are imported only when a target is used, so the plugin costs nothing in
unrelated pytest runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from losslessness.adapters import Adapter
    from losslessness.protocol import (
        GreedyTreeVerifier,
        GreedyVerifier,
        ServingTreeVerifier,
        ServingVerifier,
        TreeVerifier,
    )
    from losslessness.reference.profiles import EngineProfile

SUITE_DIRECTORY = Path(__file__).parent / "suite"
SUITE_MODULES = ("test_chain.py", "test_greedy.py")
"""Modules collected with ``--losslessness-target`` or ``--losslessness-greedy``."""
TREE_SUITE_MODULES = ("test_tree.py",)
"""Modules collected with ``--losslessness-tree`` or ``--losslessness-tree-greedy``."""
SERVING_SUITE_MODULES = ("test_serving.py",)
"""Modules collected with ``--losslessness-target`` and ``--losslessness-protocol=serving``."""
SERVING_TREE_SUITE_MODULES = ("test_serving_tree.py",)
"""Modules collected with ``--losslessness-target`` and
``--losslessness-protocol=serving-tree``."""
SUITE_PROTOCOLS = ("chain", "serving", "serving-tree")
"""The protocols ``--losslessness-protocol`` names for ``--losslessness-target``."""


@dataclass(frozen=True)
class SuiteTarget:
    """The verifiers named on the command line, resolved lazily.

    Attributes:
        chain_name: ``--losslessness-target``, or None.
        greedy_name: ``--losslessness-greedy``, or None.
        profile: ``--losslessness-profile``, or None (then the environment variable decides).
        tree_name: ``--losslessness-tree``, or None.
        greedy_tree_name: ``--losslessness-tree-greedy``, or None.
        timeout_s: ``--losslessness-timeout``: seconds one call of a target may take (None:
            the audit's default, :data:`losslessness.config.DEFAULT_TIMEOUT_S`).
        in_process: ``--losslessness-in-process``: every target in pytest's own process, as
            the audit's ``--in-process`` (debugging; by default a target the audit did not
            ship runs in a worker process, :func:`losslessness.targets.runs_in_process`).
        protocol: ``--losslessness-protocol``: the protocol of ``--losslessness-target``,
            ``chain`` or ``serving``.
        engine_profile: ``--losslessness-engine-profile``: the engine profile a serving target
            claims, or None (then the function's ``engine_profile`` attribute).
    """

    chain_name: str | None
    greedy_name: str | None
    profile: str | None
    tree_name: str | None = None
    greedy_tree_name: str | None = None
    timeout_s: float | None = None
    in_process: bool = False
    protocol: str = "chain"
    engine_profile: str | None = None
    _loaded: dict[tuple[str, str], Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def call_timeout_s(self) -> float:
        """Seconds one call of a target may take."""
        from losslessness.config import DEFAULT_TIMEOUT_S

        return self.timeout_s if self.timeout_s is not None else DEFAULT_TIMEOUT_S

    def _load(self, name: str, protocol: str, option: str) -> Adapter:
        """The adapter of ``name`` (loaded once per session; a worker process's calls bounded by
        :attr:`call_timeout_s`)."""
        from losslessness.adapters import AdapterNotFound, AdapterUnavailable
        from losslessness.targets import resolve_adapter
        from losslessness.worker import worker_of

        key = (name, protocol)
        if key not in self._loaded:
            try:
                adapter = resolve_adapter(
                    name, protocol=protocol, in_process=True if self.in_process else None
                )
            except (AdapterNotFound, AdapterUnavailable) as error:
                raise pytest.UsageError(f"{option}={name}: {error}") from error
            worker = worker_of(adapter)
            if worker is not None:
                worker.timeout_s = self.call_timeout_s
                worker.timeout_option = "--losslessness-timeout"
                worker.timeouts_are_final = True
            self._loaded[key] = adapter
        loaded: Adapter = self._loaded[key]
        return loaded

    def _resolve(self, name: str | None, greedy: bool, option: str) -> Adapter:
        if name is None:
            pytest.skip(f"no {option} given")
        if not greedy and self.protocol != "chain":
            pytest.skip(f"{option} is a {self.protocol} verifier (--losslessness-protocol)")
        adapter = self._load(name, "greedy" if greedy else "chain", option)
        if (adapter.greedy if greedy else adapter.chain) is None:
            raise pytest.UsageError(
                f"{option}={name}: has no {'greedy' if greedy else 'chain'} verifier"
            )
        return adapter

    def load_named(self) -> None:
        """Resolve every verifier named on the command line (once per session).

        Raises:
            pytest.UsageError: naming the option whose target does not resolve or lacks the
                verifier its option asks for. Raised from the session's fixture, so a bad name
                errors every test at set-up instead of failing inside a Hypothesis test, which
                would replay and shrink the same error for half a minute.
        """
        if self.chain_name is not None:
            if self.protocol == "serving":
                self.serving()
            elif self.protocol == "serving-tree":
                self.serving_tree()
            else:
                self.chain()
        if self.greedy_name is not None:
            self.greedy()
        if self.tree_name is not None:
            self.tree()
        if self.greedy_tree_name is not None:
            self.greedy_tree()

    def chain(self) -> Adapter:
        """The chain target (skips the test when none was given)."""
        return self._resolve(self.chain_name, False, "--losslessness-target")

    def greedy(self) -> GreedyVerifier:
        """The greedy verifier (skips the test when none was given)."""
        adapter = self._resolve(self.greedy_name, True, "--losslessness-greedy")
        assert adapter.greedy is not None
        return adapter.greedy

    def _resolve_tree(self, name: str | None, greedy: bool, option: str) -> object:
        if name is None:
            pytest.skip(f"no {option} given")
        kind = "greedy tree" if greedy else "tree"
        adapter = self._load(name, "greedy-tree" if greedy else "tree", option)
        loaded = adapter.greedy_tree if greedy else adapter.tree
        if not callable(loaded):
            raise pytest.UsageError(f"{option}={name}: has no {kind} verifier")
        return loaded

    def tree(self) -> TreeVerifier:
        """The tree sampling verifier (skips the test when none was given)."""
        verifier = self._resolve_tree(self.tree_name, False, "--losslessness-tree")
        return verifier  # type: ignore[return-value]

    def greedy_tree(self) -> GreedyTreeVerifier:
        """The greedy tree verifier (skips the test when none was given)."""
        verifier = self._resolve_tree(self.greedy_tree_name, True, "--losslessness-tree-greedy")
        return verifier  # type: ignore[return-value]

    def serving(self) -> tuple[ServingVerifier, EngineProfile]:
        """The serving verifier and the engine profile it claims (skips the test without a
        serving target).

        Raises:
            pytest.UsageError: naming the option: no serving verifier, no engine profile (no
                ``--losslessness-engine-profile`` and no ``engine_profile`` attribute), an
                unknown profile, or an option that contradicts the function's attribute.
        """
        adapter, profile = self._serving_adapter("serving")
        assert adapter.serving is not None
        return adapter.serving, profile

    def serving_tree(self) -> tuple[ServingTreeVerifier, EngineProfile]:
        """The serving tree verifier and the engine profile it claims (skips the test without
        a serving tree target).

        Raises:
            pytest.UsageError: as :meth:`serving`'s, for the serving tree verifier.
        """
        adapter, profile = self._serving_adapter("serving-tree")
        assert adapter.serving_tree is not None
        return adapter.serving_tree, profile

    def _serving_adapter(self, protocol: str) -> tuple[Adapter, EngineProfile]:
        """The ``--losslessness-target`` adapter in ``protocol`` and its engine profile."""
        from losslessness.reference.profiles import get_profile

        option = "--losslessness-target"
        if self.chain_name is None or self.protocol != protocol:
            pytest.skip(f"no {option} with --losslessness-protocol={protocol} given")
        adapter = self._load(self.chain_name, protocol, option)
        verifier = adapter.serving if protocol == "serving" else adapter.serving_tree
        if verifier is None:
            raise pytest.UsageError(
                f"{option}={self.chain_name}: has no {protocol.replace('-', ' ')} verifier"
            )
        claimed = adapter.engine_profile
        if self.engine_profile is not None and claimed not in (None, self.engine_profile):
            raise pytest.UsageError(
                f"--losslessness-engine-profile={self.engine_profile}: contradicts the profile "
                f"{claimed!r} that {self.chain_name} names"
            )
        name = self.engine_profile or claimed
        if name is None:
            raise pytest.UsageError(
                f"{option}={self.chain_name}: names no engine profile: pass "
                "--losslessness-engine-profile=NAME or set the function's engine_profile"
            )
        try:
            profile = get_profile(name)
        except ValueError as error:
            raise pytest.UsageError(f"--losslessness-engine-profile={name}: {error}") from error
        return adapter, profile

    def replay(self, test_name: str) -> str:
        """One command line that reruns ``test_name`` on the same targets and profile."""
        parts = ["pytest"]
        if self.chain_name:
            parts.append(f"--losslessness-target={self.chain_name}")
        if self.greedy_name:
            parts.append(f"--losslessness-greedy={self.greedy_name}")
        if self.tree_name:
            parts.append(f"--losslessness-tree={self.tree_name}")
        if self.greedy_tree_name:
            parts.append(f"--losslessness-tree-greedy={self.greedy_tree_name}")
        if self.protocol != "chain":
            parts.append(f"--losslessness-protocol={self.protocol}")
        if self.engine_profile is not None:
            parts.append(f"--losslessness-engine-profile={self.engine_profile}")
        parts.append(f"--losslessness-profile={self.profile or 'ci'}")
        if self.timeout_s is not None:
            parts.append(f"--losslessness-timeout={self.timeout_s:g}")
        if self.in_process:
            parts.append("--losslessness-in-process")
        parts.append(f"-k {test_name}")
        return " ".join(parts)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--losslessness-target``, ``--losslessness-greedy``, ``--losslessness-tree``,
    ``--losslessness-tree-greedy``, ``--losslessness-protocol``,
    ``--losslessness-engine-profile``, ``--losslessness-timeout``, ``--losslessness-in-process``
    and ``--losslessness-profile``."""
    from strategies.profiles import add_profile_option

    group = parser.getgroup("losslessness", "losslessness property suite")
    group.addoption(
        "--losslessness-target",
        metavar="PKG.MODULE:CALLABLE",
        default=None,
        help="run the property suite on this chain sampling verifier",
    )
    group.addoption(
        "--losslessness-greedy",
        metavar="PKG.MODULE:CALLABLE",
        default=None,
        help="run the property suite on this greedy verifier",
    )
    group.addoption(
        "--losslessness-tree",
        metavar="PKG.MODULE:CALLABLE",
        default=None,
        help="run the tree property suite on this tree (multi-draft) sampling verifier",
    )
    group.addoption(
        "--losslessness-tree-greedy",
        metavar="PKG.MODULE:CALLABLE",
        default=None,
        help="run the tree property suite on this greedy tree verifier",
    )
    group.addoption(
        "--losslessness-protocol",
        choices=SUITE_PROTOCOLS,
        default="chain",
        help="the protocol of --losslessness-target: chain (default), serving (raw logits, "
        "per-row requests; the serving suite checks it against its engine profile) or "
        "serving-tree (raw logits at every node, a request per tree; the tree suite's "
        "properties on its engine profile's law)",
    )
    group.addoption(
        "--losslessness-engine-profile",
        metavar="NAME",
        default=None,
        help="the engine profile a serving target claims, when the function has no "
        "engine_profile attribute",
    )
    group.addoption(
        "--losslessness-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds one call of a target may take; a longer call fails its test, and the "
        "target's later calls fail at once naming it (Hypothesis's shrinking does not wait "
        "out the timeout again; default: the audit's --timeout default)",
    )
    group.addoption(
        "--losslessness-in-process",
        action="store_true",
        default=False,
        help="debugging: run the targets in pytest's own process, not in a worker process",
    )
    add_profile_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Load the Hypothesis profile and, with a target, add the suite's modules to the run."""
    from strategies.profiles import configure_profile

    configure_profile(config)
    modules: list[str] = []
    protocol = config.getoption("losslessness_protocol")
    target = config.getoption("losslessness_target")
    if (target and protocol == "chain") or config.getoption("losslessness_greedy"):
        modules += SUITE_MODULES
    if target and protocol == "serving":
        modules += SERVING_SUITE_MODULES
    if target and protocol == "serving-tree":
        modules += SERVING_TREE_SUITE_MODULES
    if config.getoption("losslessness_tree") or config.getoption("losslessness_tree_greedy"):
        modules += TREE_SUITE_MODULES
    for module in modules:
        path = str(SUITE_DIRECTORY / module)
        if path not in config.args:
            config.args.append(path)


@pytest.fixture(scope="session")
def losslessness_target(request: pytest.FixtureRequest) -> SuiteTarget:
    """The targets named on the command line, each resolved before the first test runs
    (:meth:`SuiteTarget.load_named`)."""
    config = request.config
    target = SuiteTarget(
        config.getoption("losslessness_target"),
        config.getoption("losslessness_greedy"),
        config.getoption("losslessness_profile", default=None),
        tree_name=config.getoption("losslessness_tree"),
        greedy_tree_name=config.getoption("losslessness_tree_greedy"),
        timeout_s=config.getoption("losslessness_timeout"),
        in_process=config.getoption("losslessness_in_process"),
        protocol=config.getoption("losslessness_protocol"),
        engine_profile=config.getoption("losslessness_engine_profile"),
    )
    target.load_named()
    return target
