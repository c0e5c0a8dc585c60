"""What the engines installed in environments of their own share (OpenVINO GenAI, ONNX Runtime
GenAI): the pip constraints that hold torch to the CPU build, a lock so that two audits do not
build at once, a clean environment for the engine's Python, logged commands, sizes, and the
client of the small server of ours (``shims/``) each engine runs behind: ``GET /health``,
``POST /generate`` (``prompt_ids``, ``max_new_tokens``, ``seed``, ``sampling`` -> ``tokens``,
``drafted``, ``accepted``) and ``POST /law`` (``prefix_ids``, ``sampling`` -> ``probs``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from losslessness.adapters.base import AdapterUnavailable
from losslessness.adapters.e2e.engine import Sampling
from losslessness.adapters.e2e.models import BUILD_VARIABLE
from losslessness.adapters.e2e.process import EngineProcessError, ServerProcess

__all__ = [
    "CONSTRAINTS_VARIABLE",
    "EngineBuildError",
    "EngineEnvironment",
    "ShimClient",
    "clean_environment",
    "ensure_environment",
    "find_constraints",
    "locked",
    "run_logged",
    "size_bytes",
    "unavailable",
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


def unavailable(what: str, build_command: str, cost: str, directory: Path) -> AdapterUnavailable:
    """The error of an engine target whose environment or models are not built: ``what`` is
    missing, ``build_command`` builds it (``cost``: its time and size) into ``directory``, or
    ``LOSSLESSNESS_E2E_BUILD=1`` builds it on first use."""
    return AdapterUnavailable(
        f"{what}: run `{build_command}` ({cost}, cached under {directory}), or set "
        f"{BUILD_VARIABLE}=1 to build it on first use"
    )


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


@dataclass(frozen=True)
class EngineEnvironment:
    """An engine's built environment.

    Attributes:
        directory: its cache directory (the venv in ``venv/``, ``environment.json``).
        python: the venv's interpreter.
        info: ``environment.json``: the packages asked for and the versions resolved, the
            packages uninstalled after, the install's seconds, the venv's bytes, the
            constraints file used, the full ``pip freeze``.
    """

    directory: Path
    python: Path
    info: dict[str, Any]

    @property
    def versions(self) -> dict[str, str]:
        """Resolved versions of the engine's packages."""
        versions: dict[str, str] = self.info["versions"]
        return versions


def ensure_environment(
    directory: Path,
    packages: Sequence[str],
    label: str,
    versions_script: str,
    build: bool,
    unavailable: Callable[[str], Exception],
    uninstall: Sequence[str] = (),
) -> EngineEnvironment:
    """An engine's environment, built on first use and cached.

    The venv is made with this interpreter's ``-m venv`` in ``directory/venv`` (in place,
    never moved: a venv's scripts name its path); ``pip install`` gets ``packages`` with ``-c``
    :func:`find_constraints`; ``uninstall`` is then removed; ``versions_script`` (run by the
    venv's Python, its last line a JSON object) checks the imports and gives the versions.
    ``environment.json`` is written last, so a build that was interrupted starts again; two
    audits building at once wait for each other (:func:`locked`).

    Args:
        directory: the cache directory.
        packages: pip requirements, pinned.
        label: the engine's name in messages (``OpenVINO GenAI``).
        versions_script: Python source printing the versions as JSON.
        build: build what is missing; False: raise ``unavailable(reason)`` instead.
        unavailable: the exception for a missing environment (naming the build command).
        uninstall: packages to remove after the install, with why in the caller.

    Raises:
        EngineBuildError: a step failed (command, exit code and the log's end named).
        Exception: ``unavailable(...)`` when not built and ``build`` is False.
    """
    info_path = directory / "environment.json"
    python = directory / "venv" / "bin" / "python"
    if not (info_path.is_file() and python.exists()):
        if not build:
            raise unavailable(f"the {label} environment is not built ({directory})")
        with locked(directory.with_name(directory.name + ".lock")):
            if not (info_path.is_file() and python.exists()):
                _build(directory, info_path, python, packages, label, versions_script, uninstall)
    info: dict[str, Any] = json.loads(info_path.read_text())
    return EngineEnvironment(directory, python, info)


