"""Hugging Face transformers' speculative sampling, wrapped into the chain protocol.

``transformers.generation.utils._speculative_sampling`` is the accept/reject step of assisted
generation with ``do_sample=True``. It differs from the chain protocol in four ways, each
bridged here:

- it takes logits, not probabilities: we pass ``log(p)`` and ``log(q)`` (``-inf`` where the
  mass is 0), which its softmax maps back to p and q up to float64 rounding;
- it handles batch 1 only: we call it once per row;
- it draws from torch's global RNG: we seed the global CPU RNG once per call from the
  audit's generator inside ``torch.random.fork_rng``, so the caller's RNG state is untouched
  and every run replays;
- its signature changed across versions (v4.38 ``last_assistant_token_is_eos, max_matches``;
  v4.40 ``is_done_candidate``; v5 ``assistant_ensemble_weight``): we inspect it and pass the
  parameters it has by name (done/EOS flags False, ``max_matches`` = k, optional extras left at
  their defaults).

Written against transformers 5.23.0; the signature inspection keeps 4.38+ working.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from losslessness.adapters.base import Adapter, AdapterUnavailable, seed_global_rng
from losslessness.protocol import PLACEHOLDER, validate_chain_inputs

_FLAGS_FALSE = ("is_done_candidate", "last_assistant_token_is_eos")


class SpeculativeSamplingVerifier:
    """Chain verifier calling one ``_speculative_sampling``-style function per batch row.

    Args:
        function: ``transformers.generation.utils._speculative_sampling`` or a function with
            one of its signatures.

    Raises:
        AdapterUnavailable: if the function has a required parameter this adapter cannot fill.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.parameters = inspect.signature(function).parameters
        known = {
            "candidate_input_ids",
            "candidate_logits",
            "candidate_length",
            "new_logits",
            "max_matches",
            *_FLAGS_FALSE,
        }
        unknown = [
            name
            for name, parameter in self.parameters.items()
            if name not in known
            and parameter.default is inspect.Parameter.empty
            and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        ]
        if unknown:
            raise AdapterUnavailable(
                "_speculative_sampling has required parameters this adapter does not know: "
                f"{unknown}"
            )

    def _arguments(
        self, ids: torch.Tensor, draft_logits: torch.Tensor, target_logits: torch.Tensor
    ) -> dict[str, Any]:
        k = ids.shape[1]
        values: dict[str, Any] = {
            "candidate_input_ids": ids,
            "candidate_logits": draft_logits,
            "candidate_length": k,
            "new_logits": target_logits,
            "max_matches": k,
            **dict.fromkeys(_FLAGS_FALSE, False),
        }
        return {name: value for name, value in values.items() if name in self.parameters}

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Verify a batch row by row (chain protocol; shapes as in
        :class:`losslessness.protocol.ChainVerifier`).

        Raises:
            InvalidInputError: malformed inputs.
            RuntimeError: the wrapped function returned more than k+1 tokens.
        """
        batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
        target_logits = target_probs.to(torch.float64).log()
        draft_logits = draft_probs.to(torch.float64).log()
        ids = draft_token_ids.to(torch.int64)
        out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            seed_global_rng(seed, target_probs.device)
            for b in range(batch):
                returned = self.function(
                    **self._arguments(
                        ids[b : b + 1], draft_logits[b : b + 1], target_logits[b : b + 1]
                    )
                )
                tokens = (returned[0] if isinstance(returned, tuple) else returned).reshape(-1)
                if tokens.numel() > k + 1:
                    raise RuntimeError(
                        f"_speculative_sampling returned {tokens.numel()} tokens for k = {k}"
                    )
                out[b, : tokens.numel()] = tokens
        return out


def adapter() -> Adapter:
    """Build the ``transformers`` adapter.

    Returns:
        An :class:`Adapter` with a chain verifier only (transformers' greedy path is inline in
        ``_assisted_decoding``, not a function that can be called on its own).

    Raises:
        AdapterUnavailable: transformers is not installed, or has no ``_speculative_sampling``.
    """
    try:
        import transformers
        from transformers.generation import utils
    except ImportError as error:
        raise AdapterUnavailable(
            "transformers is not installed; pip install 'losslessness[transformers]'"
        ) from error
    function = getattr(utils, "_speculative_sampling", None)
    if function is None:
        raise AdapterUnavailable(
            f"transformers {transformers.__version__} has no generation.utils._speculative_sampling"
        )
    signature = ", ".join(inspect.signature(function).parameters)
    return Adapter(
        name="transformers",
        description=f"transformers {transformers.__version__} generation.utils."
        f"_speculative_sampling({signature}); batch 1 per call, logits = log(probs), global RNG "
        "seeded from the audit's generator",
        chain=SpeculativeSamplingVerifier(function),
    )
