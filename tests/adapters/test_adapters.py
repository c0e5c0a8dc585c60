"""Target resolution: registered adapters through the entry-point group, ``pkg.module:callable``
resolved like ``python -m`` (current directory first), Adapter objects used as they are."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from losslessness.adapters import Adapter, AdapterNotFound
from losslessness.reference import verify, verify_greedy
from losslessness.targets import ENTRY_POINT_GROUP, registered_adapters, resolve_adapter


def test_builtin_adapters_are_registered_as_entry_points() -> None:
    """``reference`` and ``transformers`` are discovered through the entry-point group."""
    registered = registered_adapters()
    assert {"reference", "transformers"} <= set(registered)
    assert all(point.group == ENTRY_POINT_GROUP for point in registered.values())


def test_reference_adapter_has_both_protocols() -> None:
    """The reference adapter offers the chain and the greedy verifier."""
    adapter = resolve_adapter("reference")
    assert adapter.chain is verify and adapter.greedy is verify_greedy


def test_module_callable_is_chain_by_default_and_greedy_on_request() -> None:
    """A bare function is wrapped as a chain verifier, or a greedy one with ``greedy=True``
    (loaded in this process, to compare the functions themselves)."""
    chain = resolve_adapter("losslessness.reference:verify", in_process=True)
    greedy = resolve_adapter(
        "losslessness.reference:verify_greedy", greedy=True, in_process=True
    )
    assert chain.chain is verify and chain.greedy is None
    assert greedy.greedy is verify_greedy and greedy.chain is None


def test_module_callable_resolves_from_the_current_directory_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like ``python -m``: a module in the current directory is found without PYTHONPATH, and
    a module attribute that is an Adapter is used as it is."""
    (tmp_path / "my_impl_for_resolution.py").write_text(
        "from losslessness.adapters import Adapter\n"
        "from losslessness.reference import verify\n"
        "adapter = Adapter(name='mine', description='mine', chain=verify)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    resolved = resolve_adapter("my_impl_for_resolution:adapter")
    assert isinstance(resolved, Adapter) and resolved.name == "mine"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nonexistent_module_abc:verify", "cannot import"),
        ("losslessness.reference:nope", "no attribute"),
        ("losslessness.reference:", "expected 'pkg.module:callable'"),
        ("unregistered", "not a registered adapter"),
        ("losslessness.reference:PLACEHOLDER_NOT_CALLABLE", "no attribute"),
    ],
)
def test_unresolvable_targets_raise_adapter_not_found(name: str, message: str) -> None:
    """Every way a name can fail to resolve says what was wrong."""
    with pytest.raises(AdapterNotFound, match=message):
        resolve_adapter(name)


def test_adapter_needs_a_verifier() -> None:
    """An Adapter without any verifier is rejected."""
    with pytest.raises(
        ValueError,
        match="needs a chain, greedy, tree, greedy tree, serving or serving tree verifier, or an "
        "end-to-end target",
    ):
        Adapter(name="empty", description="")
