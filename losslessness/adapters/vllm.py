"""vLLM's speculative-decoding samplers (Triton kernels), wrapped into the chain and greedy
protocols, on CUDA or through Triton's interpreter on CPU (:mod:`losslessness.adapters.engines`).

Checked against vLLM 0.33.0 (:data:`VLLM`); outside that version the adapter compares the
signatures it calls with the ones below and, where they differ, is UNAVAILABLE with the
parameters added and removed (:func:`~losslessness.adapters.engines.require_parameters`).

**Model runner v1** (``vllm/v1/sample/rejection_sampler.py``): the unmodified
``RejectionSampler.forward(metadata, draft_probs, logits, sampling_metadata)`` runs; it samples
the bonus token with vLLM's ``Sampler``, applies temperature to the target logits, then calls
``rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
draft_probs, target_logits, bonus_token_ids, sampling_metadata, synthetic_mode,
synthetic_conditional_rates, use_fp64_gumbel, fly_window_size, fly_entropy_threshold,
fly_entropy_top_k)`` (:data:`V1_PARAMETERS`), whose kernels are ``expand_kernel``,
``rejection_random_sample_kernel``, ``sample_recovered_tokens_kernel`` and
``rejection_greedy_sample_kernel`` (plus FLy's two when that option is on). Conversion:

- the target as logits: ``log p`` (``-inf`` where p = 0) at temperature 1, float32, laid out
  ``[B*(k+1), V]`` with request b's rows ``b*(k+1) .. b*(k+1)+k`` (row k the bonus position);
  ``SpecDecodeMetadata.make_dummy`` with ``target_logits_indices`` and ``bonus_logits_indices``
  pointing at them; the draft as ``q`` ``[B*k, V]`` float32;
- ``SamplingMetadata`` of a batch of plain random requests (temperature 1, no top-k/top-p, no
  penalties, no logits processors) with one CPU or CUDA ``torch.Generator`` per request
  (``{req_index: generator}``), seeded from the protocol's generator; vLLM also draws from the
  global torch RNG (``q.exponential_()`` before overwriting seeded rows), which runs inside
  ``torch.random.fork_rng`` seeded from the protocol's generator, so the caller's RNG is
  untouched and every call replays;
- greedy protocol: the target logits as given, ``all_greedy``, no draft probabilities;
- output ``sampled_token_ids`` ``[B, k+1]`` int32 with ``PLACEHOLDER_TOKEN_ID = -1``.

vLLM's randomness: accept draft i iff ``q > 0`` and ``p / q >= u`` with float64 ``u`` from
``generate_uniform_probs`` (one per draft, from the request's generator); given ``uniforms=``,
that module function is replaced for the duration of the call by one returning
``uniforms.accept_uniforms`` (decision-by-decision coupling with the CPU reference). The
recovered token is an exponential race ``argmax(max(p - q, 0) / E)`` with one ``E ~ Exp(1)``
vector per request shared by its k positions, the bonus token an exponential race on p_k:
neither inverts a CDF, so ``coupled_final_token = False`` and their law is tested
statistically.

Options of ``rejection_sample``, each audited as its own target (:data:`V1_OPTIONS`):
``synthetic_mode`` (accept draft i with a fixed conditional rate, whatever p and q: a benchmark
mode that relaxes acceptance, LOSSY by construction), ``use_fp64_gumbel`` (float64 exponential
race: lossless), ``fly_window_size``/``fly_entropy_threshold``/``fly_entropy_top_k`` (FLy,
"entropy-gated deferred verification": accepts a rejected draft when the target's top-k
entropy is high and the next W drafts would be accepted; relaxes acceptance, LOSSY). The options
are set on the ``RejectionSampler`` instance (the attributes its constructor derives from a
``SpeculativeConfig``); its constructor refuses FLy on a CPU *device*, which the interpreter is
not (the kernels are the CUDA ones, interpreted).

**Serving** (the ``vllm`` target only, engine profile ``vllm-v1``):
:class:`~losslessness.adapters.vllm_serving.VllmV1Serving` runs ``RejectionSampler.forward`` on
a real ``InputBatch`` of the requests (vLLM's ``SamplingMetadata``, built-in logits processors,
per-request seeded generators). vLLM 0.33.0's findings there (that module's docstring): logit
bias and min-p are dropped on draft positions (vLLM #42744, ``RejectionSampler.
apply_logits_processors``), and the bonus position's ``MinTokensLogitsProcessor.apply`` counts
only the committed output, not the accepted drafts. The ``vllm-v2`` target's serving verifier,
:class:`~losslessness.adapters.vllm_v2_serving.VllmV2Serving` (engine profile ``vllm-v2``), runs
model runner v2's ``RejectionSampler`` on its own request state; it applies every processor on
every position, bonus included.

**Model runner v2** (``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``, called by
``rejection_sampler.RejectionSampler._verify``): ``rejection_sample(target_logits,
draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
expanded_local_pos, temperature, seed, num_speculative_steps, ...)`` (:data:`V2_PARAMETERS`).
Its randomness is a counter-based hash of ``(seed[request], pos)`` inside the kernels (no
tensor of uniforms), so it is not coupled: each call draws fresh per-request seeds from the
protocol's generator and the laws are tested statistically. Layout: ``k+1`` logits rows per
request, ``draft_sampled[start + 1 + i] = d_i`` (row ``start`` holds the previous token, never
read as a draft), ``pos`` the sequence positions ``1000 + i``, ``draft_logits`` ``log q``
``[B, k, V]``. Options: ``use_block_verification`` (Sun et al. 2024, lossless but accepts more
after position 0; the sampler then declares block verification, ``losslessness_verification =
"block"``, so the acceptance check holds it to block verification's own acceptance),
``synthetic_conditional_rates``, ``use_fp64``, FLy; the watermarking arguments stay off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from losslessness.adapters.base import (
    Adapter,
    AdapterUnavailable,
    NotApplicable,
    seed_global_rng,
)
from losslessness.adapters.engines import (
    REQUIREMENTS_FILE,
    EngineSpec,
    complete_interpreter_libdevice,
    engine_device,
    import_engine_module,
    mode_description,
    prepare_engine,
    require_interpreted,
    require_parameters,
    version_note,
)
from losslessness.adapters.vllm_serving import V1_SERVING_MODULES, VllmV1Serving
from losslessness.adapters.vllm_v2_serving import V2_SERVING_MODULES, VllmV2Serving
from losslessness.protocol import (
    PLACEHOLDER,
    InvalidInputError,
    validate_chain_inputs,
    validate_greedy_inputs,
)
from losslessness.reference import ChainUniforms
from losslessness.reference.block import BLOCK_VERIFICATION, TOKEN_VERIFICATION

VLLM = EngineSpec(
    "vllm",
    ("0.33.0",),
    f"pip install -c constraints.txt -r {REQUIREMENTS_FILE} && pip install --no-deps vllm==0.33.0",
)
"""vLLM as these adapters were checked against it (CPU interpreter; CUDA path unchanged)."""

V1_PARAMETERS = (
    "draft_token_ids",
    "num_draft_tokens",
    "max_spec_len",
    "cu_num_draft_tokens",
    "draft_probs",
    "target_logits",
    "bonus_token_ids",
    "sampling_metadata",
    "synthetic_mode",
    "synthetic_conditional_rates",
    "use_fp64_gumbel",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
)
"""``vllm.v1.sample.rejection_sampler.rejection_sample``'s parameters at vLLM 0.33.0."""

