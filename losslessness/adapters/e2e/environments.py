"""What the engines installed in environments of their own share (OpenVINO GenAI, ONNX Runtime
GenAI): the pip constraints that hold torch to the CPU build, a lock so that two audits do not
build at once, a clean environment for the engine's Python, logged commands, sizes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "CONSTRAINTS_VARIABLE",
    "EngineBuildError",
    "clean_environment",
    "find_constraints",
    "locked",
    "run_logged",
    "size_bytes",
]

CONSTRAINTS_VARIABLE = "LOSSLESSNESS_CONSTRAINTS"
"""A pip constraints file to use instead of the repository's ``constraints.txt``."""


class EngineBuildError(RuntimeError):
    """Building an engine's environment or converting the models failed; the message names the
    command, its exit code and the end of its log."""


def find_constraints() -> Path | None:
    """The pip constraints file: ``$LOSSLESSNESS_CONSTRAINTS``, else ``constraints.txt`` of the
    repository this package lies in, else of the current directory (tox runs from the
    repository's root); None when there is none (pip then resolves torch freely).

    Raises:
        EngineBuildError: ``$LOSSLESSNESS_CONSTRAINTS`` names a missing file.
    """
    configured = os.environ.get(CONSTRAINTS_VARIABLE)
    if configured:
        path = Path(configured)
        if not path.is_file():
            raise EngineBuildError(f"{CONSTRAINTS_VARIABLE}={configured}: no such file")
        return path
    for candidate in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (candidate / "constraints.txt").is_file():
            return candidate / "constraints.txt"
    return None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (two audits building at once wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clean_environment() -> dict[str, str]:
    """This process's environment without what would leak the audit's Python into the
    engine's (``PYTHONPATH``, ``PYTHONHOME``, the active venv), one thread for torch and
    tokenizers, and the Hugging Face hub offline (nothing is downloaded)."""
    leaked = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    environment = {key: value for key, value in os.environ.items() if key not in leaked}
    environment.update(
        OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
    )
    return environment


def run_logged(command: list[str], log: Path, what: str, cwd: Path | None = None) -> str:
    """Run ``command``, appending its output to ``log``; its stdout is returned.

    Raises:
        EngineBuildError: it failed (command, exit code and the log's end named).
    """
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(command)}\n")
        handle.flush()
        completed = subprocess.run(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=handle,
            env=clean_environment(), cwd=cwd, text=True, check=False,
        )
        handle.write(completed.stdout)
    if completed.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise EngineBuildError(
            f"{what} failed (exit code {completed.returncode}; command: {' '.join(command)}; "
            f"log {log}):\n{tail}"
        )
    return completed.stdout


def size_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
