"""The share of drafted tokens the tiny models predict an engine accepts (issue 22, item 3).

An engine target reports its draft counters (drafted, accepted); ``drafts-accepted``
(:mod:`losslessness.checks.sequence_law`) states the observed share and, when the target has
one, the share the models predict. The prediction comes from the project's own reference loop
(:class:`~losslessness.reference.decoding.SpeculativeDecoder` with a
:class:`~losslessness.reference.proposers.DraftModelProposer`) run on the tiny target and draft
(:mod:`losslessness.adapters.e2e.models`), loaded with transformers, for the engine's drafting
scheme: its K, greedy or probabilistic drafting, the law its draft samples from, whether its
first new token is drafted at all, and how it shortens drafts near ``max_new_tokens``
(:class:`DraftingScheme`). The share is ``sum accepted / sum drafted`` over ``sequences``
requests of L new tokens, seeds ``seed, seed + 1, ...``.

Why: one verification position accepts a draft ``d ~ q`` with probability ``sum_x min(p(x),
q(x))`` (Leviathan et al. 2022, "Fast Inference from Transformers via Speculative Decoding",
Sec. 3.3, alpha = 1 - TV(p, q); Chen et al. 2023, "Accelerating Large Language Model Decoding
with Speculative Sampling", Alg. 2), and a greedy draft ``argmax q`` with probability
``p(argmax q)`` (1 under greedy decoding when both argmaxes agree). An engine's share also
counts the drafts after a rejection, which are never verified, and depends on how many drafts
it proposes per step; the loop reproduces those, so the prediction is the share an exact
engine shows, up to Monte Carlo error. An engine far from it drafts or verifies otherwise
(the check only states both numbers).

Cost and error: the logits are cached per prefix (most prefixes repeat; one forward pass per
verify step gives the target's logits at all its positions), about 2 ms per forward pass and
1-2 ms per verify step on one core. :data:`DEFAULT_SEQUENCES` requests took 3-14 CPU seconds
per sampled case of the engine targets (one thread; 5-25 s of wall-clock time on a loaded
2-core machine), with standard errors of 0.004-0.007 on the share; a greedy request is
deterministic (greedy drafts, greedy verification), so one request is run and the standard
error is 0. Results are cached on disk as JSON beside the models (``models.directory /
"acceptance" / <hash>.json``, the hash of every input and :data:`RECIPE_VERSION`), so a second
call is instant.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from losslessness.adapters.e2e.engine import EngineCase, Sampling
from losslessness.adapters.e2e.models import TinyModels, load_model
from losslessness.reference.decoding import SpeculativeDecoder
from losslessness.reference.processing import SamplingParameters, apply_sampling_parameters
from losslessness.reference.profiles import get_profile
from losslessness.reference.proposers import DraftModelProposer, LanguageModel, Proposal
from losslessness.requests import Request

__all__ = [
    "DEFAULT_SEED",
    "DEFAULT_SEQUENCES",
    "RECIPE_VERSION",
    "DraftingScheme",
    "Prediction",
    "TransformersLanguageModel",
    "case_predictor",
    "predicted_acceptance",
    "prediction_lines",
]

RECIPE_VERSION = 1
"""Part of every cache key: raise it when the computation changes."""

DEFAULT_SEQUENCES = 3000
"""Requests per prediction: 6000-17000 drafted tokens for K = 3 and L = 4 on the engine
targets' cases, standard errors 0.004-0.007 on the share, 3-14 CPU seconds (module
docstring)."""

DEFAULT_SEED = 20221130
"""Seed of the first request (the next ones take ``seed + 1``, ...): fixed, so a prediction is
reproducible and its cache key stable (the date of Leviathan et al.'s arXiv submission)."""


@dataclass(frozen=True)
class Prediction:
    """The share of drafted tokens the reference loop accepted.

    Attributes:
        share: ``accepted / drafted`` in ``[0, 1]`` (``nan`` when nothing was drafted).
        standard_error: its Monte Carlo standard error (the ratio estimator's, by the delta
            method over the requests: ``sqrt(sum_i (a_i - share d_i)^2 / (n (n - 1))) /
            mean(d)``); 0 for a deterministic (greedy) request.
        sequences: n, the requests run.
        drafted: draft tokens proposed in all.
        accepted: those accepted.
        seconds: wall-clock seconds the computation took (not the cache read).
        cpu_seconds: the CPU seconds it took (one thread: the loop runs with
            ``torch.set_num_threads(1)``), what it costs on an idle core.
    """

    share: float
    standard_error: float
    sequences: int
    drafted: int
    accepted: int
    seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class DraftingScheme:
    """An engine's drafting, as far as its acceptance share depends on it.

    Attributes:
        k: K, the most drafts per step, ``>= 1``.
        greedy_drafting: the draft proposes its argmax and the target accepts it with
            probability ``p(d)`` (q one-hot); False: the draft samples ``d ~ q`` and the target
            accepts with ``min(1, p(d) / q(d))``. Greedy requests always draft greedily.
        plain_first_token: the first new token is sampled from the prefill without drafts
            (vLLM, llama.cpp, OpenVINO GenAI: the drafter runs after a token is sampled);
            False: the first step drafts after the prompt (ONNX Runtime GenAI).
        end_margin: with ``g`` tokens generated of L, a step drafts at most ``L - g -
            end_margin`` tokens (llama.cpp and OpenVINO GenAI 1: ``n_remaining - 1``; ONNX
            Runtime GenAI 0: ``max_length - seed_length``); None: always K (vLLM: drafts past
            ``max_tokens`` are verified and counted).
        draft_top_k: the draft samples from its top-k only (llama.cpp: 10), whatever the
            request's filters; None: no such cut.
        draft_filters: the draft's law gets the request's top-k, top-p and min-p (ONNX Runtime
            GenAI); False: only the request's temperature (vLLM, llama.cpp).
        profile: the engine profile (:mod:`losslessness.reference.profiles`) that processes
            both models' logits for a request (``"llama.cpp"``: top-k, top-p and min-p before
            the temperature); None: :func:`~losslessness.reference.processing.
            apply_sampling_parameters` (temperature, top-k, top-p, min-p: transformers', vLLM's
            and ONNX Runtime GenAI's order).

    Raises:
        ValueError: a field out of range, named.
    """

    k: int
    greedy_drafting: bool
    plain_first_token: bool = False
    end_margin: int | None = None
    draft_top_k: int | None = None
    draft_filters: bool = True
    profile: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k: must be an int >= 1, got {self.k!r}")
        if not isinstance(self.greedy_drafting, bool):
            raise ValueError(f"greedy_drafting: must be a bool, got {self.greedy_drafting!r}")
        if self.end_margin is not None and (
            isinstance(self.end_margin, bool) or not isinstance(self.end_margin, int)
            or self.end_margin < 0
        ):
            raise ValueError(f"end_margin: must be None or an int >= 0, got {self.end_margin!r}")
        if self.draft_top_k is not None and (
            isinstance(self.draft_top_k, bool) or not isinstance(self.draft_top_k, int)
            or self.draft_top_k < 1
        ):
            raise ValueError(f"draft_top_k: must be None or an int >= 1, got "
                             f"{self.draft_top_k!r}")
        if self.profile is not None:
            try:
                get_profile(self.profile)
            except ValueError as error:
                raise ValueError(f"profile: {error}") from None

    def draft_sampling(self, sampling: Sampling) -> Sampling:
        """The sampling the draft's law gets for a request of ``sampling`` (the request's
        own when greedy)."""
        if sampling.greedy:
            return sampling
        if self.draft_filters:
            top_k = sampling.top_k
            if self.draft_top_k is not None:
                top_k = self.draft_top_k if top_k is None else min(top_k, self.draft_top_k)
            return Sampling(sampling.temperature, top_k, sampling.top_p, sampling.min_p)
        return Sampling(sampling.temperature, self.draft_top_k)


# --------------------------------------------------------------------------- the models


class TransformersLanguageModel:
    """A tiny model saved by :func:`~losslessness.adapters.e2e.models.build_tiny_models`, in
    the reference loop's :class:`~losslessness.reference.proposers.LanguageModel` protocol.

    ``next_token_probs(prefix, sampling)`` is the law after the whole prefix: the float32
    logits of transformers' forward pass over the prefix, in float64, processed by ``process``
    (default :func:`~losslessness.reference.processing.apply_sampling_parameters`); ``sampling``
    None is the softmax (temperature 1, no filters). Logits are cached per prefix and laws per
    (sampling, prefix).

    Args:
        model_dir: the model's Hugging Face directory.
        process: ``(logits [V] float64, parameters) -> [V] float64`` law.

    Raises:
        AdapterUnavailable: transformers is missing or the directory does not load.
    """

    def __init__(
        self,
        model_dir: Path,
        process: Callable[[torch.Tensor, SamplingParameters], torch.Tensor] = (
            apply_sampling_parameters
        ),
    ) -> None:
        self.model = load_model(model_dir)
        self.vocab_size = int(self.model.config.vocab_size)
        self.process = process
        self.forward_passes = 0
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}
        self._laws: dict[tuple[SamplingParameters | None, tuple[int, ...]], torch.Tensor] = {}

    def logits(self, prefix_ids: Sequence[int]) -> torch.Tensor:
        """The float32 logits after ``prefix_ids`` (non-empty, ids in ``[0, V)``), as
        ``[V]`` float64."""
        key = tuple(int(token) for token in prefix_ids)
        if key not in self._logits:
            self.prefetch(key)
        return self._logits[key]

    def prefetch(self, ids: Sequence[int]) -> None:
        """Cache the logits after every prefix of ``ids`` that is not cached yet, from one
        forward pass over ``ids`` (causal attention: position ``j`` sees ``ids[:j+1]`` only; a
        cached prefix keeps its value, so a law never changes once read)."""
        key = tuple(int(token) for token in ids)
        if key in self._logits:
            return
        with torch.no_grad():
            rows = self.model(torch.tensor([key], dtype=torch.int64), use_cache=False).logits[0]
        self.forward_passes += 1
        for end in range(len(key), 0, -1):
            self._logits.setdefault(key[:end], rows[end - 1].to(torch.float64))

    def next_token_probs(
        self, prefix_ids: Sequence[int], sampling: SamplingParameters | None = None
    ) -> torch.Tensor:
        """The processed law after ``prefix_ids``: ``[V]`` float64 (class docstring)."""
        key = (sampling, tuple(int(token) for token in prefix_ids))
        if key not in self._laws:
            logits = self.logits(key[1])
            self._laws[key] = (
                torch.softmax(logits, dim=-1) if sampling is None
                else self.process(logits, sampling)
            )
        return self._laws[key]