V2_PARAMETERS = (
    "target_logits",
    "draft_logits",
    "draft_sampled",
    "cu_num_logits",
    "pos",
    "idx_mapping",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "temperature",
    "seed",
    "num_speculative_steps",
    "synthetic_conditional_rates",
    "use_fp64",
    "use_block_verification",
    "contexts",
    "watermarking",
    "watermarking_skip_mask",
    "watermark_key",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
)
"""``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample``'s parameters at
vLLM 0.33.0."""

SYNTHETIC_ACCEPTANCE_RATES = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
"""Unconditional per-position acceptance rates given to synthetic mode (vLLM's
``synthetic_acceptance_rates``), converted by vLLM's ``unconditional_to_conditional_rates``."""

FLY_DEFAULT_WINDOW = 6
"""vLLM's default FLy window: ``min(6, k - 1)`` (``SpeculativeConfig``)."""

FLY_ENTROPY_THRESHOLD = 0.3
"""vLLM's default ``fly_entropy_threshold``."""

FLY_ENTROPY_TOP_K = 3
"""vLLM's default ``fly_entropy_top_k``."""

V2_POSITION_OFFSET = 1000
"""Sequence position of the first verified token (model runner v2 hashes it into its RNG)."""

_PATCH_LOCK = threading.Lock()