def _build(
    directory: Path,
    info_path: Path,
    python: Path,
    packages: Sequence[str],
    label: str,
    versions_script: str,
    uninstall: Sequence[str],
) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log = directory / "install.log"
    constraints = find_constraints()
    began = time.perf_counter()
    run_logged([sys.executable, "-m", "venv", str(directory / "venv")], log, "creating the venv")
    install = [str(python), "-m", "pip", "install", "--no-input", *packages]
    if constraints is not None:
        install[4:4] = ["-c", str(constraints)]
    run_logged(install, log, f"pip install of {label}")
    if uninstall:
        run_logged([str(python), "-m", "pip", "uninstall", "-y", *uninstall], log,
                   f"pip uninstall of {', '.join(uninstall)}")
    install_s = time.perf_counter() - began
    versions = json.loads(run_logged([str(python), "-c", versions_script], log,
                                     f"importing {label}").strip().splitlines()[-1])
    freeze = run_logged([str(python), "-m", "pip", "freeze"], log, "pip freeze").split()
    info = {
        "packages": list(packages),
        "versions": versions,
        "python": run_logged([str(python), "-c", "import sys; print(sys.version.split()[0])"],
                             log, "python --version").strip(),
        "constraints": None if constraints is None else str(constraints),
        "uninstalled": list(uninstall),
        "install_s": round(install_s, 1),
        "size_bytes": size_bytes(directory / "venv"),
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pip_freeze": freeze,
    }
    partial_path = info_path.with_suffix(".json.partial")
    partial_path.write_text(json.dumps(info, indent=1) + "\n")
    partial_path.rename(info_path)


SERVER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""One thread for the engine's server (the 2-core machine is shared)."""


class ShimClient:
    """An engine behind one of our servers (``shims/``), in the
    :class:`~losslessness.adapters.e2e.engine.EngineClient` protocol, started on the first
    request.

    Args:
        name: the server's name in messages (``openvino-genai (draft)``).
        command: its command line (``{port}`` replaced by the port).
        description: what is audited (engine, versions, drafter, settings).
        vocab_size: V.
        startup_timeout_s, request_timeout_s: as :class:`ServerProcess`'s.
        environment: variables for the server beyond :data:`SERVER_ENVIRONMENT`.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        description: str,
        vocab_size: int,
        startup_timeout_s: float,
        request_timeout_s: float,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.description = description
        self.server = ServerProcess(
            name, command, startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
            environment={**SERVER_ENVIRONMENT, **(environment or {})},
            death_signal=signal.SIGTERM,
        )

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer (versions, V), starting it if needed.

        Raises:
            EngineProcessError: the server could not start or answer.
        """
        answer: dict[str, Any] = self.server.request_json("/health")
        return answer

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, seed: int, sampling: Sampling
    ) -> tuple[list[int], int, int]:
        """One request with speculation on: ``(max_new_tokens ids, drafted, accepted)``, the
        counters as the server derives them (each shim's docstring says how).

        Raises:
            EngineProcessError: the server failed, refused the request or answered malformed.
        """
        answer = self.server.request_json("/generate", {
            "prompt_ids": [int(token) for token in prompt_ids],
            "max_new_tokens": int(max_new_tokens), "seed": int(seed),
            "sampling": sampling.to_json(),
        })
        try:
            tokens = [int(token) for token in answer["tokens"]]
            return tokens, int(answer["drafted"]), int(answer["accepted"])
        except (KeyError, TypeError, ValueError) as error:
            raise EngineProcessError(
                f"{self.server.name}: /generate answered {answer!r:.300}"
            ) from error

    def next_token_law(self, prefix_ids: list[int], sampling: Sampling) -> list[float]:
        """The engine's non-speculative next-token law after ``prefix_ids`` (``[V]`` floats;
        greedy: the unprocessed softmax, whose argmax greedy decoding takes).

        Raises:
            EngineProcessError: the server failed or answered malformed.
        """
        answer = self.server.request_json("/law", {
            "prefix_ids": [int(token) for token in prefix_ids],
            "sampling": sampling.to_json(),
        })
        try:
            return [float(value) for value in answer["probs"]]
        except (KeyError, TypeError, ValueError) as error:
            raise EngineProcessError(
                f"{self.server.name}: /law answered {answer!r:.300}"
            ) from error

    def close(self) -> None:
        """Stop the server (and its process group)."""
        self.server.stop()

