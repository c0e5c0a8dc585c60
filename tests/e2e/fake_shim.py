"""A stand-in shim for the process tests: ``python fake_shim.py PORT``. It serves with the shims'
own :func:`~losslessness.adapters.e2e.shims.json_server.serve` and, like vLLM's ``LLM``, starts
an engine process of its own (a child that sleeps, reparented to init if the shim dies alone);
``POST /pids`` answers both pids."""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from losslessness.adapters.e2e.shims.json_server import serve

began = time.perf_counter()
ENGINE = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
serve(int(sys.argv[1]), {"/pids": lambda _: {"shim": os.getpid(), "engine": ENGINE.pid}},
      lambda: {}, "fake shim", began)
