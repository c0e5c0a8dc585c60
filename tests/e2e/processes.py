"""What the engine tests share about processes."""

from __future__ import annotations

import time


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` no longer runs (a zombie counts as gone) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False
