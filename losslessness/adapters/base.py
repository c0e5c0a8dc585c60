"""What the audit calls: an :class:`Adapter` wraps an implementation into the protocols."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from losslessness.protocol import (
    ChainVerifier,
    EndToEndGenerator,
    GreedyTreeVerifier,
    GreedyVerifier,
    InvalidInputError,
    ServingTreeVerifier,
    ServingVerifier,
    TreeVerifier,
)
from losslessness.results import TargetVerdict


class AdapterUnavailable(RuntimeError):
    """The adapter's implementation cannot be loaded here (package missing, API not found)."""


class NotApplicable(InvalidInputError):
    """A target's refusal of a case shape it cannot take by design (not a crash): vLLM's FLy,
    for instance, needs a window ``1 <= W < k`` and so k >= 2.

    A verifier or generator raises it from its call; the run then records every check of that
    case for that target as SKIPPED with the message ``not applicable: <reason>`` (never ERROR,
    never PASS), and the target's verdict is decided by its other checks (a target with nothing
    applicable is UNAVAILABLE, not LOSSLESS: :func:`losslessness.results.target_verdict`). To a
    direct caller it is still an :class:`~losslessness.protocol.InvalidInputError` (a
    ``ValueError``) naming the argument whose shape is refused.

    Args:
        reason: why the case does not apply, in the engine's terms (``"vLLM's FLy needs
            k >= 2 (window 1 <= W < k), got k = 1"``).
        argument: the call argument whose shape is refused (default ``draft_token_ids``, whose
            second dimension is k).

    Raises:
        ValueError: ``reason`` is empty.
    """

    def __init__(self, reason: str, argument: str = "draft_token_ids") -> None:
        if not reason.strip():
            raise ValueError("reason: must say why the case is not applicable")
        super().__init__(argument, f"not applicable: {reason}")
        self.reason = reason

    @property
    def skip_message(self) -> str:
        """The message of the SKIPPED checks: ``not applicable: <reason>``."""
        return f"not applicable: {self.reason}"


class AdapterNotFound(LookupError):
    """No adapter, entry point or ``pkg.module:callable`` matches the requested name."""


