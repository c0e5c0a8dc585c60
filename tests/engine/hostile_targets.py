"""Hostile chain verifiers for the worker-process tests (:mod:`tests.engine.test_worker`) and
the red-team tests (:mod:`tests.commands.test_red_team`): each
is the reference verifier except for one misbehaviour, named as
``tests.engine.hostile_targets:<function>`` targets so that they run in a worker process.

Importing this module monkeypatches the auditor (:data:`PATCHED`): only ever name it as an
isolated target, never import it into a process whose verdicts matter.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
import threading
import time

import torch

import losslessness.engine.finish as finish
from losslessness.adapters import NotApplicable
from losslessness.reference import verify
from losslessness.results import Verdict
from tests.wrong_verifiers import residual_is_target

SMALL_VOCAB = 2
"""The misbehaving functions misbehave on cases with this vocabulary size only (``v2-*``)."""


def _patched_verdict(*args: object, **kwargs: object) -> Verdict:
    return Verdict.LOSSLESS


# Every target verdict of a process that imports this module is LOSSLESS.
finish.target_verdict = _patched_verdict
PATCHED = True
"""Set once the auditor's verdict function has been replaced (at import)."""


def _small(target_probs: torch.Tensor) -> bool:
    return target_probs.shape[-1] == SMALL_VOCAB


def patches_the_auditor(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY (residual p instead of norm(max(0, p - q))) in a module that makes every verdict
    LOSSLESS at import."""
    return residual_is_target(target_probs, draft_probs, draft_token_ids, generator)


def sleeps_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Hangs in ``time.sleep`` (an hour) on V = 2."""
    if _small(target_probs):
        time.sleep(3600)
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def spins_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Hangs in a tight loop that catches every exception (a retry loop) on V = 2."""
    spins = 0
    while _small(target_probs):
        try:
            spins += 1
        except BaseException:
            spins = 0
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def spins_in_c_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Hangs inside one C call that never checks for signals on V = 2 (catastrophic regex
    backtracking, 2^64 steps), as a compiled kernel's endless loop does."""
    if _small(target_probs):
        re.match(r"(a+)+$", "a" * 64 + "b")
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def raises_keyboard_interrupt_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Raises ``KeyboardInterrupt`` itself on V = 2, as if the user had pressed Ctrl-C."""
    if _small(target_probs):
        raise KeyboardInterrupt
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def os_exits_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Ends its process with ``os._exit(0)`` on V = 2."""
    if _small(target_probs):
        os._exit(0)
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def sys_exits_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Raises ``SystemExit(0)`` (``sys.exit(0)``) on V = 2."""
    if _small(target_probs):
        sys.exit(0)
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def segfaults_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Reads address 0 (``ctypes.string_at(0)``: SIGSEGV) on V = 2."""
    if _small(target_probs):
        ctypes.string_at(0)
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def aborts_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Calls ``os.abort()`` (SIGABRT) on V = 2."""
    if _small(target_probs):
        os.abort()
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def kills_itself_on_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Sends itself SIGTERM on V = 2."""
    if _small(target_probs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def writes_into_inputs(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """The reference's output, then writes q over p's first rows in its input buffer."""
    out = verify(target_probs, draft_probs, draft_token_ids, generator)
    k = draft_probs.shape[1]
    target_probs[:, :k].copy_(draft_probs)
    return out


def refuses_small_vocab(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Raises :class:`~losslessness.adapters.NotApplicable` on V = 2."""
    if _small(target_probs):
        raise NotApplicable("this kernel needs V > 2", argument="target_probs")
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def leaves_a_thread(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """The reference, after starting a non-daemon thread that sleeps for an hour."""
    threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def sleeps(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Hangs in ``time.sleep`` (an hour) on every call."""
    time.sleep(3600)
    return verify(target_probs, draft_probs, draft_token_ids, generator)