def _profile_process(name: str) -> Callable[[torch.Tensor, SamplingParameters], torch.Tensor]:
    profile = get_profile(name)

    def process(logits: torch.Tensor, parameters: SamplingParameters) -> torch.Tensor:
        request = Request(temperature=parameters.temperature, top_k=parameters.top_k,
                          top_p=parameters.top_p, min_p=parameters.min_p)
        return profile.law(logits, request, ())

    return process


def _parameters(sampling: Sampling) -> SamplingParameters | None:
    """The reference's parameters of a sampled request; None at temperature 1 without filters
    (the softmax) and for greedy requests (argmax of the softmax)."""
    if sampling.greedy or sampling == Sampling():
        return None
    assert sampling.temperature is not None
    return SamplingParameters(sampling.temperature, sampling.top_k, sampling.top_p,
                              sampling.min_p)


class _EngineDrafts:
    """A proposer that drafts what the engine would at each step (:class:`DraftingScheme`'s
    ``plain_first_token`` and ``end_margin``), the drafts themselves from ``inner``; then the
    target's logits at the step's ``k' + 1`` positions are computed in one forward pass
    (``prefetch``), as the engine's verification does."""

    def __init__(
        self, inner: DraftModelProposer, prompt_length: int, new_tokens: int,
        plain_first_token: bool, end_margin: int | None, prefetch: Callable[[list[int]], None],
    ) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.prompt_length = prompt_length
        self.new_tokens = new_tokens
        self.plain_first_token = plain_first_token
        self.end_margin = end_margin
        self.prefetch = prefetch

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        generated = len(context) - self.prompt_length
        limit = 0 if self.plain_first_token and generated == 0 else k
        if self.end_margin is not None:
            limit = min(limit, self.new_tokens - generated - self.end_margin)
        proposal = self.inner.propose(context, max(limit, 0), generator)
        self.prefetch([*context, *proposal.token_ids])
        return proposal


