"""A whole engine's server process, handled as a careful operator would (issue 22, item 4).

- **Ports**: a free loopback port is chosen for every start (bound to 127.0.0.1 only; a start
  that loses the port to another process is retried on a fresh one).
- **Start-up**: the server is healthy when its health endpoint answers 200 within
  ``startup_timeout_s``; a server that exits first, or never answers, is stopped and the error
  names the command, its exit code and the end of its log.
- **Requests**: every request has ``request_timeout_s``; a server that died mid-request is an
  :class:`EngineProcessError` for that request, and the next request starts it again (the
  audit records the failed case as ERROR and goes on).
- **No process left behind**: the server runs in its own process group, is stopped with
  SIGTERM then SIGKILL, at :meth:`ServerProcess.stop`, at interpreter exit, and, if the
  process that started it is killed outright (a timed-out audit worker), by the kernel
  (``PR_SET_PDEATHSIG``). The signal is tied to the thread that forked, so every server is
  started from one launcher thread that lives as long as the process: audit calls may run on
  short-lived threads (:func:`losslessness.engine.draw.call_target`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "EngineProcessError",
    "ServerProcess",
    "die_with_parent",
    "free_loopback_port",
    "remove_temporary_logs",
]

LOOPBACK = "127.0.0.1"
"""Servers listen here only."""

LOG_TAIL_CHARS = 2000
"""How much of a failed server's log an error quotes."""

_PR_SET_PDEATHSIG = 1


class EngineProcessError(RuntimeError):
    """An engine's server failed: it did not start, exited, or did not answer in time. The
    message names the server, what failed and the end of its log."""


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def die_with_parent(death_signal: int = signal.SIGKILL) -> None:
    """Ask Linux to send the calling process ``death_signal`` (SIGKILL by default) when the
    thread that forked it ends (its parent's death, for a process forked from a thread that
    lives as long as its process). Elsewhere a no-op: audit workers then end at their closed
    socket, servers at :meth:`ServerProcess.stop` and interpreter exit."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(death_signal))


class _Launcher:
    """One thread per process that forks every server (see the module docstring)."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def run(self, action: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._requests = queue.Queue()
                self._thread = threading.Thread(
                    target=self._serve, name="losslessness-engine-launcher", daemon=True
                )
                self._thread.start()
        answer: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._requests.put((action, answer))
        outcome, value = answer.get()
        if outcome == "error":
            raise value
        return value

    def _serve(self) -> None:
        while True:
            action, answer = self._requests.get()
            try:
                answer.put(("value", action()))
            except BaseException as error:
                answer.put(("error", error))


_LAUNCHER = _Launcher()
_LIVE: weakref.WeakSet[ServerProcess] = weakref.WeakSet()
_TEMPORARY_LOGS: set[Path] = set()
"""Logs the servers of this process were given by default that no error has named: removed at
interpreter exit (a test run started hundreds of servers and left their logs in /tmp)."""


@atexit.register
def _stop_every_server() -> None:
    for server in list(_LIVE):
        server.stop()
    remove_temporary_logs()


def remove_temporary_logs() -> None:
    """Delete the default (temporary) logs of this process's servers that no
    :class:`EngineProcessError` named; run at interpreter exit. A log an error named is kept
    for the operator to read."""
    for path in list(_TEMPORARY_LOGS):
        _TEMPORARY_LOGS.discard(path)
        with contextlib.suppress(OSError):
            path.unlink()


