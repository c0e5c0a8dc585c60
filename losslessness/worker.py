"""A target in its own worker process: nothing the target does (exit, crash, hang, threads,
monkeypatching the auditor, writing into its inputs) can change the audit's state or verdict.

The parent never imports the target's module. :class:`TargetWorker` starts a fresh Python
process (``python -c``, not ``multiprocessing``'s spawn, which would run the parent's own main
script again in the child: a user's driver without a ``__main__`` guard, pytest's or the CLI's
entry point), connected by a socket pair, SIGINT ignored (the parent alone handles Ctrl-C) and
killed with its parent (``PR_SET_PDEATHSIG`` on Linux). It resolves the target itself
(``WorkerSpec.resolver``, :func:`losslessness.targets.load_adapter`) and sends back what the
parent needs to plan a run: the adapter's plain fields, which verifiers it has (with their
names and declared verification) and its end-to-end targets' fields. The parent builds an
:class:`~losslessness.adapters.Adapter` of :class:`RemoteCallable` proxies from it
(:meth:`TargetWorker.adapter`).

One call of a proxy writes every tensor argument into one shared-memory block (grown as
needed, reused across calls; an argument whose tensor is the very storage, shape, strides and
version counter the previous call wrote, and found intact, is not copied again), sends a small
message (the tensors' places, the other arguments, each ``torch.Generator``'s state) and waits
at most the call's timeout. The worker views the block as tensors (``torch.frombuffer``),
rebuilds the generators from their states, calls the target and sends back its outputs as numpy
arrays with the generators' new states, which the parent sets on its own generators: draws
after a call are bit-identical to an in-process call. After every call the parent compares the
block with what it wrote: a target that wrote into an input is a :class:`ProtocolViolation`.

A call past its timeout kills the worker (SIGKILL, never waited on more than a moment) and
raises :class:`TargetTimeout`; a worker that exits or dies by a signal during a call raises
:class:`TargetCrashed`; the next call starts a fresh worker. The target's exceptions come back
with their type's name, message and traceback (:class:`TargetRaised`); those the engine treats
specially keep their types (:class:`~losslessness.adapters.NotApplicable`,
:class:`~losslessness.protocol.InvalidInputError`, :class:`ProtocolViolation`). Replies are
read with an unpickler that builds only numpy arrays and plain values, so a hostile worker
cannot run code in the parent. Every worker is killed at interpreter exit (and by
:func:`shutdown_workers`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import io
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslessness.adapters import (
    Adapter,
    AdapterNotFound,
    AdapterUnavailable,
    EndToEndTarget,
    NotApplicable,
)
from losslessness.adapters.e2e.process import die_with_parent
from losslessness.config import DEFAULT_TIMEOUT_S
from losslessness.protocol import (
    GeneratesBatches,
    InvalidInputError,
    ReportsAcceptedLengths,
    ReportsDraftCounts,
    ReportsLawAgreement,
)
from losslessness.reference.block import VERIFICATION_ATTRIBUTE, declared_verification

START_TIMEOUT_S = DEFAULT_TIMEOUT_S
"""Seconds a worker may take to start and load its target (importing torch alone takes 2-4 s
on a loaded 2-core machine; transformers' tiny models a few more)."""

KILL_WAIT_S = 1.0
"""Most seconds the parent waits for a killed worker to be reaped."""

_ALIGNMENT = 64
"""Byte alignment of every tensor in the shared-memory block (a cache line)."""

VERIFIER_FIELDS = ("chain", "greedy", "tree", "greedy_tree", "serving", "serving_tree")
"""The :class:`~losslessness.adapters.Adapter` fields that hold a verifier."""

_INTEGER_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtypes by item size: tensors are copied and compared as their bits (NaN-safe,
bfloat16 included)."""


class ProtocolViolation(Exception):
    """The verifier broke its protocol: it returned something that is not a ``[B, k+1]``
    integer array (or a tree output pair), or it wrote into one of its input tensors."""


class TargetTimeout(TimeoutError):
    """A call of the target took longer than the run's per-call timeout (``--timeout``).

    Attributes:
        worker_killed: the target ran in a worker process, which was killed: the next call
            starts a fresh one, so the target is not hung for the rest of the run (an
            in-process call that timed out may still be running in the audit's own thread).
    """

    def __init__(self, message: str, worker_killed: bool = False) -> None:
        super().__init__(message)
        self.worker_killed = worker_killed


class TargetCrashed(RuntimeError):
    """The target's worker process exited or was killed by a signal during a call (or could
    not be started again); the message names the exit code or the signal."""


class TargetRaised(Exception):
    """An exception the target raised in its worker process, by its type's name.

    Attributes:
        type_name: the exception's class name (``RuntimeError``).
        message: ``str()`` of the exception.
        location: ``"file:line"`` where it was raised, or ``""``.
        remote_traceback: the worker's formatted traceback.
    """

    def __init__(self, type_name: str, message: str, location: str, remote_traceback: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.location = location
        self.remote_traceback = remote_traceback


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to load a target (picklable).

    Attributes:
        name: the target's name (a registered adapter, ``mutant/<name>``, ``pkg.module:fn``).
        greedy: a bare function follows the greedy protocol.
        protocol: the protocol a bare function follows (:data:`losslessness.protocol.PROTOCOLS`).
        resolver: ``"module:function"`` that loads the target in the worker,
            ``function(name, greedy=..., protocol=...)``.
        threads: torch's intra-op threads in the worker (the parent's count).
        path: the parent's ``sys.path`` (a ``pkg.module:fn`` target imports as it would there).
    """

    name: str
    greedy: bool
    protocol: str
    resolver: str
    threads: int = 1
    path: tuple[str, ...] = ()


def _named_arguments(
    args: Sequence[Any], kwargs: dict[str, Any], names: Sequence[str]
) -> list[tuple[str, Any]]:
    """A call's arguments with their names: ``names`` for the positional ones (``argument i``
    past them), then the keywords."""
    return [(names[i] if i < len(names) else f"argument {i}", value)
            for i, value in enumerate(args)] + list(kwargs.items())


def _describe_inputs(named: Sequence[tuple[str, Any]]) -> str:
    """``target_probs [2, 4, 16] float64, ...``: the shapes and dtypes of a call's tensors (a
    hung call's inputs, named in the errors of the calls after it)."""
    described = [
        f"{name} {list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
        for name, value in named
        if isinstance(value, torch.Tensor)
    ]
    return ", ".join(described) or "(no tensors)"


def _exit_description(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _reap(process: subprocess.Popen[bytes]) -> int | None:
    """The process's exit code once it ends, waiting at most :data:`KILL_WAIT_S` (None: still
    running)."""
    try:
        return process.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


# --- Replies: plain values and numpy arrays only -------------------------------------------

_NUMPY_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
}


class _ReplyUnpickler(pickle.Unpickler):
    """Builds numpy arrays and builtin values; refuses every other global (a reply that names
    one is malformed: a hostile worker cannot make the parent call anything)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_GLOBALS or module.startswith("numpy.dtypes"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"reply names {module}.{name}")


def _read_reply(data: bytes) -> Any:
    return _ReplyUnpickler(io.BytesIO(data)).load()


def _encode(value: Any) -> Any:
    """A target's return value as tagged plain values (tensors and arrays as numpy arrays).

    Raises:
        ProtocolViolation: a value that is neither plain nor array-like.
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype in (torch.bfloat16, torch.float16):
            tensor = tensor.float()
        return ("tensor", tensor.resolve_conj().resolve_neg().numpy())
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise ProtocolViolation("output is an array of Python objects, not of numbers")
        return ("array", value)
    if value is None or isinstance(value, (bool, int, float, str, bytes, np.generic)):
        return ("value", value.item() if isinstance(value, np.generic) else value)
    if isinstance(value, tuple):
        return ("tuple", [_encode(item) for item in value])
    if isinstance(value, list):
        return ("list", [_encode(item) for item in value])
    if isinstance(value, dict):
        return ("dict", [(_encode(key), _encode(item)) for key, item in value.items()])
    array = np.asarray(value)
    if array.dtype == object:
        raise ProtocolViolation(f"output is a {type(value).__name__}, not array-like")
    return ("array", array)


def _decode(tagged: Any) -> Any:
    kind, payload = tagged
    if kind == "tensor":
        return torch.from_numpy(np.array(payload))
    if kind in ("array", "value"):
        return payload
    if kind == "tuple":
        return tuple(_decode(item) for item in payload)
    if kind == "list":
        return [_decode(item) for item in payload]
    if kind == "dict":
        return {_decode(key): _decode(item) for key, item in payload}
    raise ValueError(f"unknown reply tag {kind!r}")


def _plain_field(value: Any) -> Any:
    """An adapter field as a plain value: ``("enum", module, class, value)`` for an enum of
    this package, the value itself for builtin scalars and tuples of them.

    Raises:
        TypeError: any other value.
    """
    if isinstance(value, Enum) and type(value).__module__.startswith("losslessness."):
        return ("enum", type(value).__module__, type(value).__qualname__, value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    if isinstance(value, tuple):
        return ("tuple", [_plain_field(item) for item in value])
    raise TypeError(f"adapter field of type {type(value).__name__} cannot leave the worker")


def _read_field(tagged: Any) -> Any:
    kind = tagged[0]
    if kind == "enum":
        _, module_name, class_name, value = tagged
        # Only an enum of a module of this package the parent has already imported: a reply
        # never makes the parent import anything.
        module = sys.modules.get(module_name) if module_name.startswith("losslessness.") else None
        enum_class = getattr(module, class_name, None)
        if not (isinstance(enum_class, type) and issubclass(enum_class, Enum)):
            raise TypeError(f"{module_name}.{class_name} is not an enum of losslessness")
        return enum_class(value)
    if kind == "tuple":
        return tuple(_read_field(item) for item in tagged[1])
    return tagged[1]


# --- The worker process ---------------------------------------------------------------------


def _describe(adapter: Adapter) -> dict[str, Any]:
    """What the parent needs of ``adapter``: its plain fields, its verifiers (name and declared
    verification) and its end-to-end targets (fields, vocabulary, accepted-length counts)."""
    fields: dict[str, Any] = {}
    verifiers: dict[str, tuple[str, str]] = {}
    engines: list[dict[str, Any]] = []
    for field in dataclasses.fields(adapter):
        value = getattr(adapter, field.name)
        if field.name in VERIFIER_FIELDS:
            if value is not None:
                name = getattr(value, "__qualname__", type(value).__name__)
                verifiers[field.name] = (str(name), declared_verification(value))
        elif field.name == "end_to_end":
            for target in value:
                generator = target.generator
                engines.append(
                    {
                        "fields": {
                            item.name: _plain_field(getattr(target, item.name))
                            for item in dataclasses.fields(target)
                            if item.name != "generator"
                        },
                        "vocab_size": int(generator.vocab_size),
                        "reports_accepted": isinstance(generator, ReportsAcceptedLengths),
                        "reports_draft_counts": isinstance(generator, ReportsDraftCounts),
                        "reports_law_agreement": isinstance(generator, ReportsLawAgreement),
                        "batch_size": (
                            generator.batch_size
                            if isinstance(generator, GeneratesBatches) else None
                        ),
                    }
                )
        else:
            fields[field.name] = _plain_field(value)
    return {"fields": fields, "verifiers": verifiers, "end_to_end": engines}


def _error_reply(error: BaseException) -> dict[str, Any]:
    """An exception of the target as plain values (its kind decides how the parent rebuilds
    it)."""
    try:
        message = str(error)
    except Exception:
        message = f"<{type(error).__name__} whose str() raised>"
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    reply: dict[str, Any] = {
        "kind": "raised",
        "type": type(error).__name__,
        "message": message,
        "location": f"{where.filename}:{where.lineno}" if where else "",
        "traceback": "".join(traceback.format_exception(error)),
    }
    if isinstance(error, NotApplicable):
        reply.update(kind="not-applicable", reason=error.reason, argument=error.argument)
    elif isinstance(error, InvalidInputError):
        reply.update(kind="invalid-input", argument=error.argument, problem=error.problem)
    elif isinstance(error, ProtocolViolation):
        reply.update(kind="protocol")
    return reply


class _Memory:
    """The worker's mappings of the parent's shared-memory blocks, by name."""

    def __init__(self) -> None:
        self.blocks: dict[str, SharedMemory] = {}

    def block(self, name: str) -> SharedMemory:
        if name not in self.blocks:
            for old_name in list(self.blocks):
                # A target that kept a view of an old block keeps it mapped.
                with contextlib.suppress(BufferError):
                    self.blocks.pop(old_name).close()
            block = self.blocks[name] = SharedMemory(name=name)
            # Attaching registers the block with this process's resource tracker, which would
            # unlink it when the worker exits: the parent owns it.
            resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
        return self.blocks[name]


def _argument(value: Any, memory: _Memory, block_name: str | None,
              generators: list[torch.Generator]) -> Any:
    kind = value[0]
    if kind == "tensor":
        _, offset, shape, dtype_name = value
        dtype = getattr(torch, dtype_name)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        assert block_name is not None
        buffer = memory.block(block_name).buf
        return torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset).view(shape)
    if kind == "generator":
        _, device, state = value
        generator = torch.Generator(device=device)
        generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        generators.append(generator)
        return generator
    return value[1]


def _target_of(adapter: Adapter, path: tuple[Any, ...]) -> Callable[..., Any]:
    if path[0] == "end_to_end":
        function: Callable[..., Any] = getattr(adapter.end_to_end[path[1]].generator, path[2])
        return function
    verifier: Callable[..., Any] = getattr(adapter, path[0])
    return verifier


def serve(descriptor: int) -> None:
    """The worker process's main function (``python -c``): read the :class:`WorkerSpec` from
    the socket ``descriptor``, load the target, say what it is, then answer calls until the
    parent's end closes (or the parent kills it)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connection = Connection(descriptor)
    spec: WorkerSpec = pickle.loads(connection.recv_bytes())
    sys.path[:] = list(spec.path)
    torch.set_num_threads(spec.threads)
    try:
        module_name, _, function_name = spec.resolver.partition(":")
        resolver = getattr(importlib.import_module(module_name), function_name)
        adapter = resolver(spec.name, greedy=spec.greedy, protocol=spec.protocol)
        description = _describe(adapter)
    except AdapterNotFound as error:
        connection.send_bytes(pickle.dumps(("not-found", str(error))))
        return
    except BaseException as error:
        reason = str(error) if isinstance(error, AdapterUnavailable) else (
            f"{spec.name!r}: loading it raised {type(error).__name__}: {error}"
        )
        connection.send_bytes(pickle.dumps(("unavailable", reason)))
        return
    connection.send_bytes(pickle.dumps(("ready", description)))
    memory = _Memory()
    while True:
        try:
            message = pickle.loads(connection.recv_bytes())
        except EOFError:
            return
        kind, path, args, kwargs, block_name = message
        if kind == "threads":
            # No reply: the parent's next call finds the new count in force.
            torch.set_num_threads(path)
            continue
        generators: list[torch.Generator] = []
        try:
            call_args = [_argument(a, memory, block_name, generators) for a in args]
            call_kwargs = {
                key: _argument(a, memory, block_name, generators) for key, a in kwargs.items()
            }
            result = _target_of(adapter, path)(*call_args, **call_kwargs)
            reply: tuple[Any, ...] = ("ok", _encode(result))
            del call_args, call_kwargs, result
        except BaseException as error:
            reply = ("error", _error_reply(error))
        states = [bytes(generator.get_state().numpy()) for generator in generators]
        connection.send_bytes(pickle.dumps((*reply, states)))


# --- The parent's side ----------------------------------------------------------------------


_Placed = tuple[str, torch.Tensor, int]
"""A tensor argument of a call: its name, the tensor, its offset in the block."""


@dataclass
class _Written:
    """A tensor argument the previous call wrote into the block and found intact after it:
    the same tensor (held, so its memory cannot be reused) at the same place needs no copy."""

    source: torch.Tensor
    key: tuple[Any, ...]
    offset: int


def _tensor_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (
        tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype,
        tensor._version, tensor.device,
    )


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat integer array (contiguous CPU copy only when needed)."""
    flat = tensor.detach().cpu().contiguous()
    integer = _INTEGER_OF_SIZE.get(flat.element_size(), torch.int64)
    return flat.view(integer).numpy().reshape(-1)


_LIVE: set[TargetWorker] = set()
_LIVE_LOCK = threading.Lock()


class TargetWorker:
    """One target in a worker process, started with :meth:`start`, loaded with
    :meth:`adapter` and called through the proxies of the adapter that returns.

    Args:
        spec: the target to load.
        timeout_s: seconds a direct call of a proxy may take (calls through
            :func:`losslessness.engine.draw.call_target` give their own).

    Attributes:
        timeout_option: the option a timeout message names (``--timeout``).
        timeouts_are_final: once a call of a path (``("chain",)``) has timed out, later calls
            of that path raise :class:`TargetTimeout` at once, naming the call that hung, instead
            of waiting out the timeout again (the property suite sets it: Hypothesis replays and
            shrinks a failing example, and a verifier that hangs cost the timeout, 300 s by
            default, on every attempt). The audit leaves it off: each case's first timeout
            already ends that case's calls.
    """

    def __init__(self, spec: WorkerSpec, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._memory: SharedMemory | None = None
        self._written: dict[str, _Written] = {}
        self._hung: dict[tuple[Any, ...], str] = {}
        self.timeout_option = "--timeout"
        self.timeouts_are_final = False

    @property
    def name(self) -> str:
        """The target's name."""
        return self.spec.name

    @property
    def pid(self) -> int | None:
        """The worker's process id, None when none is running."""
        return self._process.pid if self._process is not None else None

    def start(self) -> TargetWorker:
        """Start the worker process (without waiting for it to load the target)."""
        parent_end, child_end = socket.socketpair()
        root = str(Path(__file__).resolve().parents[1])
        inherited = os.environ.get("PYTHONPATH")
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, inherited] if inherited else [root]),
        }
        with child_end:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"from losslessness.worker import serve; serve({child_end.fileno()})",
                ],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                env=environment,
            )
        connection = Connection(parent_end.detach())
        connection.send_bytes(pickle.dumps(self.spec))
        self._process, self._connection = process, connection
        self._written.clear()
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    def _wait_loaded(self) -> dict[str, Any]:
        """The worker's description of its target, once loaded.

        Raises:
            AdapterNotFound: the name matches nothing.
            AdapterUnavailable: loading failed, or the worker exited or hung while loading.
        """
        assert self._connection is not None and self._process is not None
        try:
            ready = self._connection.poll(START_TIMEOUT_S)
            reply = _read_reply(self._connection.recv_bytes()) if ready else None
        except (EOFError, OSError, pickle.UnpicklingError):
            code = _reap(self._process)
            self.kill()
            raise AdapterUnavailable(
                f"{self.name!r}: its worker process {_exit_description(code)} while loading it"
            ) from None
        except BaseException:
            self.kill()
            raise
        if reply is None:
            self.kill()
            raise AdapterUnavailable(
                f"{self.name!r}: not loaded within {START_TIMEOUT_S:g} s in its worker process"
            )
        kind, payload = reply
        if kind == "ready":
            description: dict[str, Any] = payload
            return description
        self.kill()
        if kind == "not-found":
            raise AdapterNotFound(payload)
        raise AdapterUnavailable(payload)

    def adapter(self) -> Adapter:
        """The target as an :class:`~losslessness.adapters.Adapter` whose verifiers and
        generators are proxies calling this worker (starting it if needed).

        Raises:
            AdapterNotFound: the name matches nothing.
            AdapterUnavailable: the target could not be loaded in the worker.
        """
        if self._process is None:
            self.start()
        try:
            description = self._wait_loaded()
        except BaseException:
            self.close()
            raise
        try:
            return self._adapter_of(description)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            self.close()
            raise AdapterUnavailable(
                f"{self.name!r}: its worker process described it wrongly: {error}"
            ) from None

    def _adapter_of(self, description: dict[str, Any]) -> Adapter:
        fields = {key: _read_field(value) for key, value in description["fields"].items()}
        for field, (name, verification) in description["verifiers"].items():
            if field not in VERIFIER_FIELDS:
                raise KeyError(field)
            fields[field] = RemoteCallable(self, (field,), str(name), verification)
        fields["end_to_end"] = tuple(
            EndToEndTarget(
                **{key: _read_field(value) for key, value in engine["fields"].items()},
                generator=_remote_generator(self, index, engine),
            )
            for index, engine in enumerate(description["end_to_end"])
        )
        return Adapter(**fields)

    def _ensure_running(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        if self._process is not None:
            self.kill()
        self.start()
        try:
            self._wait_loaded()
        except (AdapterNotFound, AdapterUnavailable) as error:
            raise TargetCrashed(f"could not start {self.name!r} again: {error}") from None

    def _block(self, size: int) -> SharedMemory:
        """The shared-memory block, at least ``size`` bytes (a new, larger one replaces it)."""
        if self._memory is None or self._memory.size < size:
            old = 0 if self._memory is None else self._memory.size
            self._release_memory()
            self._memory = SharedMemory(create=True, size=max(size, 2 * old, 1 << 16))
            self._written.clear()
        return self._memory

    def _release_memory(self) -> None:
        if self._memory is not None:
            self._memory.close()
            # A hostile target may unlink it first; then there is nothing left to free.
            with contextlib.suppress(FileNotFoundError):
                self._memory.unlink()
            self._memory = None

    def _lay_out(
        self, args: Sequence[Any], kwargs: dict[str, Any], argument_names: Sequence[str]
    ) -> tuple[list[Any], dict[str, Any], list[_Placed], list[torch.Generator]]:
        """Encode a call's arguments: tensors into the block (copied unless already there),
        generators as their states, the rest as they are."""
        named = _named_arguments(args, kwargs, argument_names)
        offsets: dict[str, int] = {}
        end = 0
        for key, value in named:
            if isinstance(value, torch.Tensor) and value.numel():
                offsets[key] = end
                end += -(-value.numel() * value.element_size() // _ALIGNMENT) * _ALIGNMENT
        memory = self._block(end) if end else self._memory
        tensors: list[tuple[str, torch.Tensor, int]] = []
        generators: list[torch.Generator] = []
        encoded: list[Any] = []
        for key, value in named:
            if isinstance(value, torch.Tensor):
                dtype_name = str(value.dtype).removeprefix("torch.")
                if not value.numel():
                    encoded.append(("tensor", 0, tuple(value.shape), dtype_name))
                    continue
                offset = offsets[key]
                written = self._written.get(key)
                if written is None or written.offset != offset or (
                    written.key != _tensor_key(value)
                ):
                    assert memory is not None
                    bits = _bits(value)
                    target = np.ndarray(bits.shape, bits.dtype, memory.buf, offset)
                    np.copyto(target, bits)
                    del target
                    self._written.pop(key, None)
                tensors.append((key, value, offset))
                encoded.append(("tensor", offset, tuple(value.shape), dtype_name))
            elif isinstance(value, torch.Generator):
                generators.append(value)
                encoded.append(
                    ("generator", str(value.device), bytes(value.get_state().numpy()))
                )
            else:
                encoded.append(("value", value))
        positional = encoded[: len(args)]
        keywords = dict(zip(kwargs, encoded[len(args):], strict=True))
        return positional, keywords, tensors, generators

    def _inputs_written(self, tensors: list[tuple[str, torch.Tensor, int]]) -> list[str]:
        """The arguments whose place in the block no longer holds what was written (the
        others are remembered as intact, so the next call need not copy them again)."""
        changed = []
        assert self._memory is not None or not tensors
        for key, tensor, offset in tensors:
            assert self._memory is not None
            bits = _bits(tensor)
            there = np.ndarray(bits.shape, bits.dtype, self._memory.buf, offset)
            intact = np.array_equal(there, bits)
            del there
            if intact:
                self._written[key] = _Written(tensor, _tensor_key(tensor), offset)
            else:
                self._written.pop(key, None)
                changed.append(key)
        return changed

    def call(
        self,
        path: tuple[Any, ...],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        timeout_s: float | None,
        argument_names: Sequence[str] = (),
    ) -> Any:
        """Call the target's ``path`` (``("chain",)``, ``("end_to_end", i, "generate")``) in
        the worker with ``args``, waiting at most ``timeout_s`` seconds (None: for ever).

        Returns:
            What the target returned (tensors as tensors, arrays as arrays, tuples, lists,
            dicts and plain values as such).

        Raises:
            TargetTimeout: no reply within ``timeout_s`` (the worker is killed).
            TargetCrashed: the worker exited or died during the call, or could not restart.
            ProtocolViolation: the target wrote into an input tensor, or returned something
                that is not array-like.
            NotApplicable, InvalidInputError: as the target raised them.
            TargetRaised: any other exception of the target.
        """
        if self.timeouts_are_final and path in self._hung:
            raise TargetTimeout(
                f"not called: {self._hung[path]}; a target that hung is not called again in this "
                "run, so the example shown with this error was not run: the inputs named here hung",
                worker_killed=True,
            )
        self._ensure_running()
        assert self._connection is not None and self._process is not None
        positional, keywords, tensors, generators = self._lay_out(args, kwargs, argument_names)
        block = self._memory.name if self._memory is not None else None
        try:
            self._connection.send_bytes(pickle.dumps(("call", path, positional, keywords, block)))
            ready = self._connection.poll(timeout_s)
            raw = self._connection.recv_bytes() if ready else None
        except (EOFError, OSError):
            code = _reap(self._process)
            self.kill()
            raise TargetCrashed(
                f"the worker process of {self.name!r} {_exit_description(code)} during the call"
            ) from None
        except BaseException:
            self.kill()
            raise
        if raw is None:
            self.kill()
            hung = (
                f"the call of {self.name} ({'.'.join(map(str, path))}) did not return within "
                f"{timeout_s:g} s ({self.timeout_option})"
            )
            inputs = _describe_inputs(_named_arguments(args, kwargs, argument_names))
            self._hung[path] = f"{hung} on inputs {inputs}"
            raise TargetTimeout(f"{hung}; its worker process was killed", worker_killed=True)
        try:
            status, payload, states = _read_reply(raw)
            result = _decode(payload) if status == "ok" else payload
        except Exception as error:
            self.kill()
            raise TargetCrashed(
                f"the worker process of {self.name!r} sent a malformed reply: {error}"
            ) from None
        for generator, state in zip(generators, states, strict=False):
            generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        changed = self._inputs_written(tensors)
        if changed:
            raise ProtocolViolation(
                f"the target wrote into its input {', '.join(changed)} (inputs are read-only)"
            )
        if status == "ok":
            return result
        raise _rebuilt_error(payload)

    def set_threads(self, threads: int) -> None:
        """Give the worker ``threads`` intra-op threads (torch's), now if it is running and on
        every restart: an audit that runs in several processes divides the CPUs' threads
        between them once it knows how many it runs (:mod:`losslessness.engine.parallel`).

        Raises:
            ValueError: ``threads`` below 1.
        """
        if threads < 1:
            raise ValueError(f"threads: must be >= 1, got {threads}")
        self.spec = dataclasses.replace(self.spec, threads=threads)
        if self._connection is not None and self._process is not None \
                and self._process.poll() is None:
            # A worker that died meanwhile restarts on its next call, with the spec's count.
            with contextlib.suppress(OSError):
                self._connection.send_bytes(pickle.dumps(("threads", threads, (), {}, None)))

    def kill(self) -> None:
        """Kill the worker (SIGKILL), waiting at most :data:`KILL_WAIT_S` for it."""
        process, connection = self._process, self._connection
        self._process, self._connection = None, None
        self._written.clear()
        if process is not None and process.poll() is None:
            process.kill()
            _reap(process)
        if connection is not None:
            connection.close()

    def close(self) -> None:
        """Stop the worker and free the shared memory."""
        self.kill()
        self._release_memory()
        with _LIVE_LOCK:
            _LIVE.discard(self)


def _rebuilt_error(reply: dict[str, Any]) -> Exception:
    kind = reply["kind"]
    if kind == "not-applicable":
        return NotApplicable(reply["reason"], reply["argument"])
    if kind == "invalid-input":
        return InvalidInputError(reply["argument"], reply["problem"])
    if kind == "protocol":
        return ProtocolViolation(reply["message"])
    return TargetRaised(reply["type"], reply["message"], reply["location"], reply["traceback"])


_ARGUMENT_NAMES = {
    "chain": ("target_probs", "draft_probs", "draft_token_ids", "generator"),
    "greedy": ("target_logits", "draft_token_ids"),
    "tree": ("target_probs", "draft_probs", "parents", "token_ids", "draft_scheme", "generator"),
    "greedy_tree": ("target_logits", "parents", "token_ids"),
    "serving": (
        "target_logits", "draft_probs", "draft_token_ids", "num_draft_tokens", "requests",
        "generator",
    ),
    "serving_tree": (
        "target_logits", "draft_probs", "parents", "token_ids", "draft_scheme", "requests",
        "generator",
    ),
}
"""The protocols' argument names, for the message of a target that wrote into one."""


class RemoteCallable:
    """A verifier or generator method of a target in a worker process: calling it calls the
    target there (:meth:`TargetWorker.call`) within the worker's timeout.

    Attributes:
        worker: the worker.
        path: which callable of the target.
    """

    def __init__(
        self, worker: TargetWorker, path: tuple[Any, ...], name: str, verification: str | None
    ) -> None:
        self.worker = worker
        self.path = path
        self.__qualname__ = self.__name__ = name
        if verification is not None:
            setattr(self, VERIFICATION_ATTRIBUTE, verification)

    def call(self, args: Sequence[Any], timeout_s: float | None) -> Any:
        """Call the target with ``args`` within ``timeout_s`` seconds (see
        :meth:`TargetWorker.call` for what it raises)."""
        names = _ARGUMENT_NAMES.get(str(self.path[0]), ())
        return self.worker.call(self.path, args, {}, timeout_s, names)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        names = _ARGUMENT_NAMES.get(str(self.path[0]), ())
        return self.worker.call(self.path, args, kwargs, self.worker.timeout_s, names)


class RemoteGenerator:
    """An end-to-end engine in a worker process (the
    :class:`~losslessness.protocol.EndToEndGenerator` protocol), with the engine's counters
    when it reports them (:class:`~losslessness.protocol.ReportsAcceptedLengths`,
    :class:`~losslessness.protocol.ReportsDraftCounts`,
    :class:`~losslessness.protocol.ReportsLawAgreement`: the attributes exist only then, so
    ``isinstance`` tells).

    Attributes:
        vocab_size: V.
        generate: ``generate(prompt_ids, max_new_tokens, seed)`` in the worker.
        next_token_probs: ``next_token_probs(prefix_ids)`` in the worker.
        accepted_length_counts: ``accepted_length_counts()`` in the worker, if reported.
        draft_counts: ``draft_counts()`` in the worker, if reported.
        law_agreement: ``law_agreement()`` in the worker, if reported.
        batch_size, generate_batch: the engine's batches
            (:class:`~losslessness.protocol.GeneratesBatches`), if it batches.
    """

    def __init__(
        self,
        worker: TargetWorker,
        index: int,
        vocab_size: int,
        reports_accepted: bool = False,
        reports_draft_counts: bool = False,
        reports_law_agreement: bool = False,
        batch_size: Any = None,
    ) -> None:
        self.vocab_size = vocab_size
        if batch_size is not None:
            self.batch_size = batch_size
            self.generate_batch = RemoteCallable(
                worker, ("end_to_end", index, "generate_batch"), "generate_batch", None
            )
        self.generate = RemoteCallable(worker, ("end_to_end", index, "generate"), "generate", None)
        self.next_token_probs = RemoteCallable(
            worker, ("end_to_end", index, "next_token_probs"), "next_token_probs", None
        )
        counters = {
            "accepted_length_counts": reports_accepted, "draft_counts": reports_draft_counts,
            "law_agreement": reports_law_agreement,
        }
        for name, reported in counters.items():
            if reported:
                setattr(self, name, RemoteCallable(worker, ("end_to_end", index, name), name, None))


def _remote_generator(worker: TargetWorker, index: int, engine: dict[str, Any]) -> RemoteGenerator:
    return RemoteGenerator(
        worker, index, int(engine["vocab_size"]), bool(engine["reports_accepted"]),
        bool(engine.get("reports_draft_counts", False)),
        bool(engine.get("reports_law_agreement", False)), engine.get("batch_size"),
    )


def start_worker(name: str, *, greedy: bool, protocol: str, resolver: str) -> TargetWorker:
    """Start loading target ``name`` in a new worker process (returns at once; its
    :meth:`TargetWorker.adapter` waits for it); ``resolver`` is the ``"module:function"`` that
    loads it there."""
    spec = WorkerSpec(
        name, greedy, protocol, resolver, threads=torch.get_num_threads(), path=tuple(sys.path)
    )
    return TargetWorker(spec).start()


def worker_of(adapter: Adapter) -> TargetWorker | None:
    """The worker process an adapter's proxies call, or None for an in-process adapter."""
    for field in VERIFIER_FIELDS:
        verifier = getattr(adapter, field)
        if isinstance(verifier, RemoteCallable):
            return verifier.worker
    for target in adapter.end_to_end:
        if isinstance(target.generator, RemoteGenerator):
            return target.generator.generate.worker
    return None


def release_engine(adapter: Adapter) -> None:
    """Stop the worker process of a whole-engine adapter (an end-to-end target that
    ``requires_speculation``, run in a worker), and so the servers it started (they die with
    it): planning, warming up and running call every engine in turn, and a night of engines
    must hold one engine's memory at a time (four vLLM servers held together took 18 of 23
    GiB). A later call restarts the worker. Does nothing for any other adapter: a light loop
    such as transformers-generate keeps its worker (a restart costs seconds of the default
    audit)."""
    worker = worker_of(adapter)
    if worker is not None and any(t.requires_speculation for t in adapter.end_to_end):
        worker.kill()


def shutdown_workers() -> None:
    """Kill every worker process this process started and free their shared memory (also
    run at interpreter exit, so a target's threads never keep the audit alive)."""
    with _LIVE_LOCK:
        workers = list(_LIVE)
    for worker in workers:
        worker.close()


atexit.register(shutdown_workers)

__all__ = [
    "ProtocolViolation",
    "RemoteCallable",
    "RemoteGenerator",
    "TargetCrashed",
    "TargetRaised",
    "TargetTimeout",
    "TargetWorker",
    "WorkerSpec",
    "release_engine",
    "shutdown_workers",
    "start_worker",
    "worker_of",
]