@dataclass(frozen=True)
class SamplerOptions:
    """One setting of a vLLM sampler's options (the defaults are vLLM's defaults).

    Attributes:
        synthetic: synthetic acceptance (``SYNTHETIC_ACCEPTANCE_RATES``), relaxes acceptance.
        fp64: float64 exponential races (v1 ``use_fp64_gumbel``, v2 ``use_fp64``).
        fly: FLy deferred verification with vLLM's default window, threshold and top-k; needs
            k >= 2 (the window must be smaller than k).
        block: block verification (model runner v2 only).
    """

    synthetic: bool = False
    fp64: bool = False
    fly: bool = False
    block: bool = False

    def describe(self, v2: bool) -> str:
        """The options as vLLM names them (``"use_fp64_gumbel=True"``), or ``"defaults"``."""
        names = []
        if self.synthetic:
            names.append(
                "synthetic_mode=True, synthetic_conditional_rates from unconditional rates "
                f"{list(SYNTHETIC_ACCEPTANCE_RATES)}"
            )
        if self.fp64:
            names.append("use_fp64=True" if v2 else "use_fp64_gumbel=True")
        if self.fly:
            names.append(
                f"fly_window_size=min({FLY_DEFAULT_WINDOW}, k-1), fly_entropy_threshold="
                f"{FLY_ENTROPY_THRESHOLD}, fly_entropy_top_k={FLY_ENTROPY_TOP_K}"
            )
        if self.block:
            names.append("use_block_verification=True")
        return ", ".join(names) or "default options"

    def declarations(self) -> tuple[str | None, str | None, str | None]:
        """What an adapter with these options declares: :class:`Adapter`'s ``exclusions``,
        ``expected_verdict`` and ``expected_reason``. Synthetic acceptance and FLy relax
        acceptance whatever p and q, so they are LOSSY by design; FLy does not take k = 1."""
        reasons = []
        if self.synthetic:
            reasons.append("synthetic mode accepts drafts at fixed rates whatever p and q")
        if self.fly:
            reasons.append("FLy defers verification and accepts drafts the target would reject")
        exclusions = "draft length k = 1 (FLy needs a window 1 <= W < k)" if self.fly else None
        if not reasons:
            return exclusions, None, None
        return exclusions, "LOSSY", "; ".join(reasons) + " (lossy by design)"

    def fly_window(self, k: int) -> int:
        """FLy's window for draft length ``k``.

        Raises:
            NotApplicable: ``k < 2`` (FLy needs a window 1 <= W < k; vLLM refuses it): the run
                records that case's checks as SKIPPED, not ERROR.
        """
        if k < 2:
            raise NotApplicable(f"vLLM's FLy needs k >= 2 (window 1 <= W < k), got k = {k}")
        return min(FLY_DEFAULT_WINDOW, k - 1)


def _synthetic_rates(convert: Callable[[list[float]], list[float]], k: int) -> torch.Tensor:
    rates = list(SYNTHETIC_ACCEPTANCE_RATES)
    rates += [rates[-1]] * max(0, k - len(rates))
    return torch.tensor(convert(rates), dtype=torch.float32)


def _log(probs: torch.Tensor) -> torch.Tensor:
    """``log`` in float32 with ``-inf`` where the mass is 0."""
    return probs.to(torch.float64).log().to(torch.float32)


def _check_k(k: int, maximum: int) -> None:
    if not 1 <= k <= maximum:
        raise InvalidInputError(
            "draft_token_ids",
            f"vLLM's rejection sampler needs 1 <= k <= MAX_SPEC_LEN = {maximum}, got k = {k}",
        )


