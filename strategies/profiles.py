"""Hypothesis settings profiles for the property suite: ``dev``, ``ci`` and ``nightly``.

=========  ============  ========  ===========  ======================================
profile    max_examples  deadline  derandomize  database / reporting
=========  ============  ========  ===========  ======================================
dev        25            default   no           local example database (replays failures)
ci         25            none      yes          no database; ``print_blob`` for replay
nightly    250           none      no           local example database
=========  ============  ========  ===========  ======================================

The profile is chosen by the environment variable :data:`PROFILE_ENV_VAR`
(``LOSSLESSNESS_HYPOTHESIS_PROFILE``), default :data:`DEFAULT_PROFILE`; the project's
``tests/conftest.py`` calls :func:`load_profile` once, before any test module is imported, so
modules that size a statistical budget from ``hypothesis.settings().max_examples`` see the
active profile.

The ``ci`` profile is derandomized: the same code runs the same cases on every machine, and a
failure prints a ``@reproduce_failure`` blob. Statistical samples never come from Hypothesis
(DESIGN.md section 5): tests seed their own generators from the case they were given.
"""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis.errors import InvalidArgument

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "PROFILE_ENV_VAR",
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
NIGHTLY_MAX_EXAMPLES = 250

settings.register_profile("dev", max_examples=DEV_MAX_EXAMPLES)
settings.register_profile(
    "ci",
    max_examples=CI_MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
)
settings.register_profile("nightly", max_examples=NIGHTLY_MAX_EXAMPLES, deadline=None)


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
    return chosen
