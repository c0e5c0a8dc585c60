"""What the ``vllm`` and ``sglang`` adapters share: loading an engine whose sampler kernels are
Triton, on CUDA or, without CUDA, through Triton's interpreter on CPU tensors.

Both engines write their speculative samplers as Triton kernels. Triton's interpreter
(``TRITON_INTERPRET=1``) runs a ``@triton.jit`` kernel program by program with numpy on CPU
tensors; it must be on when the engine's kernel modules are *imported* (``triton.jit`` decides
at decoration time whether it returns a compiled ``JITFunction`` or an ``InterpretedFunction``).
vLLM also needs ``CUDA_VISIBLE_DEVICES=""``: otherwise it looks for a Triton driver, finds none,
sets ``HAS_TRITON = False`` and replaces every kernel by a placeholder (``TypeError: Cannot
inspect kernel parameters`` at the first launch). ``VLLM_TARGET_DEVICE=cpu`` must *not* be set:
vLLM's CPU platform samples with ``torch.ops._C.fused_gumbel_argmax``, which the PyPI wheel
lacks. :func:`prepare_engine` sets the two variables itself, before the import, when torch sees
no CUDA device; the user never has to.

Faults become :class:`~losslessness.adapters.base.AdapterUnavailable` with the reason and the
command that installs what is missing: the engine not installed, a version outside the range
an adapter was checked against whose API differs from the one it was written against (the
message lists the parameters added and removed), Triton missing, or the engine imported earlier
in the process without the interpreter.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from losslessness.adapters.base import AdapterUnavailable

INTERPRETER_ENVIRONMENT = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
"""What Triton's interpreter mode needs, set by :func:`prepare_engine` when CUDA is absent."""

REQUIREMENTS_FILE = "engines-requirements.txt"
"""The pinned environment of ``tox -e engines`` (in the repository root)."""

TRITON_PIN = "triton==3.7.1"
"""The Triton version the interpreter runs were checked with."""


@dataclass(frozen=True)
class EngineSpec:
    """An engine package an adapter wraps, and the versions the adapter was checked against.

    Attributes:
        distribution: the PyPI distribution name (``"vllm"``).
        checked: the versions the adapter was run against, oldest first (``("0.33.0",)``).
        install: the command that installs the checked version on CPU (``pip install
            --no-deps vllm==0.33.0`` plus the dependencies in :data:`REQUIREMENTS_FILE`).
    """

    distribution: str
    checked: tuple[str, ...]
    install: str

    @property
    def checked_range(self) -> str:
        """``"0.33.0"`` or ``"0.30.0-0.33.0"``."""
        if len(self.checked) == 1:
            return self.checked[0]
        return f"{self.checked[0]}-{self.checked[-1]}"


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def interpreter_mode() -> bool:
    """True when the engines' Triton kernels run through the interpreter (no CUDA device)."""
    return not torch.cuda.is_available()


def engine_device() -> torch.device:
    """``cuda`` when torch sees a CUDA device, else ``cpu`` (the interpreter's tensors)."""
    return torch.device("cpu" if interpreter_mode() else "cuda")


def mode_description() -> str:
    """How the kernels run, for an adapter's description."""
    if interpreter_mode():
        return (
            "real Triton kernels run on CPU by Triton's interpreter (TRITON_INTERPRET=1, "
            'CUDA_VISIBLE_DEVICES="" set by the adapter)'
        )
    return "Triton kernels compiled for CUDA"


def prepare_engine(spec: EngineSpec) -> str:
    """Check that ``spec``'s engine and Triton are installed and set the interpreter up.

    Without CUDA, sets :data:`INTERPRETER_ENVIRONMENT` in ``os.environ`` (before the engine's
    kernel modules are imported); with CUDA, changes nothing.

    Returns:
        The installed version of the engine.

    Raises:
        AdapterUnavailable: the engine or Triton is not installed (the message gives the
            install command).
    """
    version = installed_version(spec.distribution)
    if version is None:
        raise AdapterUnavailable(
            f"{spec.distribution} is not installed; install it with: {spec.install} "
            f"(or tox -e engines, which builds the pinned environment of {REQUIREMENTS_FILE})"
        )
    if installed_version("triton") is None:
        raise AdapterUnavailable(
            f"{spec.distribution} {version}: Triton is not installed (its sampler kernels are "
            f"Triton); install it with: pip install -c constraints.txt {TRITON_PIN}"
        )
    if interpreter_mode():
        os.environ.update(INTERPRETER_ENVIRONMENT)
        # vLLM's CPU platform would sample with an op the PyPI wheel lacks (module docstring).
        if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
            del os.environ["VLLM_TARGET_DEVICE"]
    return version


