"""Hypothesis settings profiles for the property suite: ``dev``, ``ci`` and ``nightly``.

=========  ============  ========  ===========  ======================================
profile    max_examples  deadline  derandomize  database / reporting
=========  ============  ========  ===========  ======================================
dev        25            default   no           local example database (replays failures)
ci         25            none      yes          no database; ``print_blob`` for replay
nightly    250           none      no           local example database
=========  ============  ========  ===========  ======================================

``nightly`` runs 10x ``ci``'s examples.

The profile is chosen by the pytest option ``--losslessness-profile NAME`` when given, else by
the environment variable :data:`PROFILE_ENV_VAR` (``LOSSLESSNESS_HYPOTHESIS_PROFILE``), else
:data:`DEFAULT_PROFILE`. A ``conftest.py`` (or a pytest plugin) adopts both with two hooks::

    from strategies.profiles import add_profile_option, configure_profile

    def pytest_addoption(parser):
        add_profile_option(parser)

    def pytest_configure(config):
        configure_profile(config)

``pytest_configure`` runs before test modules are imported, so modules that size a statistical
budget from ``hypothesis.settings().max_examples`` at import see the active profile. Outside
pytest, :func:`load_profile` does the same from the environment variable.

The ``ci`` profile is derandomized: the same code runs the same cases on every machine, and a
failure prints a ``@reproduce_failure`` blob. Statistical samples never come from Hypothesis
(docs/architecture.md, 'Statistical method'): tests seed their own generators from the case they
were given.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import TYPE_CHECKING

from hypothesis import settings
from hypothesis.errors import InvalidArgument

if TYPE_CHECKING:
    import pytest

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "PROFILE_ENV_VAR",
    "PROFILE_OPTION",
    "active_profile",
    "add_profile_option",
    "configure_profile",
    "load_profile",
]

PROFILES: tuple[str, ...] = ("dev", "ci", "nightly")
"""Names of the registered profiles, cheapest first."""

PROFILE_ENV_VAR = "LOSSLESSNESS_HYPOTHESIS_PROFILE"
"""Environment variable naming the profile :func:`load_profile` selects."""

DEFAULT_PROFILE = "dev"
"""Profile used when :data:`PROFILE_ENV_VAR` is unset or empty."""

DEV_MAX_EXAMPLES = 25
CI_MAX_EXAMPLES = 25
NIGHTLY_MAX_EXAMPLES = 10 * CI_MAX_EXAMPLES

PROFILE_OPTION = "--losslessness-profile"
"""pytest option naming the profile; it overrides :data:`PROFILE_ENV_VAR`."""

_PROFILE_DEST = "losslessness_profile"
_active: list[str] = []

# Hypothesis loads its own ``ci`` profile as the default when it detects a CI machine; deriving
# from the pristine ``default`` profile keeps ours identical on every machine.
_PRISTINE = settings.get_profile("default")
settings.register_profile("dev", _PRISTINE, max_examples=DEV_MAX_EXAMPLES)
settings.register_profile(
    "ci",
    _PRISTINE,
    max_examples=CI_MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
)
settings.register_profile("nightly", _PRISTINE, max_examples=NIGHTLY_MAX_EXAMPLES, deadline=None)


def load_profile(name: str | None = None) -> str:
    """Load one of :data:`PROFILES` as Hypothesis's default settings.

    Args:
        name: the profile to load; ``None`` reads :data:`PROFILE_ENV_VAR`, falling back to
            :data:`DEFAULT_PROFILE` when it is unset or empty.

    Returns:
        The name of the profile now active.

    Raises:
        hypothesis.errors.InvalidArgument: naming ``name`` (or the environment variable) when
            the profile is not one of :data:`PROFILES`.
    """
    if name is None:
        source = PROFILE_ENV_VAR
        chosen = os.environ.get(PROFILE_ENV_VAR, "").strip() or DEFAULT_PROFILE
    else:
        source = "name"
        chosen = name
    if chosen not in PROFILES:
        raise InvalidArgument(f"{source}={chosen!r} must be one of {PROFILES}")
    settings.load_profile(chosen)
    _active[:] = [chosen]
    return chosen


def active_profile() -> str | None:
    """Name of the profile last loaded by :func:`load_profile`, or None if none was."""
    return _active[0] if _active else None


def add_profile_option(parser: pytest.Parser) -> None:
    """Register ``--losslessness-profile NAME`` (choices :data:`PROFILES`) with pytest.

    Call it from a ``pytest_addoption`` hook. Registering twice (a conftest and a plugin both
    calling it) is harmless: the second call does nothing.
    """
    with suppress(ValueError):  # already registered by another conftest or plugin
        parser.getgroup("losslessness").addoption(
            PROFILE_OPTION,
            dest=_PROFILE_DEST,
            choices=PROFILES,
            default=None,
            metavar="NAME",
            help=(
                f"Hypothesis settings profile, one of {', '.join(PROFILES)} "
                f"(overrides ${PROFILE_ENV_VAR}; default {DEFAULT_PROFILE})"
            ),
        )


def configure_profile(config: pytest.Config) -> str:
    """Load the profile named by ``--losslessness-profile`` if given, else by
    :data:`PROFILE_ENV_VAR` (else :data:`DEFAULT_PROFILE`). Call it from ``pytest_configure``.

    Returns:
        The name of the profile now active.

    Raises:
        hypothesis.errors.InvalidArgument: naming the environment variable when it names no
            profile.
    """
    chosen = config.getoption(_PROFILE_DEST, default=None)
    return load_profile(chosen if isinstance(chosen, str) else None)
