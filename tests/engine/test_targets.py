"""Target names: a ``pkg.module:callable`` that takes no arguments is a factory whose Adapter
is audited (as entry points may name one); a verifier function stays a verifier; a factory
returning anything else is an error naming what it returned."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from losslessness.adapters import AdapterNotFound
from losslessness.targets import load_adapter

MODULE = textwrap.dedent('''
    from losslessness.adapters import Adapter
    from losslessness.reference import verify

    def factory():
        return Adapter("built", "made by a factory", chain=verify)

    def not_a_factory(flag=True):
        return 42

    def verifier(target_probs, draft_probs, draft_token_ids, generator):
        return verify(target_probs, draft_probs, draft_token_ids, generator)
''')


@pytest.fixture
def module(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "factory_targets.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield "factory_targets"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("factory_targets", None)


def test_a_callable_without_arguments_is_a_factory_of_the_adapter_audited(module: str) -> None:
    """``module:factory`` gives the factory's Adapter; ``module:verifier`` a chain verifier."""
    built = load_adapter(f"{module}:factory")
    assert built.name == "built" and built.chain is not None
    wrapped = load_adapter(f"{module}:verifier")
    assert wrapped.name == f"{module}:verifier" and wrapped.chain is not None


def test_a_factory_returning_something_else_is_an_error_naming_it(module: str) -> None:
    """A callable without required arguments must build an Adapter: anything else is named."""
    with pytest.raises(AdapterNotFound, match="must return an Adapter; it returned a int"):
        load_adapter(f"{module}:not_a_factory")