def import_engine_module(spec: EngineSpec, version: str, module: str) -> ModuleType:
    """Import ``module`` of an engine prepared by :func:`prepare_engine`.

    Raises:
        AdapterUnavailable: the import failed (a missing dependency: the message names it and
            the install command).
    """
    try:
        return importlib.import_module(module)
    except Exception as error:  # an engine's import can fail with more than ImportError
        raise AdapterUnavailable(
            f"{spec.distribution} {version}: importing {module} failed "
            f"({type(error).__name__}: {error}); install the pinned environment with: "
            f"{spec.install}"
        ) from error


def require_interpreted(spec: EngineSpec, version: str, kernel: object, name: str) -> None:
    """In interpreter mode, check that ``kernel`` was decorated under the interpreter.

    Raises:
        AdapterUnavailable: the engine's module was imported before the adapter set
            ``TRITON_INTERPRET=1``, so its kernels are compiled-for-GPU functions that cannot
            run here.
    """
    if interpreter_mode() and type(kernel).__name__ != "InterpretedFunction":
        raise AdapterUnavailable(
            f"{spec.distribution} {version}: kernel {name} is a {type(kernel).__name__}, not "
            "an InterpretedFunction: the engine was imported before the adapter could set "
            "TRITON_INTERPRET=1; load the adapter in a fresh process (or import "
            "losslessness.adapters first)"
        )


def require_parameters(
    spec: EngineSpec,
    version: str,
    function: Callable[..., Any],
    name: str,
    expected: tuple[str, ...],
) -> None:
    """Check ``function``'s parameter names against those the adapter was written against.

    Args:
        spec: the engine.
        version: its installed version.
        function: the engine's function.
        name: how to name it in the message (``"rejection_sample"``).
        expected: the parameter names, in order, at the versions of ``spec.checked``.

    Raises:
        AdapterUnavailable: the names differ; the message says which were added and removed,
            the checked range, and the command that installs the checked version.
    """
    parameters = tuple(inspect.signature(function).parameters)
    if parameters == expected:
        return
    added = [p for p in parameters if p not in expected]
    removed = [p for p in expected if p not in parameters]
    changes = []
    if added:
        changes.append(f"added {', '.join(added)}")
    if removed:
        changes.append(f"removed {', '.join(removed)}")
    if not changes:
        changes.append(f"reordered to ({', '.join(parameters)})")
    where = (
        "inside"
        if version in spec.checked
        else f"outside the range {spec.checked_range} this adapter was checked against"
    )
    raise AdapterUnavailable(
        f"{spec.distribution} {version} ({where}): API changed, {name} "
        f"{'; '.join(changes)}; install the checked version with: {spec.install}"
    )


def version_note(spec: EngineSpec, version: str) -> str:
    """``"vllm 0.33.0 (checked)"`` or a warning that the version was never checked."""
    if version in spec.checked:
        return f"{spec.distribution} {version} (checked against {spec.checked_range})"
    return (
        f"{spec.distribution} {version} (NOT checked: this adapter was checked against "
        f"{spec.checked_range}; the API it uses matched)"
    )


def _interpreted_log1p(arg0: Any) -> Any:
    """``libdevice.log1p`` for Triton's interpreter: numpy's ``log1p`` on the block's data."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    handle = arg0.handle
    with np.errstate(divide="ignore", invalid="ignore"):  # log1p(-1) = -inf, as on the GPU
        data = np.log1p(handle.data).astype(handle.data.dtype)
    return tl.core.tensor(TensorHandle(data, handle.dtype), arg0.type)


INTERPRETED_LIBDEVICE: dict[str, Callable[..., Any]] = {"log1p": _interpreted_log1p}
"""libdevice functions the engines' kernels call that Triton's interpreter lacks (Triton 3.7.1:
``triton.language.extra.libdevice`` holds stubs that return None until a GPU backend replaces
them at compile time); vLLM's model-runner-v2 residual calls ``log1p``."""


def complete_interpreter_libdevice() -> list[str]:
    """In interpreter mode, give the libdevice stubs of :data:`INTERPRETED_LIBDEVICE` a numpy
    implementation (the kernels themselves are not changed).

    Returns:
        The names supplied (empty with CUDA, or when Triton already implements them).
    """
    if not interpreter_mode():
        return []
    libdevice = importlib.import_module("triton.language.extra.libdevice")
    supplied = []
    for name, implementation in INTERPRETED_LIBDEVICE.items():
        stub = getattr(libdevice, name, None)
        if stub is implementation:
            supplied.append(name)
            continue
        # A stub's body is ``...``: it returns None whatever it is given.
        if stub is not None and getattr(stub, "__module__", "") == libdevice.__name__:
            setattr(libdevice, name, implementation)
            supplied.append(name)
    return supplied
