"""Where an interruption (Ctrl-C, SIGTERM) may stop the engine, and where it must wait.

The engine can only stop cleanly in code that catches ``KeyboardInterrupt`` and records what
finished: the warm-up of a time budget (:mod:`losslessness.engine.time_budget`) and the units
of a shard (:mod:`losslessness.engine.scheduler`). Those sections run inside
:func:`interruptible`. A signal handler (the command line's,
:mod:`losslessness.commands.signals`) calls :func:`interrupt`: inside a section the
interruption is raised at once (from the handler, so in the code it interrupted); outside one
(planning, finishing the run, writing the record) it is kept, and raised when the next section
begins, so that no sampling starts after it and nothing finished is lost. Once the run is
interrupted, further interruptions are ignored: the run goes on writing what it has.

The state is the process's (signals are): :func:`clear` forgets it, which the scheduler does
when a shard has recorded the interruption, and the command line does when it exits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0
"""How many :func:`interruptible` sections the main thread is in."""

_interruption: KeyboardInterrupt | None = None
"""The run's interruption, once there is one."""


def interrupt(error: KeyboardInterrupt) -> None:
    """Interrupt the run with ``error``: raised here inside an :func:`interruptible` section,
    else raised when the next one begins; ignored when the run was already interrupted.

    Raises:
        KeyboardInterrupt: ``error``, inside a section.
    """
    global _interruption
    if _interruption is not None:
        return
    _interruption = error
    if _depth:
        raise error


def note(error: KeyboardInterrupt) -> None:
    """Record that a section caught ``error`` (a signal's, or one a target raised itself), so
    that every later section stops at once; the first interruption is kept."""
    global _interruption
    if _interruption is None:
        _interruption = error


def interrupted() -> KeyboardInterrupt | None:
    """The run's interruption, or None."""
    return _interruption


def clear() -> None:
    """Forget the interruption (the run that received it has recorded it)."""
    global _interruption
    _interruption = None


@contextmanager
def interruptible() -> Iterator[None]:
    """A section the run may be interrupted in: the caller catches ``KeyboardInterrupt`` and
    keeps what finished.

    Raises:
        KeyboardInterrupt: on entry when the run was already interrupted; inside, when
            :func:`interrupt` is called (or Ctrl-C comes without a handler installed).
    """
    global _depth
    if _interruption is not None:
        raise _interruption
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


__all__ = ["clear", "interrupt", "interrupted", "interruptible", "note"]
