"""What every whole-engine target shares: sampling settings, the generator the audit calls, the
cases each engine target is audited on, and the adapter built from them (issue 22).

An engine is reached through an :class:`EngineClient` (a server process's HTTP API, or a
small server of ours running the engine's in-process pipeline in the engine's own
environment). The client generates with speculation on and gives the engine's *own*
non-speculative next-token law; :class:`EngineGenerator` turns it into the
:class:`~losslessness.protocol.EndToEndGenerator` protocol the sequence-law check audits
(:mod:`losslessness.checks.sequence_law`), with the engine's draft counters
(:class:`~losslessness.protocol.ReportsDraftCounts`) and the law's agreement with
transformers on the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from losslessness.adapters.base import Adapter, EndToEndTarget
from losslessness.protocol import InvalidInputError, validate_probability_rows

__all__ = [
    "DEFAULT_CASES",
    "LAW_TOLERANCE",
    "BatchEngineClient",
    "BatchEngineGenerator",
    "EngineCase",
    "EngineClient",
    "EngineGenerator",
    "Sampling",
    "engine_adapter",
]

LAW_TOLERANCE = 1e-4
"""Largest absolute difference, per token, allowed between an engine's float32 next-token law
and transformers' on the same weights before the difference is reported (float32 kernels of
different engines agree to about 1e-6 on these models)."""


@dataclass(frozen=True)
class Sampling:
    """A request's sampling parameters, in the engines' common terms.

    Attributes:
        temperature: > 0; None decodes greedily.
        top_k: keep the k most likely tokens (None: off).
        top_p: nucleus mass in (0, 1] (None: off).
        min_p: keep tokens with at least min_p times the top probability (None: off).

    Raises:
        ValueError: a field out of range, named.
    """

    temperature: float | None = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and not (
            math.isfinite(self.temperature) and self.temperature > 0
        ):
            raise ValueError(f"temperature: must be > 0 or None, got {self.temperature!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k: must be >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1] or None, got {self.top_p!r}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p: must be in [0, 1] or None, got {self.min_p!r}")

    def to_json(self) -> dict[str, float | int | None]:
        """The four fields as the shims read them (``temperature`` None: greedy)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p}

    @property
    def greedy(self) -> bool:
        """Whether this is greedy decoding."""
        return self.temperature is None

    def label(self) -> str:
        """Short name: ``greedy``, ``t1``, ``t0.8-k20-p0.9-m0.05``."""
        if self.temperature is None:
            return "greedy"
        parts = [f"t{self.temperature:g}"]
        parts += [f"k{self.top_k}"] if self.top_k is not None else []
        parts += [f"p{self.top_p:g}"] if self.top_p is not None else []
        parts += [f"m{self.min_p:g}"] if self.min_p is not None else []
        return "-".join(parts)


class EngineClient(Protocol):
    """One engine started with speculation on (and able to answer without it).

    ``generate`` returns ``(new token ids, drafted, accepted)`` for one request: exactly
    ``max_new_tokens`` ids and the draft tokens the engine proposed and accepted in it.
    ``next_token_law`` returns the engine's own non-speculative next-token law after the whole
    prefix under ``sampling`` (``[V]`` floats summing to 1). ``close`` stops what was started.
    """

    vocab_size: int
    description: str

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, seed: int, sampling: Sampling
    ) -> tuple[list[int], int, int]: ...

    def next_token_law(self, prefix_ids: list[int], sampling: Sampling) -> list[float]: ...

    def close(self) -> None: ...


class BatchEngineClient(EngineClient, Protocol):
    """An :class:`EngineClient` that serves many requests at once (vLLM's ``LLM.generate``).

    ``generate_batch`` returns ``(one list of max_new_tokens ids per seed, drafted,
    accepted)``, the counters summed over the batch; ``batch_size`` is the most seeds one call
    takes.
    """

    batch_size: int

    def generate_batch(
        self, prompt_ids: list[int], max_new_tokens: int, seeds: list[int], sampling: Sampling
    ) -> tuple[list[list[int]], int, int]: ...


