"""Hugging Face transformers' ``generate`` with an assistant model or prompt lookup, end to end.

Most bugs that shipped in real engines sat in the plumbing around the accept/reject rule (cache
cropping, logits processors applied to one side only, draft windows cut by ``max_length``), so
this adapter audits the whole ``generate(..., assistant_model=...)`` and
``generate(..., prompt_lookup_num_tokens=...)`` calls, not ``_speculative_sampling`` alone
(that one is :mod:`losslessness.adapters.transformers`).

Models: a tiny randomly initialised Llama target (one layer, V = 8 tokens, seeded init, nothing
downloaded) and a draft that is the same network with its LM head perturbed by seeded Gaussian
noise, so that draft and target agree often enough (acceptance rate about 0.6-0.8 per position)
for drafts of length 2 to be accepted whole in a good share of verify steps.

Reference law: :meth:`TransformersGenerator.next_token_probs` runs *plain* ``generate`` (no
assistant) for one token with ``output_scores=True``; its score is the target's logits after
exactly the logits processors ``generate`` builds from the same :class:`GenerationConfig`
(temperature, top-k, top-p, and transformers' own defaults such as ``top_k=50``). Lossless
assisted generation must reproduce that law (docs/architecture.md, 'What lossless means', item 8).

Draft settings: transformers reads ``num_assistant_tokens``, ``num_assistant_tokens_schedule``
and ``assistant_confidence_threshold`` from the *assistant's* ``generation_config``
(``AssistedCandidateGenerator.__init__``). We set k, ``"constant"`` (the ``"heuristic"``
schedule carries k over from one ``generate`` call to the next, which would make calls depend
on each other) and threshold 0 (a positive threshold stops drafting early and, with sklearn
installed, is re-fitted across steps). EOS is disabled, so every call emits exactly
``max_new_tokens`` tokens.

Accepted lengths: counted by wrapping the candidate generator's
``update_candidate_strategy(input_ids, scores, num_matches)``, which ``_assisted_decoding``
calls once per verify step with ``scores`` of shape ``[1, drafted + 1, V]`` and
``num_matches`` the accepted draft tokens (after the ``max_length`` crop). The candidate
generator is created inside ``generate`` by ``GenerationMixin._get_candidate_generator``; we
wrap that method on the target model instance for the duration of one call. Written against
transformers 5.23.0; if a later version stops calling the hook, :meth:`generate` raises rather
than reporting zero verify steps.

Lossy knob: transformers 5.x has ``GenerationConfig.assistant_ensemble_weight`` (DIVERSE static
ensemble verification, https://arxiv.org/abs/2604.07622), documented as trading exactness for
acceptance: it accepts against ``w p + (1 - w) q``. :func:`assisted_generation_target` exposes
it so tests can check that the audit calls it lossy.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from losslessness.adapters.base import (
    Adapter,
    AdapterUnavailable,
    EndToEndTarget,
    seed_global_rng,
)
from losslessness.protocol import InvalidInputError

TRANSFORMERS_VERSION_WRITTEN_AGAINST = "5.23.0"
"""The transformers version whose ``_assisted_decoding`` the step-counting hook was read from."""

VOCAB_SIZE = 8
"""V of the tiny models: V**3 = 512 sequence cells for L = 3, few enough to enumerate."""

HIDDEN_SIZE = 16
INIT_STD = 0.45
"""Weight init std: large enough that the next-token laws are peaked (a handful of likely
tokens after top-k/top-p), small enough that no position is deterministic."""

MODEL_SEED = 0
DRAFT_NOISE = 0.4
"""Std of the draft LM head's perturbation, relative to :data:`INIT_STD`. Chosen with
:data:`MODEL_SEED` by a search over seeds 0-11, stds {0.35, 0.45} and noises {0.4, 0.6}
(exact laws, default prompt and sampling parameters): acceptance rate 0.75 at the first
position and 0.59 at the second, so both drafts of the first verify step are accepted with
probability 0.45; the sequence law has 13 cells of positive mass."""

DRAFT_LENGTH = 2
"""k: draft tokens per verify step. With L = 3 new tokens the first step drafts 2 (the
candidate generator caps drafts at ``max_length - 1``), so a step can accept a whole draft of
length 2 and still emit its bonus token."""

SAMPLED_NEW_TOKENS = 3
"""L for sampled targets: the sequence-law check enumerates V**L = 512 cells."""

MAX_SEQUENCES = 2000
"""Cap on the sequences the sequence-law check generates per sampled target. ``generate`` is
batch 1: measured 6.7 ms a call (assisted) and 3.7 ms (prompt lookup) on an idle 2-core
machine, 2-3 times that under load, so 8-13 s a target. At 2000 the test detects, with power
0.9, a TV of 0.087 (assisted) and 0.090 (prompt lookup) from the target's law at level 5e-4
(``audit transformers-generate``), 0.098 and 0.102 at 6.7e-6 (the default audit's level)
(:func:`losslessness.stats.identity_minimum_detectable_tv`)."""

GREEDY_NEW_TOKENS = 6
"""L for greedy targets: only the greedy path is compared, so L can be longer."""

TEMPERATURE = 0.8
TOP_K = 4
TOP_P = 0.9
"""Default sampling parameters: all three warpers act (each cuts or reshapes the law)."""

ASSISTED_PROMPT: tuple[int, ...] = (1, 2, 3, 4)
"""Prompt of the assisted targets (any ids in [0, V) serve; these are fixed for replay)."""

_LOOKUP_KEY: tuple[int, int] = (1, 2)
"""Prompt-lookup prompts are ``key + continuation + separator + key``: the trailing 2-gram
``key`` occurs earlier, so the candidate generator proposes ``continuation`` as the draft."""

_LOOKUP_SEPARATOR = 5


def _require_transformers() -> Any:
    """Import transformers, or raise :class:`AdapterUnavailable` saying how to install it."""
    try:
        import transformers
    except ImportError as error:
        raise AdapterUnavailable(
            "transformers is not installed; pip install 'losslessness[transformers]'"
        ) from error
    return transformers


@dataclass(frozen=True)
class TinyModels:
    """A tiny target and draft sharing one vocabulary (weights built in code, nothing downloaded).

    Attributes:
        target: ``transformers.LlamaForCausalLM`` in eval mode.
        draft: the same architecture, its LM head perturbed; in eval mode.
        description: how they were built (config, seeds), for reports.
    """

    target: Any
    draft: Any
    description: str


@functools.lru_cache(maxsize=4)
def tiny_models(
    vocab_size: int = VOCAB_SIZE,
    seed: int = MODEL_SEED,
    init_std: float = INIT_STD,
    draft_noise: float = DRAFT_NOISE,
) -> TinyModels:
    """Build (once per argument set) a tiny Llama target and its perturbed-head draft.

    Args:
        vocab_size: V, at least 2.
        seed: ``torch.manual_seed`` for the target's init and the draft's perturbation; the
            caller's global RNG is left as it was.
        init_std: ``LlamaConfig.initializer_range``, > 0.
        draft_noise: std of the Gaussian added to the draft's LM head, relative to
            ``init_std``, >= 0 (0 makes draft == target).

    Returns:
        :class:`TinyModels` (cached: callers share the instances and must not modify them).

    Raises:
        AdapterUnavailable: transformers is not installed.
        ValueError: naming the argument, for values out of range.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size: must be >= 2, got {vocab_size}")
    if not init_std > 0:
        raise ValueError(f"init_std: must be > 0, got {init_std}")
    if not draft_noise >= 0:
        raise ValueError(f"draft_noise: must be >= 0, got {draft_noise}")
    transformers = _require_transformers()
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=init_std,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = transformers.LlamaForCausalLM(config).eval()
        draft = copy.deepcopy(target)
        with torch.no_grad():
            head = draft.lm_head.weight
            head.add_(draft_noise * init_std * torch.randn(head.shape, dtype=head.dtype))
    description = (
        f"tiny LlamaForCausalLM (1 layer, hidden {HIDDEN_SIZE}, V {vocab_size}, init std "
        f"{init_std}, seed {seed}); draft = target with LM head + N(0, ({draft_noise} x "
        f"{init_std})^2)"
    )
    return TinyModels(target=target, draft=draft, description=description)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Run with torch's global CPU RNG seeded by ``seed``, no autograd and one intra-op thread;
    the RNG state and thread count are restored afterwards.

    One thread because the models are tiny: on a shared 2-core machine torch's second thread
    spins against other processes and made each ``generate`` call 10 times slower in CPU time
    (measured: 150-200 ms versus 10-11 ms per call under load).
    """
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        seed_global_rng(seed)
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


class TransformersGenerator:
    """``model.generate`` with an assistant model or prompt lookup, batch 1, seeded per call.

    Implements :class:`~losslessness.protocol.EndToEndGenerator` and
    :class:`~losslessness.protocol.ReportsAcceptedLengths`.

    Args:
        model: the target, a transformers causal LM (``generate`` and ``config.vocab_size``).
        generation_config: ``transformers.GenerationConfig`` for every call (sampling
            parameters, EOS disabled); ``max_new_tokens`` is overridden per call.
        assistant_model: the draft model, or None for prompt lookup. Its ``generation_config``
            must already carry the draft settings (see :func:`assisted_generation_target`).
        prompt_lookup_num_tokens: k for prompt-lookup decoding, or None for an assistant model.

    Raises:
        ValueError: neither or both of ``assistant_model`` and ``prompt_lookup_num_tokens``.
    """

    def __init__(
        self,
        model: Any,
        generation_config: Any,
        *,
        assistant_model: Any = None,
        prompt_lookup_num_tokens: int | None = None,
    ) -> None:
        if (assistant_model is None) == (prompt_lookup_num_tokens is None):
            raise ValueError(
                "assistant_model: exactly one of assistant_model and prompt_lookup_num_tokens "
                "must be given"
            )
        self.model = model
        self.generation_config = generation_config
        self.assistant_model = assistant_model
        self.prompt_lookup_num_tokens = prompt_lookup_num_tokens
        self.vocab_size: int = int(model.config.vocab_size)
        self._steps: Counter[tuple[int, int]] = Counter()
        self._law_cache: dict[tuple[int, ...], torch.Tensor] = {}
        self._configs: dict[tuple[tuple[str, Any], ...], Any] = {}

    def check_ids(self, name: str, ids: Sequence[int]) -> list[int]:
        """Validate token ids for this vocabulary.

        Args:
            name: the argument's name, used in error messages.
            ids: a non-empty sequence of integers (Python or numpy) in ``[0, V)``.

        Returns:
            The ids as a list of Python ints.

        Raises:
            InvalidInputError: naming ``name``: empty, a non-integer, or an id out of range.
        """
        values = list(ids)
        if not values:
            raise InvalidInputError(name, "must not be empty (generation needs a prompt)")
        result = []
        for position, token in enumerate(values):
            if isinstance(token, bool):
                raise InvalidInputError(name, f"expected int token ids, got a bool at {position}")
            try:
                value = operator.index(token)
            except TypeError:
                raise InvalidInputError(
                    name, f"expected int token ids, got {type(token).__name__} at {position}"
                ) from None
            if not 0 <= value < self.vocab_size:
                raise InvalidInputError(
                    name, f"token id {value} at {position} out of range [0, {self.vocab_size})"
                )
            result.append(value)
        return result

    def _config(self, **overrides: Any) -> Any:
        """The generation config with ``overrides`` (cached per override set): passing them to
        ``generate`` next to a ``generation_config`` is deprecated in transformers 5."""
        key = tuple(sorted(overrides.items()))
        config = self._configs.get(key)
        if config is None:
            config = copy.deepcopy(self.generation_config)
            for field, value in overrides.items():
                setattr(config, field, value)
            self._configs[key] = config
        return config

    @contextmanager
    def _counting_steps(self, steps: list[tuple[int, int]]) -> Iterator[None]:
        """Record ``(drafted, accepted)`` per verify step of the ``generate`` calls inside.

        Wraps ``_get_candidate_generator`` on the model instance (not the class), so that
        the candidate generator it returns reports every ``update_candidate_strategy`` call.
        """
        original = self.model._get_candidate_generator

        def counting_factory(*args: Any, **kwargs: Any) -> Any:
            candidate_generator = original(*args, **kwargs)
            update = candidate_generator.update_candidate_strategy

            def counting_update(input_ids: Any, scores: Any, num_matches: Any) -> Any:
                steps.append((int(scores.shape[1]) - 1, int(num_matches)))
                return update(input_ids, scores, num_matches)

            candidate_generator.update_candidate_strategy = counting_update
            return candidate_generator

        self.model._get_candidate_generator = counting_factory
        try:
            yield
        finally:
            del self.model._get_candidate_generator

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        """Run assisted generation (or prompt lookup) once and return the new tokens.

        Args:
            prompt_ids: the prompt, ids in ``[0, V)``, not empty.
            max_new_tokens: L >= 1; EOS is disabled, so exactly L tokens come back.
            seed: in ``[0, 2**64)``; seeds torch's global CPU RNG (all of ``generate``'s
                randomness: the draft's sampling, ``_speculative_sampling``'s uniforms, the
                resampling) inside ``torch.random.fork_rng``; the caller's RNG is untouched.

        Returns:
            The generated ids (``list[int]``), prompt excluded.

        Raises:
            InvalidInputError: naming ``prompt_ids``, ``max_new_tokens`` or ``seed``.
            RuntimeError: ``generate`` ran no verify step that the hook saw (transformers
                changed how candidate generators are built; see the module docstring).
        """
        prompt = self.check_ids("prompt_ids", prompt_ids)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise InvalidInputError("max_new_tokens", f"expected an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise InvalidInputError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise InvalidInputError("seed", f"expected an int in [0, 2**64), got {seed!r}")
        input_ids = torch.tensor([prompt], dtype=torch.int64)
        steps: list[tuple[int, int]] = []
        if self.assistant_model is not None:
            config = self._config(max_new_tokens=max_new_tokens)
            extra = {"assistant_model": self.assistant_model}
        else:
            config = self._config(
                max_new_tokens=max_new_tokens,
                prompt_lookup_num_tokens=self.prompt_lookup_num_tokens,
            )
            extra = {}
        with _seeded(seed), self._counting_steps(steps):
            output = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=config,
                **extra,
            )
        if not steps:
            raise RuntimeError(
                "transformers' generate ran no verify step through the candidate generator's "
                "update_candidate_strategy; the step-counting hook was written against "
                f"transformers {TRANSFORMERS_VERSION_WRITTEN_AGAINST} and no longer applies"
            )
        self._steps.update(steps)
        return [int(token) for token in output[0, len(prompt) :].tolist()]

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        """The target's processed next-token law given ``prefix_ids``, as plain sampling has it.

        Runs ``model.generate`` without assistant for one token with ``output_scores=True``
        and the same :class:`GenerationConfig`; the score is the logits after every processor
        ``generate`` applies. The sampled token is discarded (global RNG forked). Results are
        cached per prefix.

        Args:
            prefix_ids: prompt plus generated tokens, ids in ``[0, V)``, not empty.

        Returns:
            ``[V]`` float64 summing to 1: ``softmax`` of the processed scores (tokens the
            processors removed, at ``-inf``, get exactly 0).

        Raises:
            InvalidInputError: naming ``prefix_ids``.
        """
        prefix = tuple(self.check_ids("prefix_ids", prefix_ids))
        cached = self._law_cache.get(prefix)
        if cached is None:
            input_ids = torch.tensor([prefix], dtype=torch.int64)
            config = self._config(
                max_new_tokens=1, output_scores=True, return_dict_in_generate=True
            )
            with _seeded(0):
                output = self.model.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config
                )
            cached = output.scores[0][0].to(torch.float64).softmax(dim=-1)
            self._law_cache[prefix] = cached
        return cached.clone()

    def accepted_length_counts(self) -> dict[int, int]:
        """Verify steps by accepted draft length (0..k), summed over every :meth:`generate`.

        Steps that drafted nothing (prompt lookup without a match, or no room left under
        ``max_length``) count as accepted length 0; :meth:`drafted_length_counts` tells them
        apart.
        """
        counts: Counter[int] = Counter()
        for (_, accepted), number in self._steps.items():
            counts[accepted] += number
        return dict(sorted(counts.items()))

    def drafted_length_counts(self) -> dict[int, int]:
        """Verify steps by the number of draft tokens proposed (0..k), over every call."""
        counts: Counter[int] = Counter()
        for (drafted, _), number in self._steps.items():
            counts[drafted] += number
        return dict(sorted(counts.items()))


def _generation_config(
    do_sample: bool, temperature: float, top_k: int | None, top_p: float, extra: dict[str, Any]
) -> Any:
    """``GenerationConfig`` with EOS disabled and, when sampling, the warpers' parameters."""
    transformers = _require_transformers()
    options: dict[str, Any] = {"do_sample": do_sample, "eos_token_id": None, "pad_token_id": 0}
    if do_sample:
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"temperature: must be > 0, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
            raise ValueError(f"top_k: must be an int >= 1 or None, got {top_k!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k: must be >= 1 or None, got {top_k}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p: must lie in (0, 1], got {top_p!r}")
        # top_k=None would let transformers' default (50) apply; 0 disables the warper.
        options.update(temperature=temperature, top_k=0 if top_k is None else top_k, top_p=top_p)
    options.update(extra)
    return transformers.GenerationConfig(**options)


