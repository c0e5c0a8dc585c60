"""How an implementation under audit is called: reference, transformers, vLLM, SGLang,
FlashInfer, Medusa, EAGLE and the toy loops, each wrapped into a verifier protocol as an
:class:`Adapter` (names resolve to adapters in :mod:`losslessness.targets`)."""

from losslessness.adapters.base import (
    Adapter,
    AdapterNotFound,
    AdapterUnavailable,
    EndToEndTarget,
    NotApplicable,
)

__all__ = [
    "Adapter",
    "AdapterNotFound",
    "AdapterUnavailable",
    "EndToEndTarget",
    "NotApplicable",
]