@dataclass
class EngineGenerator:
    """An engine client and one sampling setting, in the end-to-end protocols.

    Args:
        client: the engine.
        sampling: the requests' sampling parameters.
        reference_law: transformers' next-token law of the same target weights, unprocessed
            (``prefix -> [V]``), to cross-check the engine's law at temperature 1 without
            filters; None: no cross-check.
    """

    client: EngineClient
    sampling: Sampling
    reference_law: Callable[[list[int]], torch.Tensor] | None = None
    vocab_size: int = 0
    drafted: int = 0
    accepted: int = 0
    law_differences: list[float] = field(default_factory=list)
    _laws: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vocab_size = self.client.vocab_size

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        """One request with speculation on (see :class:`EngineClient`), seeded with
        ``seed % 2**32``: the engines take 32-bit seeds, and the audit's sequence seeds are
        consecutive, so they stay distinct.

        Raises:
            InvalidInputError: naming ``seed`` when it is negative.
            Exception: whatever the client raised (a failed engine: an ERROR for the case).
        """
        if seed < 0:
            raise InvalidInputError("seed", f"expected an int >= 0, got {seed!r}")
        tokens, drafted, accepted = self.client.generate(
            list(prompt_ids), max_new_tokens, seed % 2**32, self.sampling
        )
        self.drafted += drafted
        self.accepted += accepted
        return tokens

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        """The engine's non-speculative next-token law after ``prefix_ids`` (cached per prefix),
        compared with transformers' where a reference is set.

        Raises:
            InvalidInputError: naming ``next_token_law`` when the engine's row is malformed.
        """
        key = tuple(int(token) for token in prefix_ids)
        if key not in self._laws:
            row = torch.tensor(self.client.next_token_law(list(key), self.sampling),
                               dtype=torch.float64)
            if tuple(row.shape) != (self.vocab_size,):
                raise InvalidInputError(
                    "next_token_law", f"expected {self.vocab_size} probabilities, got "
                    f"{tuple(row.shape)} after {list(key)}"
                )
            validate_probability_rows("next_token_law", row)
            row = row / row.sum()
            if self.reference_law is not None:
                reference = self.reference_law(list(key))
                self.law_differences.append(float((row - reference).abs().max()))
            self._laws[key] = row
        return self._laws[key]

    def law_agreement(self) -> dict[str, float]:
        """How far the engine's law was from transformers' at the prefixes compared so far
        (:class:`~losslessness.protocol.ReportsLawAgreement`; temperature 1 cases only)."""
        return {
            "prefixes": float(len(self.law_differences)),
            "max_abs_difference": max(self.law_differences, default=0.0),
            "tolerance": LAW_TOLERANCE,
        }

    def draft_counts(self) -> dict[str, int]:
        """Draft tokens proposed and accepted since this generator was built."""
        return {"drafted": self.drafted, "accepted": self.accepted}


@dataclass
class BatchEngineGenerator(EngineGenerator):
    """An :class:`EngineGenerator` whose engine batches requests: also the
    :class:`~losslessness.protocol.GeneratesBatches` protocol.

    Args:
        client: the engine (a :class:`BatchEngineClient`).
    """

    client: BatchEngineClient
    batch_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.batch_size = self.client.batch_size

    def generate_batch(
        self, prompt_ids: list[int], max_new_tokens: int, seeds: list[int]
    ) -> list[list[int]]:
        """One batch of requests with speculation on, request ``j`` seeded with
        ``seeds[j] % 2**32`` (as :meth:`EngineGenerator.generate`).

        Raises:
            InvalidInputError: naming ``seeds`` when one is negative.
            Exception: whatever the client raised (a failed engine: an ERROR for the case).
        """
        if any(seed < 0 for seed in seeds):
            raise InvalidInputError("seeds", f"expected ints >= 0, got {seeds!r:.200}")
        sequences, drafted, accepted = self.client.generate_batch(
            list(prompt_ids), max_new_tokens, [seed % 2**32 for seed in seeds], self.sampling
        )
        self.drafted += drafted
        self.accepted += accepted
        return sequences


