"""Resolving a target name to an :class:`Adapter`.

A name is either a registered adapter (entry-point group ``losslessness.adapters``; this
package registers ``reference`` and ``transformers``), ``mutant/<name>`` (the mutant zoo), or
``pkg.module:callable``, imported as
``python -m`` would: the current directory first, then ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import EntryPoint, entry_points

from losslessness.adapters.base import Adapter, AdapterNotFound, AdapterUnavailable

ENTRY_POINT_GROUP = "losslessness.adapters"


def registered_adapters() -> dict[str, EntryPoint]:
    """Adapters registered under the ``losslessness.adapters`` entry-point group, by name.

    An entry point names an :class:`Adapter` or a zero-argument callable returning one.
    """
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


PROTOCOLS = ("chain", "greedy", "tree", "greedy-tree")
"""The protocols a bare ``pkg.module:function`` may follow (:func:`resolve_adapter`)."""


def _as_adapter(name: str, loaded: object, greedy: bool, protocol: str = "chain") -> Adapter:
    if isinstance(loaded, Adapter):
        return loaded
    if not callable(loaded):
        raise AdapterNotFound(f"{name}: {type(loaded).__name__} object is not callable")
    if protocol == "tree":
        return Adapter(name=name, description=f"{name} (tree protocol)", tree=loaded)
    if protocol == "greedy-tree":
        return Adapter(
            name=name, description=f"{name} (greedy tree protocol)", greedy_tree=loaded
        )
    if greedy or protocol == "greedy":
        return Adapter(name=name, description=f"{name} (greedy protocol)", greedy=loaded)
    return Adapter(name=name, description=f"{name} (chain protocol)", chain=loaded)


def load_callable(spec: str) -> object:
    """Import ``pkg.module:attribute`` (dotted attributes allowed) the way ``python -m`` does.

    Raises:
        AdapterNotFound: malformed spec, module not importable, or attribute missing.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AdapterNotFound(f"{spec!r}: expected 'pkg.module:callable'")
    cwd = os.getcwd()
    if cwd not in sys.path[:1]:
        sys.path.insert(0, cwd)
    try:
        value: object = importlib.import_module(module_name)
    except ImportError as error:
        raise AdapterNotFound(f"{spec!r}: cannot import {module_name!r}: {error}") from error
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise AdapterNotFound(
                f"{spec!r}: module {module_name!r} has no attribute {attribute!r}"
            )
        value = getattr(value, part)
    return value


def resolve_adapter(name: str, *, greedy: bool = False, protocol: str = "chain") -> Adapter:
    """The adapter for a target name.

    Args:
        name: a registered adapter name, ``mutant/<name>`` (a mutant of the zoo,
            :mod:`losslessness.zoo`) or ``pkg.module:callable``; the callable may
            be an :class:`Adapter` or a verifier function.
        greedy: a bare function follows the greedy protocol instead of the chain protocol.
        protocol: the protocol a bare function follows, one of :data:`PROTOCOLS`
            (``"tree"``: :class:`~losslessness.protocol.TreeVerifier`, ``"greedy-tree"``:
            :class:`~losslessness.protocol.GreedyTreeVerifier`); ``greedy=True`` is
            ``"greedy"``.

    Returns:
        The :class:`Adapter`.

    Raises:
        AdapterNotFound: nothing matches ``name``.
        AdapterUnavailable: the adapter exists but cannot load here (e.g. package missing).
        ValueError: naming ``protocol``, when it is not one of :data:`PROTOCOLS`.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if name.startswith("mutant/"):
        # Imported here: the zoo wraps its verifiers in this package's Adapter, so it sits above
        # the adapters and a module-level import would be a cycle.
        from losslessness.zoo import mutant

        return mutant(name).adapter
    if ":" in name:
        return _as_adapter(name, load_callable(name), greedy, protocol)
    registered = registered_adapters()
    if name not in registered:
        known = ", ".join(sorted(registered)) or "none"
        raise AdapterNotFound(
            f"{name!r}: not a registered adapter (registered: {known}) nor 'pkg.module:callable'"
        )
    try:
        loaded = registered[name].load()
    except ImportError as error:
        raise AdapterUnavailable(f"{name!r}: its module cannot be imported: {error}") from error
    adapter = loaded if isinstance(loaded, Adapter) else loaded() if callable(loaded) else None
    if not isinstance(adapter, Adapter):
        raise AdapterNotFound(f"{name!r}: entry point does not give an Adapter")
    return adapter
