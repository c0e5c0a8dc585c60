"""A chain verifier that writes down torch's intra-op thread count at every call, named as
``tests.engine.thread_targets:counting_threads`` so that it runs in a worker process
(:mod:`tests.engine.test_parallel`): which count a target's worker runs with is otherwise
invisible from the audit."""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from losslessness.reference import verify

THREADS_FILE = "LOSSLESSNESS_TEST_THREADS_FILE"
"""Environment variable naming the file each call appends its thread count to (a line)."""


@functools.wraps(verify)
def counting_threads(*args: Any, **kwargs: Any) -> Any:
    """The reference verifier, after appending ``torch.get_num_threads()`` to the file named
    by :data:`THREADS_FILE`."""
    with open(os.environ[THREADS_FILE], "a") as record:
        record.write(f"{torch.get_num_threads()}\n")
    return verify(*args, **kwargs)