@dataclass(frozen=True)
class EngineCase:
    """One end-to-end case of an engine target.

    Attributes:
        prompt: the prompt's text (tokenised by the tiny models' tokenizer, ``<s>`` first).
        sampling: the requests' sampling parameters.
        new_tokens: L, the generated tokens whose joint law is tested.
    """

    prompt: str
    sampling: Sampling
    new_tokens: int = 4


PROMPTS = (
    "Ba ko tenu rasi",
    "Mira sulo ke",
)
"""Two prompts of pseudo-words (the tokenizer's corpus is made of such words)."""

DEFAULT_CASES = (
    EngineCase(PROMPTS[0], Sampling()),
    EngineCase(PROMPTS[1], Sampling()),
    EngineCase(PROMPTS[0], Sampling(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)),
    EngineCase(PROMPTS[1], Sampling(temperature=None)),
)
"""Two prompts at temperature 1, one with every filter the engines share, one greedy."""

MIN_SEQUENCE_MASS = 1e-3
"""Sequences and prefixes below this probability are pooled into the law's tail cell: the
tiny models' law of 4 tokens has about 150 sequences above it."""


def engine_adapter(
    name: str,
    client: EngineClient,
    prompt_ids: Callable[[str], Sequence[int]],
    cases: Sequence[EngineCase] = DEFAULT_CASES,
    reference_law: Callable[[list[int]], torch.Tensor] | None = None,
    predicted_acceptance: Callable[[EngineCase], float | None] | float | None = None,
    expected_verdict: str | None = None,
    expected_reason: str | None = None,
) -> Adapter:
    """An :class:`~losslessness.adapters.Adapter` auditing a whole engine on ``cases``.

    Args:
        name: ``e2e/<engine>-<drafter>``.
        client: the engine, speculation on.
        prompt_ids: the tokenizer (text -> ids).
        cases: the end-to-end cases.
        reference_law: transformers' law of the target (cross-checked at temperature 1).
        predicted_acceptance: the share of drafted tokens the models predict accepted: one
            value for every case, or ``case -> share`` called once per case as the adapter is
            built (:func:`~losslessness.adapters.e2e.acceptance.case_predictor`); None (or a
            case's None): no prediction.
        expected_verdict, expected_reason: for an engine lossy by design.

    Returns:
        The adapter; each case is an end-to-end target that must show speculation.
    """
    targets = []
    for index, case in enumerate(cases):
        predicted = (
            predicted_acceptance(case) if callable(predicted_acceptance)
            else predicted_acceptance
        )
        unfiltered = case.sampling == Sampling()
        reference = reference_law if unfiltered else None
        generator = (
            BatchEngineGenerator(client, case.sampling, reference)  # type: ignore[arg-type]
            if hasattr(client, "generate_batch")
            else EngineGenerator(client, case.sampling, reference)
        )
        targets.append(
            EndToEndTarget(
                name=f"{name}/{case.sampling.label()}-prompt{index}",
                description=f"{client.description}; {case.sampling.label()}; prompt "
                f"{case.prompt!r}",
                generator=generator,
                prompt_ids=tuple(prompt_ids(case.prompt)),
                new_tokens=case.new_tokens,
                greedy=case.sampling.greedy,
                min_sequence_mass=MIN_SEQUENCE_MASS,
                requires_speculation=True,
                predicted_acceptance=predicted,
                reproducible_seeds=True,
            )
        )
    return Adapter(
        name=name,
        description=client.description,
        end_to_end=tuple(targets),
        expected_verdict=expected_verdict,
        expected_reason=expected_reason,
    )