# --------------------------------------------------------------------------- the prediction


def _simulate(
    models: TinyModels,
    prompt_ids: tuple[int, ...],
    sampling: Sampling,
    scheme: DraftingScheme,
    new_tokens: int,
    sequences: int,
    seed: int,
) -> tuple[list[int], list[int]]:
    """Run the reference loop ``sequences`` times: (drafted, accepted) per request."""
    process = (
        apply_sampling_parameters if scheme.profile is None else _profile_process(scheme.profile)
    )
    target = TransformersLanguageModel(models.target, process)
    draft: LanguageModel = (
        target if models.draft == models.target
        else TransformersLanguageModel(models.draft, process)
    )
    inner = DraftModelProposer(
        draft, _parameters(scheme.draft_sampling(sampling)),
        greedy=scheme.greedy_drafting or sampling.greedy,
    )
    proposer = _EngineDrafts(inner, len(prompt_ids), new_tokens, scheme.plain_first_token,
                             scheme.end_margin, target.prefetch)
    decoder = SpeculativeDecoder(target, proposer, scheme.k, _parameters(sampling),
                                 greedy=sampling.greedy)
    drafted, accepted = [], []
    for index in range(sequences):
        before = (decoder.counters.drafted, decoder.counters.accepted)
        decoder.generate(list(prompt_ids), new_tokens, seed + index)
        drafted.append(decoder.counters.drafted - before[0])
        accepted.append(decoder.counters.accepted - before[1])
    return drafted, accepted


