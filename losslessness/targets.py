"""Target names: the one place a name becomes an :class:`~losslessness.adapters.Adapter`, or
a placeholder saying why it did not load.

A name is a registered adapter (entry-point group ``losslessness.adapters``; this package
registers ``reference``, ``transformers`` and the engines), ``mutant/<name>`` (a mutant or
control of the zoo, :mod:`losslessness.zoo`), or ``pkg.module:callable``, imported as
``python -m`` would: the current directory first, then ``PYTHONPATH``; the callable is a
verifier, an Adapter, or a function without arguments that builds one. The audit, the plan
command, the nightly, the device checks and the pytest plugin all resolve through here.

Where a target runs is decided here too (:func:`runs_in_process`): the reference, the toy loops
and the zoo in the audit's own process, every other target in a worker process
(:mod:`losslessness.worker`), so that nothing it does can change the audit.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.metadata import EntryPoint, entry_points

from losslessness.adapters import Adapter, AdapterNotFound, AdapterUnavailable
from losslessness.protocol import PROTOCOLS
from losslessness.worker import TargetWorker, start_worker
from losslessness.zoo import mutant

ENTRY_POINT_GROUP = "losslessness.adapters"

IN_PROCESS_TARGETS = frozenset({"reference", "toy", "toy-tree"})
"""Registered adapters the audit ships whose code is all ours (the reference and the toy
decoding loops): they run in the audit's own process, like the zoo's ``mutant/<name>``
entries; every other target runs in a worker process (:mod:`losslessness.worker`)."""

STARTING_AT_ONCE = max(2, os.cpu_count() or 2)
"""Worker processes :func:`resolve_targets` starts loading at the same time."""

def registered_adapters() -> dict[str, EntryPoint]:
    """Adapters registered under the ``losslessness.adapters`` entry-point group, by name.

    An entry point names an :class:`Adapter` or a zero-argument callable returning one.
    """
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def _as_adapter(name: str, loaded: object, greedy: bool, protocol: str = "chain") -> Adapter:
    if isinstance(loaded, Adapter):
        return loaded
    if not callable(loaded):
        raise AdapterNotFound(f"{name}: {type(loaded).__name__} object is not callable")
    if _takes_no_arguments(loaded):
        # A factory, as an entry point may name (losslessness.adapters.e2e's engine targets):
        # no verifier protocol has a call without arguments.
        built = loaded()
        if not isinstance(built, Adapter):
            raise AdapterNotFound(
                f"{name}: takes no arguments, so it must return an Adapter; it returned a "
                f"{type(built).__name__}"
            )
        return built
    if protocol == "tree":
        return Adapter(name=name, description=f"{name} (tree protocol)", tree=loaded)
    if protocol in ("serving", "serving-tree"):
        profile = getattr(loaded, "engine_profile", None)
        if profile is not None and not isinstance(profile, str):
            raise AdapterNotFound(f"{name}: engine_profile must be a profile name (str)")
        serving = protocol == "serving"
        return Adapter(
            name=name, description=f"{name} ({protocol.replace('-', ' ')} protocol)",
            engine_profile=profile,
            serving=loaded if serving else None,  # type: ignore[arg-type]
            serving_tree=None if serving else loaded,  # type: ignore[arg-type]
        )
    if protocol == "greedy-tree":
        return Adapter(
            name=name, description=f"{name} (greedy tree protocol)", greedy_tree=loaded
        )
    if greedy or protocol == "greedy":
        return Adapter(name=name, description=f"{name} (greedy protocol)", greedy=loaded)
    return Adapter(name=name, description=f"{name} (chain protocol)", chain=loaded)


def _takes_no_arguments(function: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(parameter.default is not inspect.Parameter.empty for parameter in parameters)


def load_callable(spec: str) -> object:
    """Import ``pkg.module:attribute`` (dotted attributes allowed) the way ``python -m`` does.

    Raises:
        AdapterNotFound: malformed spec, module not importable, or attribute missing.
        AdapterUnavailable: the module exists but its import raised (a syntax error, an
            exception, ``sys.exit``): the target is named and audited as ERROR (exit 3), never
            a traceback under the LOSSY exit code.
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
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raise AdapterUnavailable(
            f"{spec!r}: importing {module_name!r} raised {type(error).__name__}: {error}"
        ) from error
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise AdapterNotFound(
                f"{spec!r}: module {module_name!r} has no attribute {attribute!r}"
            )
        value = getattr(value, part)
    return value


def runs_in_process(name: str) -> bool:
    """Whether target ``name`` runs in the audit's own process by default: the zoo's
    ``mutant/<name>`` entries and the :data:`IN_PROCESS_TARGETS` this package registers. Every
    other target (third-party adapters, ``pkg.module:callable``) runs in a worker process."""
    if name.startswith("mutant/"):
        return True
    if name not in IN_PROCESS_TARGETS:
        return False
    point = registered_adapters().get(name)
    return point is not None and point.value.startswith("losslessness.adapters.")


def load_adapter(name: str, *, greedy: bool = False, protocol: str = "chain") -> Adapter:
    """The adapter for a target name, loaded in this process (a worker process calls this for
    its target; see :func:`resolve_adapter` for the arguments and errors)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if name.startswith("mutant/"):
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


def _start(name: str, greedy: bool, protocol: str, in_process: bool | None) -> TargetWorker | None:
    """A started worker for ``name``, or None when it runs in this process.

    A name that cannot match anything (a malformed ``pkg.module:callable``, an unregistered
    adapter) is refused here, before any process starts.

    Raises:
        AdapterNotFound: such a name.
        ValueError: an unknown protocol.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if in_process if in_process is not None else runs_in_process(name):
        return None
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        if not module_name or not attribute:
            raise AdapterNotFound(f"{name!r}: expected 'pkg.module:callable'")
    elif not name.startswith("mutant/") and name not in registered_adapters():
        return None
    return start_worker(name, greedy=greedy, protocol=protocol, resolver=f"{__name__}:load_adapter")


