"""Derivation of per-assertion seeds from one run seed (docs/architecture.md, 'Statistical method',
"Seeds")."""

from __future__ import annotations

import hashlib


def derive_seed(run_seed: int, *parts: str | int) -> int:
    """A 63-bit seed determined by the run seed and a path of names.

    The audit derives each case's sampling seed from ``(run seed, protocol, target, case hash)``
    so that one assertion replays alone, whatever else the run contained.

    Args:
        run_seed: the run's seed (any int).
        parts: names that identify the consumer (check id, case hash, ...).

    Returns:
        int in ``[0, 2**63)``, suitable for ``torch.Generator.manual_seed``.
    """
    text = "\x1f".join(str(part) for part in (run_seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