class VllmV1Sampler:
    """vLLM's model-runner-v1 ``RejectionSampler.forward``, in the chain and greedy protocols.

    Calling the object is the chain protocol; :meth:`greedy` is the greedy protocol.

    Args:
        modules: the imported vLLM modules (``rejection_sampler``, ``sampler``, ``metadata``,
            ``spec_metadata``, ``logits_state``, ``spec_utils``).
        options: the sampler options of this target.
        device: where the tensors live (``cpu`` under the interpreter, else ``cuda``).
    """

    coupled_final_token = False
    """The recovered and bonus tokens are exponential races, not inverse CDFs of a uniform."""

    def __init__(
        self, modules: dict[str, ModuleType], options: SamplerOptions, device: torch.device
    ) -> None:
        self.modules = modules
        self.options = options
        self.device = device
        self.module = modules["rejection_sampler"]
        self.max_spec_len = int(getattr(self.module, "MAX_SPEC_LEN", 32))
        base = modules["sampler"].Sampler(use_fp64_gumbel=options.fp64)
        self.sampler = self.module.RejectionSampler(base)

    def _configure(self, k: int) -> None:
        """Set the options on the ``RejectionSampler`` the way its constructor would."""
        sampler = self.sampler
        if self.options.synthetic:
            convert = self.modules["spec_utils"].unconditional_to_conditional_rates
            sampler.synthetic_conditional_rates = _synthetic_rates(convert, k).to(self.device)
            sampler.synthetic_mode = True
        if self.options.fly:
            sampler.use_fly = True
            sampler.fly_window_size = self.options.fly_window(k)
            sampler.fly_entropy_threshold = FLY_ENTROPY_THRESHOLD
            sampler.fly_entropy_top_k = FLY_ENTROPY_TOP_K

    def _metadata(self, drafts: torch.Tensor, k: int) -> Any:
        batch = drafts.shape[0]
        spec = self.modules["spec_metadata"].SpecDecodeMetadata.make_dummy(
            drafts.tolist(), self.device
        )
        rows = torch.arange(batch * (k + 1), device=self.device, dtype=torch.int32)
        rows = rows.reshape(batch, k + 1)
        spec.target_logits_indices = rows[:, :k].reshape(-1).contiguous()
        spec.bonus_logits_indices = rows[:, k].contiguous()
        spec.logits_indices = rows.reshape(-1).contiguous()
        return spec

    def _sampling_metadata(self, batch: int, greedy: bool, seeds: list[int]) -> Any:
        device = self.device
        generators = {
            b: torch.Generator(device=device).manual_seed(seed) for b, seed in enumerate(seeds)
        }
        return self.modules["metadata"].SamplingMetadata(
            temperature=None if greedy else torch.ones(batch, device=device),
            all_greedy=greedy,
            all_random=not greedy,
            top_p=None,
            top_k=None,
            generators=generators,
            max_num_logprobs=None,
            no_penalties=True,
            prompt_token_ids=None,
            frequency_penalties=torch.zeros(batch, device=device),
            presence_penalties=torch.zeros(batch, device=device),
            repetition_penalties=torch.ones(batch, device=device),
            output_token_ids=[[] for _ in range(batch)],
            allowed_token_ids_mask=None,
            bad_words_token_ids={},
            logitsprocs=self.modules["logits_state"].LogitsProcessors(),
        )

    @contextmanager
    def _accept_uniforms(self, accept: torch.Tensor | None) -> Iterator[None]:
        """Make ``generate_uniform_probs`` return ``accept`` (flattened ``[B*k]`` float64)."""
        if accept is None:
            yield
            return

        def given_uniforms(*_args: object, **_kwargs: object) -> torch.Tensor:
            return accept

        with _PATCH_LOCK:
            original = getattr(self.module, "generate_uniform_probs")  # noqa: B009
            setattr(self.module, "generate_uniform_probs", given_uniforms)  # noqa: B010
            try:
                yield
            finally:
                setattr(self.module, "generate_uniform_probs", original)  # noqa: B010

    def _run(
        self,
        drafts: torch.Tensor,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        generator: torch.Generator,
        greedy: bool,
        accept: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, k = drafts.shape
        self._configure(k)
        seeds = torch.randint(0, 2**62, (batch + 1,), generator=generator).tolist()
        spec = self._metadata(drafts, k)
        metadata = self._sampling_metadata(batch, greedy, seeds[1:])
        with torch.random.fork_rng(devices=[]), self._accept_uniforms(accept):
            seed_global_rng(seeds[0], self.device)
            output = self.sampler(spec, draft_probs, logits, metadata)
        tokens: torch.Tensor = output.sampled_token_ids
        return tokens.to(torch.int64).cpu()

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """One verification step (chain protocol; shapes as in
        :class:`losslessness.protocol.ChainVerifier`); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs, ``k == 0`` or ``k > MAX_SPEC_LEN``.
            NotApplicable: FLy with ``k < 2``.
        """
        batch, k, vocab = validate_chain_inputs(
            target_probs, draft_probs, draft_token_ids, generator
        )
        _check_k(k, self.max_spec_len)
        logits = _log(target_probs).reshape(batch * (k + 1), vocab).to(self.device)
        draft = draft_probs.to(self.device, torch.float32).reshape(batch * k, vocab).contiguous()
        accept = None
        if uniforms is not None:
            accept = uniforms.accept_uniforms.to(self.device, torch.float64).reshape(-1)
            accept = accept.contiguous()
        return self._run(draft_token_ids, draft, logits.contiguous(), generator, False, accept)

    def greedy(self, target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
        """One greedy verification step (greedy protocol); ``[B, k+1]`` int64 on CPU.

        vLLM draws no randomness here unless an option needs it (synthetic mode): that comes
        from a generator with a fixed seed, so the call is deterministic.

        Raises:
            InvalidInputError: malformed inputs, ``k == 0`` or ``k > MAX_SPEC_LEN``.
            NotApplicable: FLy with ``k < 2``.
        """
        batch, k, vocab = validate_greedy_inputs(target_logits, draft_token_ids)
        _check_k(k, self.max_spec_len)
        logits = target_logits.to(self.device, torch.float32).reshape(batch * (k + 1), vocab)
        generator = torch.Generator().manual_seed(0)
        return self._run(draft_token_ids, None, logits.contiguous(), generator, True, None)


class VllmV2Sampler:
    """vLLM's model-runner-v2 ``rejection_sample`` (chain and greedy protocols).

    Args:
        function: ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample``.
        convert: vLLM's ``unconditional_to_conditional_rates``.
        options: the sampler options of this target.
        device: where the tensors live.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        convert: Callable[[list[float]], list[float]],
        options: SamplerOptions,
        device: torch.device,
    ) -> None:
        self.function = function
        self.convert = convert
        self.options = options
        self.device = device
        self.losslessness_verification = (
            BLOCK_VERIFICATION if options.block else TOKEN_VERIFICATION
        )
        """How this sampler declares it verifies
        (:func:`losslessness.reference.block.declared_verification`): ``"block"`` with
        ``use_block_verification``, else ``"token"``."""

    def _run(
        self,
        target_logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        drafts: torch.Tensor,
        temperature: float,
        generator: torch.Generator,
    ) -> torch.Tensor:
        batch, k = drafts.shape
        device, rows = self.device, k + 1
        sampled_in = torch.zeros((batch, rows), dtype=torch.int64)
        sampled_in[:, 1:] = drafts.to(torch.int64)
        local = torch.arange(rows, dtype=torch.int32).repeat(batch)
        seeds = torch.randint(0, 2**62, (batch,), generator=generator, dtype=torch.int64)
        options: dict[str, Any] = {
            "use_fp64": self.options.fp64,
            "use_block_verification": self.options.block,
        }
        if self.options.synthetic:
            options["synthetic_conditional_rates"] = _synthetic_rates(self.convert, k).to(device)
        if self.options.fly:
            options.update(
                fly_window_size=self.options.fly_window(k),
                fly_entropy_threshold=FLY_ENTROPY_THRESHOLD,
                fly_entropy_top_k=FLY_ENTROPY_TOP_K,
            )
        sampled, num_sampled = self.function(
            target_logits.reshape(batch * rows, -1).to(device, torch.float32).contiguous(),
            None
            if draft_logits is None
            else draft_logits.to(device, torch.float32).contiguous(),
            sampled_in.reshape(-1).to(device),
            (torch.arange(batch + 1, dtype=torch.int32) * rows).to(device),
            (local.to(torch.int64) + V2_POSITION_OFFSET).to(device),
            torch.arange(batch, dtype=torch.int32, device=device),
            torch.arange(batch, dtype=torch.int32).repeat_interleave(rows).to(device),
            local.to(device),
            torch.full((batch,), temperature, dtype=torch.float32, device=device),
            seeds.to(device),
            k,
            **options,
        )
        tokens = sampled.to(torch.int64).cpu()
        counts = num_sampled.to(torch.int64).cpu()
        emitted = torch.arange(rows).unsqueeze(0) < counts.unsqueeze(1)
        return torch.where(emitted, tokens, torch.full_like(tokens, PLACEHOLDER))

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """One verification step (chain protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs or ``k == 0``.
            NotApplicable: FLy with ``k < 2``.
        """
        _, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
        _check_k(k, 1 << 10)
        return self._run(
            _log(target_probs), _log(draft_probs), draft_token_ids, 1.0, generator
        )

    def greedy(self, target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
        """One greedy verification step (greedy protocol, temperature 0); ``[B, k+1]`` int64.

        Raises:
            InvalidInputError: malformed inputs or ``k == 0``.
            NotApplicable: FLy with ``k < 2``.
        """
        _, k, _ = validate_greedy_inputs(target_logits, draft_token_ids)
        _check_k(k, 1 << 10)
        generator = torch.Generator().manual_seed(0)
        return self._run(target_logits, None, draft_token_ids, 0.0, generator)


V1_OPTIONS = {
    "vllm": SamplerOptions(),
    "vllm-synthetic": SamplerOptions(synthetic=True),
    "vllm-fp64-gumbel": SamplerOptions(fp64=True),
    "vllm-fly": SamplerOptions(fly=True),
}
"""Model-runner-v1 targets: one per option of ``rejection_sample``'s signature."""

V2_OPTIONS = {
    "vllm-v2": SamplerOptions(),
    "vllm-v2-block": SamplerOptions(block=True),
    "vllm-v2-synthetic": SamplerOptions(synthetic=True),
    "vllm-v2-fp64": SamplerOptions(fp64=True),
    "vllm-v2-fly": SamplerOptions(fly=True),
}
"""Model-runner-v2 targets: one per verification option of its ``rejection_sample``."""


def _load_v1(serving: bool) -> tuple[str, dict[str, ModuleType]]:
    """vLLM's version and the v1 modules: the chain adapter's, and with ``serving`` also
    :data:`~losslessness.adapters.vllm_serving.V1_SERVING_MODULES`."""
    version = prepare_engine(VLLM)
    names = {
        "rejection_sampler": "vllm.v1.sample.rejection_sampler",
        "sampler": "vllm.v1.sample.sampler",
        "metadata": "vllm.v1.sample.metadata",
        "spec_metadata": "vllm.v1.spec_decode.metadata",
        "logits_state": "vllm.v1.sample.logits_processor.state",
        "spec_utils": "vllm.v1.spec_decode.utils",
    }
    if serving:
        names.update(V1_SERVING_MODULES)
    modules = {key: import_engine_module(VLLM, version, name) for key, name in names.items()}
    module = modules["rejection_sampler"]
    for name in ("RejectionSampler", "rejection_sample", "generate_uniform_probs"):
        if not callable(getattr(module, name, None)):
            raise AdapterUnavailable(
                f"vllm {version}: API changed, v1.sample.rejection_sampler.{name} is missing; "
                f"install the checked version with: {VLLM.install}"
            )
    require_parameters(VLLM, version, module.rejection_sample, "rejection_sample", V1_PARAMETERS)
    require_interpreted(
        VLLM, version, module.rejection_random_sample_kernel, "rejection_random_sample_kernel"
    )
    return version, modules


def v1_adapter(name: str) -> Adapter:
    """The model-runner-v1 target ``name`` (a key of :data:`V1_OPTIONS`).

    Raises:
        AdapterUnavailable: vLLM or Triton missing, an API that differs from vLLM 0.33.0's, or
            vLLM imported before the interpreter could be set up (the reason says which and how
            to install the checked version).
    """
    options = V1_OPTIONS[name]
    exclusions, expected, reason = options.declarations()
    serves = options == SamplerOptions()
    version, modules = _load_v1(serves)
    device = engine_device()
    sampler = VllmV1Sampler(modules, options, device)
    serving = VllmV1Serving(modules, device) if serves else None
    return Adapter(
        name=name,
        description=f"{version_note(VLLM, version)} v1.sample.rejection_sampler."
        f"RejectionSampler.forward, {options.describe(v2=False)}; {mode_description()}; "
        "target as log p at temperature 1, float32; accept uniforms coupled, recovered and "
        "bonus tokens (exponential races) tested statistically"
        + (
            "; serving: RejectionSampler.forward on a real InputBatch of the requests (vLLM's "
            "SamplingMetadata, built-in logits processors, per-request seeded generators)"
            if serving is not None
            else ""
        ),
        chain=sampler,
        greedy=sampler.greedy,
        serving=serving,
        engine_profile=None if serving is None else VllmV1Serving.engine_profile,
        exclusions=exclusions,
        expected_verdict=expected,
        expected_reason=reason,
    )


def v2_adapter(name: str) -> Adapter:
    """The model-runner-v2 target ``name`` (a key of :data:`V2_OPTIONS`).

    Raises:
        AdapterUnavailable: as :func:`v1_adapter`.
    """
    options = V2_OPTIONS[name]
    exclusions, expected, reason = options.declarations()
    version = prepare_engine(VLLM)
    module = import_engine_module(
        VLLM, version, "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
    )
    spec_utils = import_engine_module(VLLM, version, "vllm.v1.spec_decode.utils")
    function = getattr(module, "rejection_sample", None)
    if not callable(function):
        raise AdapterUnavailable(
            f"vllm {version}: API changed, model runner v2's rejection_sampler_utils."
            f"rejection_sample is missing; install the checked version with: {VLLM.install}"
        )
    require_parameters(VLLM, version, function, "v2 rejection_sample", V2_PARAMETERS)
    require_interpreted(VLLM, version, module._rejection_kernel, "_rejection_kernel")
    supplied = complete_interpreter_libdevice()
    note = (
        f"; the interpreter's missing libdevice {', '.join(supplied)} supplied by numpy"
        if supplied
        else ""
    )
    device = engine_device()
    rates = spec_utils.unconditional_to_conditional_rates
    sampler = VllmV2Sampler(function, rates, options, device)
    serving = None
    if options == SamplerOptions():
        serving = VllmV2Serving(
            {key: import_engine_module(VLLM, version, name)
             for key, name in V2_SERVING_MODULES.items()},
            device,
        )
    return Adapter(
        name=name,
        description=f"{version_note(VLLM, version)} model runner v2 (v1.worker.gpu."
        f"spec_decode.rejection_sampler_utils.rejection_sample), {options.describe(v2=True)}; "
        f"{mode_description()}; target and draft as log p, log q at temperature 1; randomness "
        f"from per-request seeds hashed in the kernels (not coupled, tested statistically){note}"
        + (
            "; serving: RejectionSampler on model runner v2's own request state (RequestState, "
            "Sampler with its sampling, bias, penalty and bad-words states, InputBatch from its "
            "kernels)"
            if serving is not None
            else ""
        ),
        chain=sampler,
        greedy=sampler.greedy,
        serving=serving,
        engine_profile=None if serving is None else VllmV2Serving.engine_profile,
        exclusions=exclusions,
        expected_verdict=expected,
        expected_reason=reason,
    )


def adapter() -> Adapter:
    """The ``vllm`` target: model runner v1's ``RejectionSampler`` with default options."""
    return v1_adapter("vllm")


def synthetic_adapter() -> Adapter:
    """``vllm-synthetic``: v1 with ``synthetic_mode`` (relaxes acceptance: LOSSY)."""
    return v1_adapter("vllm-synthetic")


def fp64_gumbel_adapter() -> Adapter:
    """``vllm-fp64-gumbel``: v1 with ``use_fp64_gumbel``."""
    return v1_adapter("vllm-fp64-gumbel")


def fly_adapter() -> Adapter:
    """``vllm-fly``: v1 with FLy deferred verification (relaxes acceptance: LOSSY)."""
    return v1_adapter("vllm-fly")


def v2_default_adapter() -> Adapter:
    """``vllm-v2``: model runner v2's rejection sampler with default options."""
    return v2_adapter("vllm-v2")


def v2_block_adapter() -> Adapter:
    """``vllm-v2-block``: model runner v2 with block verification."""
    return v2_adapter("vllm-v2-block")


def v2_synthetic_adapter() -> Adapter:
    """``vllm-v2-synthetic``: model runner v2 with synthetic acceptance rates (LOSSY)."""
    return v2_adapter("vllm-v2-synthetic")


def v2_fp64_adapter() -> Adapter:
    """``vllm-v2-fp64``: model runner v2 with ``use_fp64``."""
    return v2_adapter("vllm-v2-fp64")


def v2_fly_adapter() -> Adapter:
    """``vllm-v2-fly``: model runner v2 with FLy deferred verification (LOSSY)."""
    return v2_adapter("vllm-v2-fly")