def resolve_adapter(
    name: str, *, greedy: bool = False, protocol: str = "chain", in_process: bool | None = None
) -> Adapter:
    """The adapter for a target name: loaded here, or in a worker process whose proxies it holds.

    Args:
        name: a registered adapter name, ``mutant/<name>`` (a mutant of the zoo,
            :mod:`losslessness.zoo`) or ``pkg.module:callable``; the callable may
            be an :class:`Adapter` or a verifier function.
        greedy: a bare function follows the greedy protocol instead of the chain protocol.
        protocol: the protocol a bare function follows, one of :data:`PROTOCOLS`
            (``"tree"``: :class:`~losslessness.protocol.TreeVerifier`, ``"greedy-tree"``:
            :class:`~losslessness.protocol.GreedyTreeVerifier`); ``greedy=True`` is
            ``"greedy"``.
        in_process: True loads the target in this process (``--in-process``, the device
            checks), False in a worker process; None: :func:`runs_in_process` decides.

    Returns:
        The :class:`Adapter`.

    Raises:
        AdapterNotFound: nothing matches ``name``.
        AdapterUnavailable: the adapter exists but cannot load (e.g. package missing; its
            module raised, exited or crashed while being imported).
        ValueError: naming ``protocol``, when it is not one of :data:`PROTOCOLS`.
    """
    worker = _start(name, greedy, protocol, in_process)
    if worker is None:
        return load_adapter(name, greedy=greedy, protocol=protocol)
    return worker.adapter()


@dataclass(frozen=True)
class UnavailableTarget:
    """A target that could not be loaded, and why.

    Attributes:
        name: the target's name.
        reason: why it did not load (with the command that installs what is missing).
        named: the user named it (its verdict is ERROR); False for a registered adapter a run
            tried on its own (UNAVAILABLE: listed, deciding nothing).
    """

    name: str
    reason: str
    named: bool = True


def resolve_targets(
    names: Sequence[str],
    *,
    greedy: bool = False,
    tree: Sequence[str] = (),
    tree_greedy: Sequence[str] = (),
    default: Sequence[str] | None = None,
    in_process: bool | None = None,
    protocol: str | None = None,
) -> list[Adapter | UnavailableTarget]:
    """The targets of a run: adapters, or placeholders for those that did not load.

    Args:
        names: target names (bare functions among them follow the chain protocol, or the greedy
            one with ``greedy``).
        greedy: bare functions in ``names`` follow the greedy protocol.
        protocol: the protocol of bare functions in ``names`` (``serving``: the
            :class:`~losslessness.protocol.ServingVerifier`); None: chain, or greedy with
            ``greedy``.
        tree: bare functions in the tree protocol (``--tree``).
        tree_greedy: bare functions in the greedy tree protocol (``--tree-greedy``).
        default: the names audited when ``names``, ``tree`` and ``tree_greedy`` are all empty
            (the audit's defaults, as named targets); None: every registered adapter, each one
            UNAVAILABLE rather than ERROR when it cannot load here (the nightly).
        in_process: as for :func:`resolve_adapter`; the worker processes start together, so
            their loading overlaps.

    Returns:
        One entry per name, in order: its adapter, or an :class:`UnavailableTarget`.

    Raises:
        ValueError: naming ``targets``: a name that matches nothing, or repeated names.
    """
    wanted = [(name, protocol or ("greedy" if greedy else "chain")) for name in names]
    wanted += [(name, "tree") for name in tree]
    wanted += [(name, "greedy-tree") for name in tree_greedy]
    named = bool(wanted) or default is not None
    if not wanted:
        fallback = sorted(registered_adapters()) if default is None else list(default)
        wanted = [(name, "chain") for name in fallback]
    listed = [name for name, _ in wanted]
    if len(set(listed)) != len(listed):
        raise ValueError(f"targets: names repeat: {listed}")
    resolved: dict[int, Adapter | UnavailableTarget] = {}

    def settle(index: int, load: Callable[[], Adapter]) -> None:
        name = wanted[index][0]
        try:
            resolved[index] = load()
        except AdapterNotFound as error:
            raise ValueError(f"targets: {error}") from error
        except AdapterUnavailable as error:
            resolved[index] = UnavailableTarget(name, str(error), named=named)

    isolated: list[int] = []
    for index, (name, protocol) in enumerate(wanted):
        if in_process if in_process is not None else runs_in_process(name):
            settle(index, partial(load_adapter, name, protocol=protocol))
        else:
            isolated.append(index)
    # Workers load a few at a time: every one imports torch, and a night tries every
    # registered adapter.
    for first in range(0, len(isolated), STARTING_AT_ONCE):
        batch = isolated[first : first + STARTING_AT_ONCE]
        workers: dict[int, TargetWorker] = {}
        try:
            for index in batch:
                name, protocol = wanted[index]
                worker = _start(name, False, protocol, False)
                if worker is None:
                    # A name nothing matches: load_adapter says so without importing anything.
                    settle(index, partial(load_adapter, name, protocol=protocol))
                else:
                    workers[index] = worker
            for index, worker in workers.items():
                settle(index, worker.adapter)
        except BaseException:
            for worker in workers.values():
                worker.close()
            raise
    return [resolved[index] for index in range(len(wanted))]


__all__ = [
    "ENTRY_POINT_GROUP",
    "IN_PROCESS_TARGETS",
    "UnavailableTarget",
    "load_adapter",
    "load_callable",
    "registered_adapters",
    "resolve_adapter",
    "resolve_targets",
    "runs_in_process",
]