def import_optional(module: str, package: str) -> ModuleType:
    """Import ``module`` of the optional ``package`` an adapter wraps.

    Args:
        module: dotted module name (``"vllm.v1.sample.rejection_sampler"``).
        package: the distribution's name, for the message (``"vllm"``).

    Raises:
        AdapterUnavailable: the import failed (``{package} is not installed (or fails to
            import): {error}``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise AdapterUnavailable(
            f"{package} is not installed (or fails to import): {error}"
        ) from error


def require_cuda(why: str) -> None:
    """Raise :class:`AdapterUnavailable` (``CUDA is not available ({why})``) unless torch sees a
    CUDA device."""
    if not torch.cuda.is_available():
        raise AdapterUnavailable(f"CUDA is not available ({why})")


def seed_global_rng(seed: int, device: torch.device | str = "cpu") -> None:
    """Seed the global generators a wrapped target draws from: the CPU's always, and every CUDA
    device's when ``device`` is a CUDA device (what ``torch.manual_seed`` seeds there).

    Not ``torch.manual_seed`` on CPU: with CUDA not initialised it queues a lazy CUDA, XPU and
    MTIA seeding call, each holding a formatted stack, on every call: about 2.5 ms per verify
    call (a third of the default audit's transformers time) and a queue that grows all run.

    Args:
        seed: the seed, in ``[0, 2**64)``.
        device: the device the target's inputs are on.
    """
    torch.default_generator.manual_seed(seed)
    if torch.device(device).type == "cuda":
        torch.cuda.manual_seed_all(seed)


class KernelVerifier:
    """Base of chain verifiers that call a device kernel's Python wrapper.

    Args:
        function: the wrapper (``flashinfer.sampling.chain_speculative_sampling``, ...).
        device: the device the kernel runs on (a CUDA device).
    """

    def __init__(self, function: Callable[..., Any], device: str | torch.device = "cuda") -> None:
        self.function = function
        self.device = torch.device(device)


@dataclass(frozen=True)
class EndToEndTarget:
    """A whole speculative-decoding engine and the prompt it is audited on (docs/architecture.md,
    'Protocols').

    Attributes:
        name: how the audit reports it (``transformers-generate/assisted-sampling``).
        description: what is wrapped (package, version, models, sampling parameters, k).
        generator: the engine, in the :class:`~losslessness.protocol.EndToEndGenerator`
            protocol; ``generator.next_token_probs`` gives the target's processed law.
        prompt_ids: the prompt every generation starts from.
        new_tokens: L, the number of generated tokens whose joint law is tested (V^L cells).
        greedy: the engine decodes greedily: its output must equal plain greedy decoding of
            ``next_token_probs`` token for token, instead of following the sampled law.
        max_sequences: cap on the sequences the sequence-law check generates (slow engines);
            None: only the audit's cap. A capped check reports the larger minimum detectable
            TV it reached.
        min_sequence_mass: sequences and prefixes of lower probability are pooled into one
            tail cell of the law (an unfiltered law over a real tokenizer's vocabulary);
            0.0 enumerates every sequence of positive probability.
        requires_speculation: a whole engine with speculation on: unless its counters show
            drafts accepted during the audited runs, ``drafts-accepted`` says so and the target
            is INCONCLUSIVE (its law then says nothing about speculative decoding).
        predicted_acceptance: the share of drafted tokens the models predict the engine
            accepts (for instance ``sum min(p, q)`` at the first position for probabilistic
            drafting, 1 when the draft is the target), stated beside the observed share; None
            when no prediction is made.
        reproducible_seeds: the engine promises that a seed reproduces a request: the first
            sequences are generated again after the run and must be identical
            (``seed.contract``; a difference is IRREPRODUCIBLE, not LOSSY).
    """

    name: str
    description: str
    generator: EndToEndGenerator
    prompt_ids: tuple[int, ...]
    new_tokens: int
    greedy: bool = False
    max_sequences: int | None = None
    min_sequence_mass: float = 0.0
    requires_speculation: bool = False
    predicted_acceptance: float | None = None
    reproducible_seeds: bool = False


@dataclass(frozen=True)
class Adapter:
    """An implementation under audit, in the protocols of :mod:`losslessness.protocol`.

    Attributes:
        name: how the audit reports it (``reference``, ``transformers``, ``pkg.mod:fn``).
        description: what exactly is wrapped (package, version, function, conventions).
        chain: the chain sampling verifier, or None if the implementation has none.
        greedy: the greedy verifier, or None.
        end_to_end: whole engines audited by the sequence-law check, or empty.
        tree: the tree (multi-draft) sampling verifier, or None.
        greedy_tree: the greedy tree verifier, or None.
        exclusions: the cases the implementation does not take by design, in words
            (``"draft schemes other than top-k"``): its verifiers raise
            :class:`NotApplicable` on them, and the run states them beside the verdict instead
            of counting them as a design not reached (INCONCLUSIVE). None: every
            :class:`NotApplicable` is a shortfall.
        expected_verdict: the verdict the implementation is expected to get when it is lossy by
            design (``"LOSSY"``); the nightly's exit code says whether any verdict differs from
            its expectation. None: LOSSLESS expected.
        expected_reason: why (the design that makes it lossy), with ``expected_verdict``.
        serving: the serving verifier (raw logits and per-row requests), or None.
        engine_profile: the name of the engine profile whose law the serving verifier claims
            (:mod:`losslessness.reference.profiles`), or None (the audit's
            ``--engine-profile`` then names it).
        serving_tree: the serving tree verifier (raw logits at every node and a request per
            tree), or None; it claims :attr:`engine_profile`'s law too.
    """

    name: str
    description: str
    chain: ChainVerifier | None = None
    greedy: GreedyVerifier | None = None
    end_to_end: tuple[EndToEndTarget, ...] = ()
    tree: TreeVerifier | None = None
    greedy_tree: GreedyTreeVerifier | None = None
    exclusions: str | None = None
    expected_verdict: str | None = None
    expected_reason: str | None = None
    serving: ServingVerifier | None = None
    engine_profile: str | None = None
    serving_tree: ServingTreeVerifier | None = None

    def __post_init__(self) -> None:
        verifiers = (
            self.chain, self.greedy, self.tree, self.greedy_tree, self.serving, self.serving_tree
        )
        if all(verifier is None for verifier in verifiers) and not self.end_to_end:
            raise ValueError(
                f"adapter {self.name!r}: needs a chain, greedy, tree, greedy tree, serving or "
                "serving tree verifier, or an end-to-end target"
            )
        if (self.expected_verdict is None) != (self.expected_reason is None):
            raise ValueError(
                f"adapter {self.name!r}: expected_verdict and expected_reason go together"
            )
        if self.expected_verdict is not None:
            TargetVerdict(self.expected_verdict)