class ServerProcess:
    """An HTTP server process started on demand, restarted after it dies.

    Args:
        name: how errors name it (``llama-server (draft-simple)``).
        command: the command line; ``{port}`` in any argument is replaced by the port.
        health_path: the path that answers 200 once the server is ready.
        startup_timeout_s: seconds the server has to become healthy.
        request_timeout_s: seconds one request may take.
        environment: variables added to the server's environment.
        log_path: where its stdout and stderr go (default: a temporary file, removed at
            interpreter exit unless an error named it, :func:`remove_temporary_logs`).
        death_signal: what the server gets when the process that started it dies: SIGKILL; a
            server that stops its own process group on SIGTERM (the shims:
            :func:`~losslessness.adapters.e2e.shims.json_server.serve`) gets SIGTERM, so that
            the processes it spawned (vLLM's engine cores and workers) go with it.

    Raises:
        ValueError: an empty command, or a timeout that is not positive.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        health_path: str = "/health",
        startup_timeout_s: float = 120.0,
        request_timeout_s: float = 60.0,
        environment: dict[str, str] | None = None,
        log_path: Path | None = None,
        death_signal: int = signal.SIGKILL,
    ) -> None:
        if not command:
            raise ValueError("command: must not be empty")
        for label, value in (
            ("startup_timeout_s", startup_timeout_s), ("request_timeout_s", request_timeout_s)
        ):
            if not value > 0:
                raise ValueError(f"{label}: must be > 0, got {value!r}")
        self.name = name
        self.command = list(command)
        self.health_path = health_path
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.environment = dict(environment or {})
        self.log_path = log_path
        self.death_signal = death_signal
        self.port: int | None = None
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.RLock()

    @property
    def alive(self) -> bool:
        """Whether the server process is running."""
        return self._process is not None and self._process.poll() is None

    def log_tail(self) -> str:
        """The last :data:`LOG_TAIL_CHARS` characters of the server's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace")
        return text[-LOG_TAIL_CHARS:]

    def _failure(self, what: str) -> EngineProcessError:
        if self.log_path is not None:
            _TEMPORARY_LOGS.discard(self.log_path)
        code = None if self._process is None else self._process.poll()
        status = "running" if code is None else f"exit code {code}"
        return EngineProcessError(
            f"{self.name}: {what} ({status}; command: {' '.join(self.command)}; log "
            f"{self.log_path}):\n{self.log_tail()}"
        )

    def start(self) -> None:
        """Start the server on a free port and wait until it is healthy (no-op if alive).

        Raises:
            EngineProcessError: it exited during start-up (after 3 tries on fresh ports, when
                its log says the address was in use) or did not become healthy in time.
        """
        with self._lock:
            if self.alive:
                return
            self.stop()
            for _ in range(3):
                self.port = free_loopback_port()
                self._spawn()
                try:
                    self._wait_healthy()
                    self.starts += 1
                    _LIVE.add(self)
                    return
                except EngineProcessError:
                    in_use = "address already in use" in self.log_tail().lower()
                    if not in_use:
                        self.stop()
                        raise
                    self.stop()
            raise self._failure("no free port after 3 tries")

    def _spawn(self) -> None:
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="losslessness-engine-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
            _TEMPORARY_LOGS.add(self.log_path)
        command = [part.replace("{port}", str(self.port)) for part in self.command]
        environment = {**os.environ, **self.environment}
        log = self.log_path.open("ab")

        def launch() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=environment, start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, self.death_signal),
            )

        try:
            self._process = _LAUNCHER.run(launch)
        except OSError as error:
            raise EngineProcessError(f"{self.name}: cannot run {command[0]}: {error}") from error
        finally:
            log.close()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise self._failure("exited during start-up")
            try:
                status, _ = self._request("GET", self.health_path, None, timeout_s=2.0)
                if status == 200:
                    return
            except (OSError, http.client.HTTPException):
                self._close_connection()
            time.sleep(0.2)
        raise self._failure(f"not healthy within {self.startup_timeout_s:g} s")

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _request(
        self, method: str, path: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        if self._connection is None:
            assert self.port is not None
            self._connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout_s)
        self._connection.timeout = timeout_s
        if self._connection.sock is not None:
            self._connection.sock.settimeout(timeout_s)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self._connection.request(method, path, body=body, headers=headers)
        response = self._connection.getresponse()
        return response.status, response.read()

    def request_json(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        """POST ``payload`` (GET without one) to ``path``, starting the server if needed.

        Returns:
            The decoded JSON answer.

        Raises:
            EngineProcessError: the server could not start, died, answered with an HTTP error
                (the body quoted) or not within ``request_timeout_s``.
        """
        with self._lock:
            self.start()
            body = None if payload is None else json.dumps(payload).encode()
            method = "GET" if payload is None else "POST"
            try:
                try:
                    status, answer = self._request(method, path, body, self.request_timeout_s)
                except ConnectionRefusedError:
                    # Nothing listens though the process may still run: a server on its way
                    # out (a shim ends itself once its engine died). The request never reached
                    # it, so a fresh server gets it.
                    self._close_connection()
                    self.stop()
                    self.start()
                    status, answer = self._request(method, path, body, self.request_timeout_s)
                except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                    # A live server may close an idle keep-alive connection: once, on a new one.
                    self._close_connection()
                    if not self.alive:
                        raise
                    status, answer = self._request(method, path, body, self.request_timeout_s)
            except TimeoutError as error:
                self._close_connection()
                self.stop()
                raise self._failure(
                    f"{path} did not answer within {self.request_timeout_s:g} s; restarted "
                    "for the next request"
                ) from error
            except (OSError, http.client.HTTPException) as error:
                self._close_connection()
                raise self._failure(f"{path} failed: {error!r}") from error
            if status != 200:
                raise self._failure(f"{path} answered HTTP {status}: {answer[:500]!r}")
            return json.loads(answer)

    def stop(self) -> None:
        """Stop the server and its process group (SIGTERM, then SIGKILL after 10 s)."""
        with self._lock:
            self._close_connection()
            process, self._process = self._process, None
            _LIVE.discard(self)
            if process is None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
