"""The small JSON-over-HTTP server every engine shim serves on, on 127.0.0.1 only.

Standard library only: it runs under the engine's own Python (the shim imports it from its own
folder). ``GET /health`` answers the shim's health record; ``POST <route>`` answers the
route's function of the JSON body; a malformed request (:class:`RequestError`, bad JSON, a body
over :data:`MAX_BODY_BYTES`) is HTTP 400 with the message, an unknown path 404, and an engine
that raises is HTTP 500 with the error's type and message (its traceback on stderr, the
server's log): the server keeps serving, and the audit records that request's case as ERROR.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 1 << 20
"""Largest request body read (a prompt of a few hundred ids is a few kB)."""

Route = Callable[[dict[str, Any]], dict[str, Any]]
"""A POST route: the request's JSON object in, the answer's out."""


class RequestError(ValueError):
    """A malformed request (HTTP 400); the message names the field."""


def handler(
    routes: dict[str, Route], health: Callable[[], dict[str, Any]]
) -> type[BaseHTTPRequestHandler]:
    """The request handler class serving ``routes`` and ``/health`` (module docstring)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection

        def setup(self) -> None:
            super().setup()
            # The headers and the body leave in two writes: with Nagle's algorithm on, the
            # body waits for the client's delayed ACK (40 ms a request on Linux).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would fill the log; errors are printed below

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, {"status": "ok", **health()})
            else:
                self._answer(404, {"error": f"no such path: {self.path}"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path not in routes:
                self.rfile.read(min(length, MAX_BODY_BYTES))
                self._answer(404, {"error": f"no such path: {self.path}"})
                return
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._answer(400, {"error": f"body of {length} bytes is too large"})
                return
            try:
                payload = json.loads(self.rfile.read(length))
                if not isinstance(payload, dict):
                    raise RequestError("body: expected a JSON object")
                self._answer(200, routes[self.path](payload))
            except (RequestError, json.JSONDecodeError) as error:
                self._answer(400, {"error": str(error)})
            except Exception as error:  # the engine failed: say so, keep serving
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                self._answer(500, {"error": f"{type(error).__name__}: {error}"})

    return Handler


def _end_group(signum: int, frame: Any) -> None:
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    sys.exit(128 + signum)


def serve(
    port: int,
    routes: dict[str, Route],
    health: Callable[[], dict[str, Any]],
    description: str,
    began: float,
) -> None:
    """Serve on 127.0.0.1:``port`` until terminated, after printing ``description`` and the
    seconds since ``began`` (``time.perf_counter()``).

    SIGTERM (from :meth:`ServerProcess.stop`, or from Linux when the process that started the
    server dies: ``ServerProcess(death_signal=SIGTERM)``) SIGKILLs the server's whole process
    group when it leads one, as ``ServerProcess`` starts it: the engine processes the shim
    spawned (vLLM's engine core and workers, whose parent-death watch does not stop them) end
    with it.
    """
    signal.signal(signal.SIGTERM, _end_group)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(routes, health))
    server.daemon_threads = True
    print(f"{description}: serving on 127.0.0.1:{port} after "
          f"{time.perf_counter() - began:.1f} s", flush=True)
    server.serve_forever()