def _summary(
    drafted: list[int], accepted: list[int], seconds: float, cpu_seconds: float
) -> Prediction:
    n, total_drafted, total_accepted = len(drafted), sum(drafted), sum(accepted)
    seconds, cpu_seconds = round(seconds, 3), round(cpu_seconds, 3)
    if total_drafted == 0:
        return Prediction(math.nan, math.nan, n, 0, total_accepted, seconds, cpu_seconds)
    share = total_accepted / total_drafted
    if n < 2:
        error = 0.0
    else:
        residuals = sum((a - share * d) ** 2 for d, a in zip(drafted, accepted, strict=True))
        error = math.sqrt(residuals / (n * (n - 1))) / (total_drafted / n)
    return Prediction(share, error, n, total_drafted, total_accepted, seconds, cpu_seconds)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: must be an int >= {low}, got {value!r}")
    return value


def predicted_acceptance(
    models: TinyModels,
    prompt_ids: Sequence[int],
    sampling: Sampling,
    k: int,
    greedy_drafting: bool,
    new_tokens: int = 4,
    sequences: int = DEFAULT_SEQUENCES,
    seed: int = DEFAULT_SEED,
    *,
    scheme: DraftingScheme | None = None,
    compute: bool = True,
) -> Prediction:
    """The share of drafted tokens the reference loop accepts on the tiny models (module
    docstring), from the disk cache when it is there.

    Args:
        models: the tiny target and draft (:func:`~losslessness.adapters.e2e.models.
            build_tiny_models`); the cache lies under ``models.directory / "acceptance"``.
        prompt_ids: the prompt's ids (``<s>`` first, as ``models.prompt_ids`` gives them), in
            ``[0, V)``, at least one.
        sampling: the requests' sampling parameters (greedy: :attr:`Sampling.greedy`).
        k: K, the most drafts per step, ``>= 1``.
        greedy_drafting: the draft proposes its argmax (True) or samples (False); greedy
            requests draft greedily either way.
        new_tokens: L, the new tokens per request, ``>= 1``.
        sequences: n, the requests, ``>= 2`` (a greedy request runs one: it is deterministic).
        seed: seed of the first request, an int ``>= 0``; request ``i`` is seeded ``seed + i``
            (the loop's one ``torch.Generator`` draws the drafts and the verification).
        scheme: the rest of the engine's drafting (:class:`DraftingScheme`); its ``k`` and
            ``greedy_drafting`` must equal the arguments. None: ``DraftingScheme(k,
            greedy_drafting)``: every step drafts K after the context, the first included.
        compute: compute what the cache lacks; False: raise :class:`LookupError` instead.

    Returns:
        :class:`Prediction` (share, standard error, n, counts, seconds of the computation).

    Raises:
        ValueError: an argument out of range, named.
        LookupError: not cached and ``compute`` is False.
        AdapterUnavailable: transformers is missing, or a model directory does not load.
    """
    if not isinstance(models, TinyModels):
        raise ValueError(f"models: expected TinyModels, got {type(models).__name__}")
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling: expected a Sampling, got {type(sampling).__name__}")
    _check_int("k", k, 1)
    if not isinstance(greedy_drafting, bool):
        raise ValueError(f"greedy_drafting: must be a bool, got {greedy_drafting!r}")
    _check_int("new_tokens", new_tokens, 1)
    _check_int("sequences", sequences, 2)
    _check_int("seed", seed, 0)
    ids = tuple(prompt_ids) if isinstance(prompt_ids, Sequence) else ()
    if not ids or any(
        isinstance(token, bool) or not isinstance(token, int)
        or not 0 <= token < models.vocab_size
        for token in ids
    ):
        raise ValueError(f"prompt_ids: expected at least one id in [0, {models.vocab_size}), "
                         f"got {prompt_ids!r:.200}")
    scheme = scheme if scheme is not None else DraftingScheme(k, greedy_drafting)
    if not isinstance(scheme, DraftingScheme) or (scheme.k, scheme.greedy_drafting) != (
        k, greedy_drafting
    ):
        raise ValueError(f"scheme: expected a DraftingScheme with k={k} and greedy_drafting="
                         f"{greedy_drafting}, got {scheme!r}")
    if sampling.greedy:
        # Deterministic: greedy drafts, greedy verification, no randomness drawn.
        scheme = DraftingScheme(k, True, scheme.plain_first_token, scheme.end_margin)
        sequences, seed = 1, 0
    inputs = {
        "recipe_version": RECIPE_VERSION,
        "models": models.directory.name,
        "target": models.target.name,
        "draft": models.draft.name,
        "prompt_ids": list(ids),
        "sampling": asdict(sampling),
        "scheme": asdict(scheme),
        "new_tokens": new_tokens,
        "sequences": sequences,
        "seed": seed,
    }
    text = json.dumps(inputs, sort_keys=True)
    path = models.directory / "acceptance" / (
        hashlib.blake2b(text.encode(), digest_size=8).hexdigest() + ".json"
    )
    if path.is_file():
        try:
            return Prediction(**json.loads(path.read_text())["prediction"])
        except (ValueError, KeyError, TypeError):
            pass  # unreadable: computed again and overwritten
    if not compute:
        raise LookupError(f"no cached prediction at {path}")
    began, cpu_began, threads = time.perf_counter(), time.process_time(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        drafted, accepted = _simulate(models, ids, sampling, scheme, new_tokens, sequences, seed)
    finally:
        torch.set_num_threads(threads)
    prediction = _summary(drafted, accepted, time.perf_counter() - began,
                          time.process_time() - cpu_began)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"inputs": inputs, "prediction": asdict(prediction)},
                                  indent=1) + "\n")
    os.replace(partial, path)
    return prediction


