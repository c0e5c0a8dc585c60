"""A stand-in engine server for the process tests: ``python fake_server.py PORT MODE``.

Modes: ``ok`` (``/health`` and ``/echo`` answer), ``exit`` (exits at start-up with code 3),
``never-healthy`` (``/health`` answers 503 for ever), ``hang`` (``/echo`` never answers),
``crash`` (``/echo`` kills the server), ``dying`` (``/echo`` stops listening, drops the
connection and exits 3 s later, as a shim whose engine died ends itself), ``spawn`` (starts a
child of its own that sleeps, to show the whole process group is stopped; its pid is written
to ``/pid``'s answer).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

PORT, MODE = int(sys.argv[1]), sys.argv[2]
CHILD = (
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if MODE == "spawn"
    else None
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as engine servers do

    def log_message(self, *args: object) -> None:
        pass

    def answer(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.answer(503 if MODE == "never-healthy" else 200, {"status": "ok"})
        elif self.path == "/pid":
            self.answer(200, {"pid": os.getpid(), "child": CHILD.pid if CHILD else None})
        else:
            self.answer(404, {"error": self.path})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        payload = json.loads(self.rfile.read(length))
        if MODE == "hang":
            time.sleep(600)
        if MODE == "crash":
            os._exit(9)
        if MODE == "dying":
            SERVER.socket.close()
            self.connection.shutdown(socket.SHUT_RDWR)
            time.sleep(3)
            os._exit(9)
        self.answer(200, {"echo": payload, "pid": os.getpid()})


if MODE == "exit":
    print("fake server: refusing to start", flush=True)
    sys.exit(3)
SERVER = HTTPServer(("127.0.0.1", PORT), Handler)
SERVER.serve_forever()
