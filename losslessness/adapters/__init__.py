"""How an implementation under audit is called: reference, ``pkg.module:callable``,
transformers, and anything registered under the ``losslessness.adapters`` entry-point group."""

from losslessness.adapters.base import (
    Adapter,
    AdapterNotFound,
    AdapterUnavailable,
    EndToEndTarget,
    NotApplicable,
)
from losslessness.adapters.target import (
    ENTRY_POINT_GROUP,
    load_callable,
    registered_adapters,
    resolve_adapter,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "AdapterNotFound",
    "AdapterUnavailable",
    "EndToEndTarget",
    "NotApplicable",
    "load_callable",
    "registered_adapters",
    "resolve_adapter",
]