def _every_case(case: EngineCase) -> bool:
    return True


def case_predictor(
    models: TinyModels,
    scheme: DraftingScheme,
    prompt_ids: Callable[[str], Sequence[int]],
    compute: bool,
    applies: Callable[[EngineCase], bool] = _every_case,
) -> Callable[[EngineCase], float | None]:
    """Per-case predictions for :func:`~losslessness.adapters.e2e.engine.engine_adapter`.

    Args:
        models: the tiny models.
        scheme: the engine's drafting.
        prompt_ids: the adapter's tokenizer (text -> ids).
        compute: compute a prediction the cache lacks (3-14 CPU seconds per sampled case);
            False: such a case gets None (no prediction), so that loading an adapter
            stays fast. Each engine module's ``main()`` computes them
            (:func:`prediction_lines`).
        applies: whether the reference reproduces the engine's drafting for a case; the
            others get None.

    Returns:
        ``case -> share`` (None where ``applies`` says no, where nothing was drafted, or where
        the cache lacks it and ``compute`` is False).
    """

    def predict(case: EngineCase) -> float | None:
        if not applies(case):
            return None
        try:
            prediction = predicted_acceptance(
                models, prompt_ids(case.prompt), case.sampling, scheme.k,
                scheme.greedy_drafting, case.new_tokens, scheme=scheme, compute=compute,
            )
        except LookupError:
            return None
        return None if math.isnan(prediction.share) else prediction.share

    return predict


def prediction_lines(
    name: str,
    models: TinyModels,
    scheme: DraftingScheme,
    prompt_ids: Callable[[str], Sequence[int]],
    cases: Sequence[EngineCase],
    applies: Callable[[EngineCase], bool] = _every_case,
) -> list[str]:
    """Compute (or read) the prediction of every case of target ``name`` and describe each in
    a line (share, standard error, n, counts, seconds), for an engine module's ``main()``.

    Raises:
        AdapterUnavailable: transformers is missing.
    """
    lines = [f"predicted acceptance of {name} ({models.directory / 'acceptance'}):"]
    for index, case in enumerate(cases):
        label = f"{case.sampling.label()}-prompt{index}"
        if not applies(case):
            lines.append(f"  {label}: none (the reference does not draft as the engine does)")
            continue
        prediction = predicted_acceptance(
            models, prompt_ids(case.prompt), case.sampling, scheme.k, scheme.greedy_drafting,
            case.new_tokens, scheme=scheme,
        )
        lines.append(
            f"  {label}: {prediction.share:.4f} +- {prediction.standard_error:.4f} "
            f"({prediction.accepted} of {prediction.drafted} drafts, n={prediction.sequences}; "
            f"computed in {prediction.seconds:.1f} s, {prediction.cpu_seconds:.1f} CPU s)"
        )
    return lines