def _check_length(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an int >= 1, got {value!r}")


def _sampling_label(do_sample: bool, temperature: float, top_k: int | None, top_p: float) -> str:
    if not do_sample:
        return "greedy"
    return f"do_sample, temperature {temperature}, top_k {top_k}, top_p {top_p}"


def assisted_generation_target(
    *,
    name: str | None = None,
    do_sample: bool = True,
    temperature: float = TEMPERATURE,
    top_k: int | None = TOP_K,
    top_p: float = TOP_P,
    draft_length: int = DRAFT_LENGTH,
    new_tokens: int = SAMPLED_NEW_TOKENS,
    prompt_ids: Sequence[int] = ASSISTED_PROMPT,
    assistant_ensemble_weight: float | None = None,
    models: TinyModels | None = None,
    max_sequences: int | None = MAX_SEQUENCES,
) -> EndToEndTarget:
    """``generate(..., assistant_model=draft)`` on the tiny models, as an end-to-end target.

    Args:
        name: report name; default ``transformers-generate/assisted-sampling`` or ``-greedy``.
        do_sample: sampled speculative decoding (``_speculative_sampling``) when True, greedy
            assisted decoding when False (the target is then marked ``greedy``).
        temperature: > 0, used when ``do_sample``.
        top_k: >= 1, or None for no top-k (transformers' default of 50 is switched off).
        top_p: in (0, 1].
        draft_length: k, the assistant's ``num_assistant_tokens`` (constant schedule,
            confidence threshold 0).
        new_tokens: L, tokens per call whose joint law is tested (V**L cells).
        prompt_ids: the prompt, ids in ``[0, V)``.
        assistant_ensemble_weight: transformers' documented lossy knob (accept against
            ``w p + (1 - w) q``), in (0, 1), or None for standard speculative decoding.
        models: the target and draft; default :func:`tiny_models` ``()``.
        max_sequences: cap on the sequences the sequence-law check generates, or None for
            the audit's own cap only.

    Returns:
        An :class:`EndToEndTarget` whose generator is a :class:`TransformersGenerator`.

    Raises:
        AdapterUnavailable: transformers is missing, or ``assistant_ensemble_weight`` is given
            and the installed version has no such option.
        ValueError: naming the argument, for values out of range.
    """
    transformers = _require_transformers()
    _check_length("draft_length", draft_length)
    _check_length("new_tokens", new_tokens)
    extra: dict[str, Any] = {}
    if assistant_ensemble_weight is not None:
        if not hasattr(transformers.GenerationConfig(), "assistant_ensemble_weight"):
            raise AdapterUnavailable(
                f"transformers {transformers.__version__} has no assistant_ensemble_weight"
            )
        if not 0 < assistant_ensemble_weight < 1:
            raise ValueError(
                f"assistant_ensemble_weight: must lie in (0, 1) or be None, got "
                f"{assistant_ensemble_weight!r}"
            )
        extra["assistant_ensemble_weight"] = assistant_ensemble_weight
    config = _generation_config(do_sample, temperature, top_k, top_p, extra)
    pair = tiny_models() if models is None else models
    # The draft settings live on the assistant's own generation config, so each target gets its
    # own (cheap) copy of the draft instead of sharing one whose config another target changed.
    assistant = copy.deepcopy(pair.draft)
    assistant.generation_config.num_assistant_tokens = draft_length
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    generator = TransformersGenerator(pair.target, config, assistant_model=assistant)
    prompt = tuple(generator.check_ids("prompt_ids", prompt_ids))
    mode = "sampling" if do_sample else "greedy"
    lossy = (
        ""
        if assistant_ensemble_weight is None
        else f", assistant_ensemble_weight {assistant_ensemble_weight}"
    )
    return EndToEndTarget(
        name=name or f"transformers-generate/assisted-{mode}",
        description=(
            f"transformers {transformers.__version__} generate(assistant_model=...), "
            f"{_sampling_label(do_sample, temperature, top_k, top_p)}, num_assistant_tokens "
            f"{draft_length} (constant), assistant_confidence_threshold 0{lossy}; "
            f"{pair.description}"
        ),
        generator=generator,
        prompt_ids=prompt,
        new_tokens=new_tokens,
        greedy=not do_sample,
        max_sequences=max_sequences,
    )


def lookup_prompt(
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
    continuation_length: int = DRAFT_LENGTH,
) -> tuple[int, ...]:
    """A prompt on which prompt lookup proposes the target's own likely continuation.

    The prompt is ``key + c + separator + key`` with ``key`` = (1, 2): its trailing 2-gram
    occurs at the start, so ``PromptLookupCandidateGenerator`` drafts ``c``. Among all
    ``V**len(c)`` choices, ``c`` maximises the target's log-probability of continuing the prompt
    with ``c`` (raw logits; a heuristic for a high acceptance rate, not part of any verdict).

    Args:
        logits_of: maps ``[N, T]`` int64 ids to ``[N, T, V]`` logits (the target's forward).
        vocab_size: V, at least 6 (the key and separator are ids 1, 2 and 5).
        continuation_length: ``len(c)`` >= 1.

    Returns:
        The prompt, a tuple of ids.

    Raises:
        ValueError: naming the argument, for values out of range.
    """
    if vocab_size <= max(*_LOOKUP_KEY, _LOOKUP_SEPARATOR):
        raise ValueError(f"vocab_size: must exceed {_LOOKUP_SEPARATOR}, got {vocab_size}")
    _check_length("continuation_length", continuation_length)
    choices = torch.cartesian_prod(*[torch.arange(vocab_size)] * continuation_length).reshape(
        -1, continuation_length
    )
    count = choices.shape[0]
    key = torch.tensor(_LOOKUP_KEY).expand(count, -1)
    separator = torch.full((count, 1), _LOOKUP_SEPARATOR)
    prompts = torch.cat([key, choices, separator, key], dim=1)
    # Score c_1..c_m as the continuation of the whole prompt: logits at the prompt's end for
    # c_1, then at each appended c_i for c_{i+1}.
    sequences = torch.cat([prompts, choices], dim=1)
    with torch.no_grad():
        log_probs = logits_of(sequences).to(torch.float64).log_softmax(dim=-1)
    end = prompts.shape[1] - 1
    scores = torch.zeros(count, dtype=torch.float64)
    for i in range(continuation_length):
        scores += log_probs[torch.arange(count), end + i, choices[:, i]]
    return tuple(int(token) for token in prompts[int(scores.argmax())].tolist())


def prompt_lookup_target(
    *,
    name: str | None = None,
    do_sample: bool = True,
    temperature: float = TEMPERATURE,
    top_k: int | None = TOP_K,
    top_p: float = TOP_P,
    draft_length: int = DRAFT_LENGTH,
    new_tokens: int = SAMPLED_NEW_TOKENS,
    prompt_ids: Sequence[int] | None = None,
    models: TinyModels | None = None,
    max_sequences: int | None = MAX_SEQUENCES,
) -> EndToEndTarget:
    """``generate(..., prompt_lookup_num_tokens=k)`` on the tiny target, as an end-to-end target.

    Prompt lookup has no draft logits, so ``_assisted_decoding`` verifies by sample-and-match
    (sample every position from p, accept while the samples equal the draft) when sampling, and
    by argmax match when greedy; both are lossless.

    Args:
        name: report name; default ``transformers-generate/prompt-lookup-sampling``/``-greedy``.
        do_sample, temperature, top_k, top_p, draft_length, new_tokens, models,
        max_sequences: as in
            :func:`assisted_generation_target` (``draft_length`` is
            ``prompt_lookup_num_tokens``).
        prompt_ids: the prompt; default :func:`lookup_prompt` for the target, on which lookup
            drafts the target's likely continuation.

    Returns:
        An :class:`EndToEndTarget` whose generator is a :class:`TransformersGenerator`.

    Raises:
        AdapterUnavailable: transformers is missing.
        ValueError: naming the argument, for values out of range.
    """
    transformers = _require_transformers()
    _check_length("draft_length", draft_length)
    _check_length("new_tokens", new_tokens)
    config = _generation_config(do_sample, temperature, top_k, top_p, {})
    pair = tiny_models() if models is None else models
    generator = TransformersGenerator(pair.target, config, prompt_lookup_num_tokens=draft_length)
    if prompt_ids is None:
        prompt_ids = lookup_prompt(
            lambda ids: pair.target(ids).logits, generator.vocab_size, draft_length
        )
    prompt = tuple(generator.check_ids("prompt_ids", prompt_ids))
    mode = "sampling" if do_sample else "greedy"
    return EndToEndTarget(
        name=name or f"transformers-generate/prompt-lookup-{mode}",
        description=(
            f"transformers {transformers.__version__} generate(prompt_lookup_num_tokens="
            f"{draft_length}), {_sampling_label(do_sample, temperature, top_k, top_p)}; "
            f"{pair.description}"
        ),
        generator=generator,
        prompt_ids=prompt,
        new_tokens=new_tokens,
        greedy=not do_sample,
        max_sequences=max_sequences,
    )


def adapter() -> Adapter:
    """Build the ``transformers-generate`` adapter: four end-to-end targets on the tiny models.

    Targets: assisted generation sampled (temperature 0.8, top-k 4, top-p 0.9; L = 3, k = 2)
    and greedy (L = 6), prompt lookup sampled (same parameters) and greedy (L = 6).

    Raises:
        AdapterUnavailable: transformers is not installed.
    """
    transformers = _require_transformers()
    targets = (
        assisted_generation_target(),
        assisted_generation_target(do_sample=False, new_tokens=GREEDY_NEW_TOKENS),
        prompt_lookup_target(),
        prompt_lookup_target(do_sample=False, new_tokens=GREEDY_NEW_TOKENS),
    )
    return Adapter(
        name="transformers-generate",
        description=(
            f"transformers {transformers.__version__} generate() end to end: assisted "
            "generation and prompt-lookup decoding, sampled and greedy, on tiny seeded models"
        ),
        end_to_end=targets,
    )
