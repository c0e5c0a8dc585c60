"""pytest plugin: run the property suite against someone else's verifier.

Registered under the ``pytest11`` entry point, so installing losslessness makes these options
available to every pytest run::

    pytest --losslessness-target=pkg.module:verify [--losslessness-greedy=pkg.module:fn]
           [--losslessness-profile=ci]

With either target option the suite's test modules (:mod:`losslessness.suite`) join the
collection; without one, the plugin does nothing. Targets resolve like ``losslessness audit``
targets (registered adapter names work too). torch and the library are imported only when a
target is used, so the plugin costs nothing in unrelated pytest runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from losslessness.adapters import Adapter
    from losslessness.protocol import GreedyVerifier

SUITE_DIRECTORY = Path(__file__).parent / "suite"
SUITE_MODULES = ("test_chain.py", "test_greedy.py")


@dataclass(frozen=True)
class SuiteTarget:
    """The verifiers named on the command line, resolved lazily.

    Attributes:
        chain_name: ``--losslessness-target``, or None.
        greedy_name: ``--losslessness-greedy``, or None.
        profile: ``--losslessness-profile``, or None (then the environment variable decides).
    """

    chain_name: str | None
    greedy_name: str | None
    profile: str | None

    def _resolve(self, name: str | None, greedy: bool, option: str) -> Adapter:
        from losslessness.adapters import AdapterNotFound, AdapterUnavailable, resolve_adapter

        if name is None:
            pytest.skip(f"no {option} given")
        try:
            adapter = resolve_adapter(name, greedy=greedy)
        except (AdapterNotFound, AdapterUnavailable) as error:
            raise pytest.UsageError(f"{option}={name}: {error}") from error
        if (adapter.greedy if greedy else adapter.chain) is None:
            raise pytest.UsageError(
                f"{option}={name}: has no {'greedy' if greedy else 'chain'} verifier"
            )
        return adapter

    def chain(self) -> Adapter:
        """The chain target (skips the test when none was given)."""
        return self._resolve(self.chain_name, False, "--losslessness-target")

    def greedy(self) -> GreedyVerifier:
        """The greedy verifier (skips the test when none was given)."""
        adapter = self._resolve(self.greedy_name, True, "--losslessness-greedy")
        assert adapter.greedy is not None
        return adapter.greedy

    def replay(self, test_name: str) -> str:
        """One command line that reruns ``test_name`` on the same targets and profile."""
        parts = ["pytest"]
        if self.chain_name:
            parts.append(f"--losslessness-target={self.chain_name}")
        if self.greedy_name:
            parts.append(f"--losslessness-greedy={self.greedy_name}")
        parts.append(f"--losslessness-profile={self.profile or 'ci'}")
        parts.append(f"-k {test_name}")
        return " ".join(parts)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--losslessness-target``, ``--losslessness-greedy`` and ``--losslessness-profile``."""
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
    add_profile_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Load the Hypothesis profile and, with a target, add the suite's modules to the run."""
    from strategies.profiles import configure_profile

    configure_profile(config)
    if config.getoption("losslessness_target") or config.getoption("losslessness_greedy"):
        for module in SUITE_MODULES:
            path = str(SUITE_DIRECTORY / module)
            if path not in config.args:
                config.args.append(path)


@pytest.fixture(scope="session")
def losslessness_target(request: pytest.FixtureRequest) -> SuiteTarget:
    """The targets named on the command line."""
    config = request.config
    return SuiteTarget(
        config.getoption("losslessness_target"),
        config.getoption("losslessness_greedy"),
        config.getoption("losslessness_profile", default=None),
    )
