"""SIGINT and SIGTERM for the commands that run targets (``audit``, ``nightly``, ``merge``):
whenever a signal comes, the finished results are written (the JSON record first) and
printed, and the command exits 130 (SIGINT) or 143 (SIGTERM): 128 + the signal's number, the
shell's convention, so a script can tell an interrupted run from a verdict. A LOSSY verdict
from finished evidence stands (exit 1): the signal cannot make a lossy target pass.

The first signal interrupts the run through :func:`losslessness.engine.interrupts.interrupt`:
at once while targets are called (the warm-up of a time budget, the shard's units: what
finished is kept, the rest is INCOMPLETE), else as soon as the next such section would begin.
Every later SIGINT or SIGTERM is deferred until the command has written and printed its
results, so a second Ctrl-C, or a SIGTERM after a Ctrl-C, loses nothing.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import ParamSpec, TypeVar

from losslessness.engine import interrupts

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals a command turns into a written, INCOMPLETE record."""

LOSSY_EXIT_CODE = 1
"""The LOSSY exit code: finished evidence of loss outranks an interruption."""

USAGE_EXIT_CODE = 2
"""The usage-error exit code: a command refused before running anything keeps it."""


class Interrupted(KeyboardInterrupt):
    """The run was interrupted by ``signum`` (SIGINT or SIGTERM). A ``KeyboardInterrupt``, so
    the engine handles a SIGTERM exactly as a Ctrl-C.

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """The handlers of one command: the first signal it received (None until one comes).

    Attributes:
        received: the first SIGINT or SIGTERM's number, or None.
    """

    def __init__(self) -> None:
        self.received: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The handler of :data:`HANDLED_SIGNALS`: the first signal interrupts the run (raising
        :class:`Interrupted` where the engine can stop), later ones are deferred (ignored: the
        command is already writing what it has).

        Raises:
            Interrupted: the first signal, inside a section the engine can stop in.
        """
        if self.received is not None:
            return
        self.received = signum
        name = signal.Signals(signum).name
        # os.write, not print: a handler may run inside another write to the same stream.
        os.write(2, f"\n{name}: stopping; writing the finished results (further signals are "
                 "deferred until they are written)\n".encode())
        interrupts.interrupt(Interrupted(signum))

    def exit_code(self, code: int) -> int:
        """The exit code of a command that would exit ``code``: ``128 + signal`` once a signal
        came, unless ``code`` is LOSSY (finished evidence of loss) or a usage error."""
        if self.received is None or code in (LOSSY_EXIT_CODE, USAGE_EXIT_CODE):
            return code
        return 128 + self.received


_P = ParamSpec("_P")
_R = TypeVar("_R")


def handles_signals(command: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``command`` (a click command's callback) with SIGINT and SIGTERM turned into a
    written record and the exit code of :meth:`SignalGuard.exit_code` (also when the command
    returns instead of exiting). The previous handlers come back when it ends, unless a signal
    came (then both signals stay ignored while the process exits); outside the main thread
    (where signals cannot be handled) the command runs as it is.

    Raises:
        SystemExit: the command's exit, with its code mapped; or ``128 + signal`` when a
            signal came and the command returned (or the interruption left it before anything
            had finished).
    """

    @functools.wraps(command)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if threading.current_thread() is not threading.main_thread():
            return command(*args, **kwargs)
        guard = SignalGuard()
        previous = {signum: signal.signal(signum, guard.handle) for signum in HANDLED_SIGNALS}
        try:
            result = command(*args, **kwargs)
        except KeyboardInterrupt:
            if guard.received is None:
                raise
            # Interrupted where nothing had finished yet: the signal's code, never click's 1.
            raise SystemExit(guard.exit_code(0)) from None
        except SystemExit as exit_:
            if guard.received is None:
                raise
            code = exit_.code if isinstance(exit_.code, int) else 0
            raise SystemExit(guard.exit_code(code)) from None
        finally:
            for signum, handler in previous.items():
                # After a signal the process is exiting with its code: a later one (the
                # interpreter's shutdown takes a while) must not make it a death by signal.
                signal.signal(signum, handler if guard.received is None else signal.SIG_IGN)
            interrupts.clear()
        if guard.received is not None:
            raise SystemExit(guard.exit_code(0))
        return result

    return wrapper


__all__ = ["HANDLED_SIGNALS", "Interrupted", "SignalGuard", "handles_signals"]
