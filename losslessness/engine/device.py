"""The run engine's device unit: CPU-vs-device comparisons (docs/architecture.md, 'What lossless
means', item 7).

The checks are pure (:mod:`losslessness.checks.coupling`); this module does everything that
calls an implementation or spends budget:

- **Coupled path** (the candidate takes the chain protocol's optional ``uniforms=`` keyword,
  :class:`losslessness.reference.ChainUniforms`): :func:`draw_coupled_samples` draws drafts and
  uniforms chunk by chunk (:func:`_draw_chunk`), calls the candidate (its inputs cast to a dtype
  on a device by :class:`CastVerifier`) and the float64 CPU reference with the same numbers, and
  stops at a candidate that raises or returns a malformed array, recording why
  (:class:`losslessness.checks.coupling.CoupledSamples`).
- **Statistical path** (no ``uniforms=``): both implementations are sampled independently
  (:func:`losslessness.checks.sampling.sample_chain`) on the case cast to the candidate's dtype
  (:func:`cast_case`).
- **Planning and budget**: :func:`count_coupling_assertions` counts the statistical assertions
  a comparison makes; :func:`run_device_checks` plans every comparison of a run (the reference
  in float32 and, on CUDA, float64; every GPU adapter that loads), splits the family-wise
  false-alarm rate Bonferroni over them, and adds the precision diagnostics.

GPU adapters resolve through the adapter registry (:func:`losslessness.adapters.
resolve_adapter`, entry-point group ``losslessness.adapters``) and are then bound to the run's
device (:func:`load_device_adapter`).
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from losslessness.adapters import AdapterNotFound, AdapterUnavailable
from losslessness.batteries import default_chain_battery
from losslessness.cases import ChainCase
from losslessness.checks.assertions import case_laws, law_is_statistical
from losslessness.checks.coupling import (
    CoupledSamples,
    candidate_failed,
    check_coupled_samples,
    check_sampled_laws,
)
from losslessness.checks.ids import COUPLING_CHECK_ID, LAW_CHECK_ID, PRECISION_CHECK_ID
from losslessness.checks.precision import check_precision
from losslessness.engine.draw import ProtocolViolation, coerce_output, rows_per_call, sample_chain
from losslessness.laws import law_after_cast
from losslessness.protocol import ChainVerifier
from losslessness.reference import ChainUniforms, sample_inverse_cdf
from losslessness.reference import verify as reference_verify
from losslessness.results import CheckContext, CheckResult
from losslessness.seeding import derive_seed
from losslessness.stats import ErrorBudget
from losslessness.targets import resolve_adapter

GPU_ADAPTERS = ("vllm", "vllm-v2", "flashinfer", "sglang", "sglang-tree", "transformers-cuda")
"""The device adapters :func:`run_device_checks` tries, by registered (entry-point) name."""


def accepts_uniforms(verifier: Callable[..., Any]) -> bool:
    """Whether ``verifier`` takes the chain protocol's optional ``uniforms=`` keyword.

    Read from its signature (``inspect.signature``): a parameter named ``uniforms`` that can be
    passed by keyword. ``**kwargs`` alone does not count: silently ignored uniforms would make a
    coupled comparison meaningless.
    """
    try:
        parameters = inspect.signature(verifier).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get("uniforms")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def couples_final_token(verifier: object) -> bool:
    """Whether ``verifier`` draws its final token from ``uniforms.sample_uniforms`` by inverse
    CDF (attribute ``coupled_final_token``, True when absent)."""
    return bool(getattr(verifier, "coupled_final_token", True))


def deterministic_draft_case(case: ChainCase) -> ChainCase:
    """``case`` with every draft law q_i replaced by a one-hot at its most likely token.

    For kernels that assume deterministic (greedy, top-1) drafts, such as SGLang's
    ``tree_speculative_sampling_target_only`` (it accepts d with probability p(d), which is
    Leviathan et al.'s rule when q = one-hot(d)).
    """
    one_hot = torch.nn.functional.one_hot(case.draft_probs.argmax(dim=-1), case.vocab_size)
    return ChainCase(
        f"{case.case_id}+greedy-draft",
        f"{case.summary}; one-hot draft",
        case.target_probs,
        one_hot.to(torch.float64),
        case.tags - {"p-equals-q", "disjoint"},
    )


def cast_case(case: ChainCase, dtype: torch.dtype) -> ChainCase:
    """``case`` with p and q replaced by the laws an implementation receiving them in ``dtype``
    follows (:func:`losslessness.laws.law_after_cast`); ``case`` itself for
    float64."""
    if dtype == torch.float64:
        return case
    return ChainCase(
        f"{case.case_id}@{str(dtype).removeprefix('torch.')}",
        f"{case.summary}; inputs cast to {dtype}",
        law_after_cast(case.target_probs, dtype),
        law_after_cast(case.draft_probs, dtype),
        case.tags,
    )


class CastVerifier:
    """A chain verifier called with its inputs cast to ``dtype`` and moved to ``device``.

    Args:
        verifier: the implementation.
        device: where its inputs live (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: the precision of ``target_probs`` and ``draft_probs`` it receives.

    Calls return the verifier's output moved to CPU. ``uniforms`` (when given) are moved to
    ``device`` too; the generator is passed unchanged (the protocol's generator is a CPU one; a
    device implementation derives its device seeds from it).
    """

    def __init__(self, verifier: ChainVerifier, device: str | torch.device, dtype: torch.dtype):
        self.verifier = verifier
        self.device = torch.device(device)
        self.dtype = dtype

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """Cast, move, call (chain protocol; shapes as in :class:`ChainVerifier`)."""
        arguments = (
            _cast_rows(target_probs, self.device, self.dtype),
            _cast_rows(draft_probs, self.device, self.dtype),
            draft_token_ids.to(self.device),
            generator,
        )
        if uniforms is None:
            result = self.verifier(*arguments)
        else:
            moved = ChainUniforms(
                uniforms.accept_uniforms.to(self.device), uniforms.sample_uniforms.to(self.device)
            )
            result = self.verifier(*arguments, uniforms=moved)  # type: ignore[call-arg]
        return result.cpu() if isinstance(result, torch.Tensor) else result


def _cast_rows(probs: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``probs`` on ``device`` in ``dtype``; rows shared in memory (stride 0 along the batch, as
    ``expand`` makes them) are cast once and stay shared."""
    if probs.dim() == 3 and probs.shape[0] > 1 and probs.stride(0) == 0:
        return probs[:1].to(device, dtype).expand_as(probs)
    return probs.to(device, dtype)


def _batch(probs: torch.Tensor, copies: int) -> torch.Tensor:
    """``copies`` interleaved copies of the ``[R, ...]`` row types (row b has type b % R);
    shared memory (``expand``) when R == 1, so the reference takes its shared-table path."""
    if probs.shape[0] == 1:
        return probs.expand(copies, *probs.shape[1:])
    return probs.repeat(copies, 1, 1)


def _draw_chunk(
    case: ChainCase, draft_law: torch.Tensor, chunk: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafts ``[chunk*R, k]`` int64 (d ~ the cast q), accept uniforms ``[chunk*R, k]`` and
    sample uniforms ``[chunk*R]`` float64; always a full chunk so that a replay with fewer steps
    draws the same numbers for the steps it keeps."""
    rows, k = case.n_rows, case.k
    batch = chunk * rows
    draft_uniforms = torch.rand((chunk, rows, k), generator=generator, dtype=torch.float64)
    accept = torch.rand((batch, k), generator=generator, dtype=torch.float64)
    sample = torch.rand((batch,), generator=generator, dtype=torch.float64)
    drafts = torch.empty((chunk, rows, k), dtype=torch.int64)
    for r in range(rows):
        for i in range(k):
            drafts[:, r, i] = sample_inverse_cdf(draft_law[r, i], draft_uniforms[:, r, i])
    return drafts.reshape(batch, k), accept, sample


def draw_coupled_samples(
    candidate: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    *,
    reference: ChainVerifier = reference_verify,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> CoupledSamples:
    """Feed ``candidate`` and ``reference`` the same drafts and uniforms for ``n_steps`` steps.

    Each call carries ``rows_per_call(case)`` copies of every row type, interleaved (row b has
    type b % R); drafts d_i are drawn from the draft law cast to ``dtype`` (what the candidate
    receives), from a generator seeded with
    ``derive_seed(seed, COUPLING_CHECK_ID, case.case_hash)``;
    the candidate's and the reference's own generators are seeded with ``derive_seed(seed,
    "candidate")`` and ``derive_seed(seed, "reference")``.

    Args:
        candidate: a chain verifier taking ``uniforms=``; called through :class:`CastVerifier`.
        case: the case (float64).
        n_steps: verification steps per row type (>= 1).
        seed: replays everything.
        reference: the CPU ground truth, called with the float64 inputs and ``uniforms=``.
        dtype: precision of the candidate's ``target_probs`` / ``draft_probs``.
        device: where the candidate's inputs live.

    Returns:
        :class:`CoupledSamples` of the steps before the first call at which the candidate
        raised or returned a malformed array (``failure`` then says why); all ``n_steps``
        otherwise.

    Raises:
        ValueError: ``n_steps < 1``.
        Exception: whatever the reference raised, unchanged.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
    began = time.perf_counter()
    rows, k = case.n_rows, case.k
    cast = CastVerifier(candidate, device, dtype)
    draft_law = law_after_cast(case.draft_probs, dtype)
    generator = torch.Generator().manual_seed(derive_seed(seed, COUPLING_CHECK_ID, case.case_hash))
    candidate_generator = torch.Generator().manual_seed(derive_seed(seed, "candidate"))
    reference_generator = torch.Generator().manual_seed(derive_seed(seed, "reference"))
    chunk = rows_per_call(case)
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]] = []
    failure: str | None = None
    done = 0
    while done < n_steps:
        m = min(chunk, n_steps - done)
        drafts, accept, sample = _draw_chunk(case, draft_law, chunk, generator)
        batch = m * rows
        drafts, accept, sample = drafts[:batch], accept[:batch], sample[:batch]
        target_probs = _batch(case.target_probs, m)
        draft_probs = _batch(case.draft_probs, m)
        try:
            raw = cast(
                target_probs,
                draft_probs,
                drafts,
                candidate_generator,
                uniforms=ChainUniforms(accept, sample),
            )
            got = coerce_output(raw, batch, k)
        except (ProtocolViolation, Exception) as error:
            failure = f"{type(error).__name__}: {error}"
            break
        expected = coerce_output(
            reference(
                target_probs,
                draft_probs,
                drafts,
                reference_generator,
                uniforms=ChainUniforms(accept, sample),  # type: ignore[call-arg]
            ),
            batch,
            k,
        )
        # Copies: an implementation may hand back the same output buffer on every call.
        parts.append((drafts, accept, sample, got.copy(), expected.copy()))
        done += m

    def joined(index: int, shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
        arrays = [np.asarray(part[index], dtype=dtype) for part in parts]
        return np.concatenate(arrays) if arrays else np.empty(shape, dtype=dtype)

    return CoupledSamples(
        case=case,
        drafts=joined(0, (0, k), np.int64),
        accept_uniforms=joined(1, (0, k), np.float64),
        sample_uniforms=joined(2, (0,), np.float64),
        candidate_outputs=joined(3, (0, k + 1), np.int64),
        reference_outputs=joined(4, (0, k + 1), np.int64),
        n_steps=done,
        seed=seed,
        dtype=dtype,
        device=str(device),
        failure=failure,
        wall_time_s=time.perf_counter() - began,
    )


def check_coupling(
    candidate: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    *,
    reference: ChainVerifier = reference_verify,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    precision: torch.dtype | None = None,
    target: str = "candidate",
    alpha: float = 1e-3,
    power: float = 0.9,
    tv: float = 0.05,
    statistical: bool | None = None,
) -> list[CheckResult]:
    """Compare ``candidate`` (on ``device``, inputs in ``dtype``) with the CPU reference: draw
    the samples, then run the pure checks of :mod:`losslessness.checks.coupling` on them.

    Args:
        candidate: a chain verifier; coupled when it takes ``uniforms=``
            (:func:`accepts_uniforms`).
        case: the case; its row types are interleaved in each call as in
            :func:`losslessness.checks.sampling.sample_chain`.
        n_steps: verification steps per row type (>= 1).
        seed: replays everything; each result carries it.
        reference: the CPU ground truth (float64 inputs); must take ``uniforms=`` on the
            coupled path.
        dtype: precision of the candidate's ``target_probs`` / ``draft_probs``.
        device: where the candidate's inputs live.
        precision: the precision the candidate computes in, which the excusing tolerances
            are derived from (default ``dtype``; e.g. float16 for a kernel that takes float32
            probabilities but computes in half precision). The protocol's row-sum tolerance
            (1e-5) admits float32 and float64 inputs only, so lower precisions are declared here.
        target: the candidate's name in the results.
        alpha: per-assertion significance level of the statistical path's tests (the caller
            splits its family-wise rate over :func:`count_coupling_assertions`).
        power: design power, for the minimum detectable TV reported.
        tv: design TV (reported in the context).
        statistical: force the statistical path (True) or the coupled one (False); None picks
            the coupled path exactly when the candidate takes uniforms.

    Returns:
        Coupled path: one EXACT ``coupling`` result (:func:`losslessness.checks.coupling.
        check_coupled_samples`). Statistical path: ``law`` results for the candidate and the
        reference (targets ``<target>`` and ``<target>/reference``) and one ``two-sample``
        result per statistical (row, position) (:func:`losslessness.checks.coupling.
        check_sampled_laws`). A candidate that raises or returns a malformed array gives one
        ERROR result.

    Raises:
        ValueError: ``n_steps < 1``, or the coupled path forced on a candidate without
            ``uniforms=``.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
    coupled = accepts_uniforms(candidate) if statistical is None else not statistical
    if coupled and not accepts_uniforms(candidate):
        raise ValueError("statistical: the candidate takes no uniforms= keyword to couple")
    context = CheckContext.for_case(target, case, alpha=alpha, power=power, tv=tv, seed=seed)
    if not coupled:
        return _statistical_comparison(
            candidate, reference, case, n_steps, seed, context, dtype, device
        )
    samples = draw_coupled_samples(
        candidate, case, n_steps, seed, reference=reference, dtype=dtype, device=device
    )
    return [
        check_coupled_samples(
            samples,
            context,
            precision=precision or dtype,
            compare_final=couples_final_token(candidate),
        )
    ]


def _statistical_comparison(
    candidate: ChainVerifier,
    reference: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    context: CheckContext,
    dtype: torch.dtype,
    device: str | torch.device,
) -> list[CheckResult]:
    """Sample both implementations independently on the cast case, then
    :func:`losslessness.checks.coupling.check_sampled_laws`."""
    cast = cast_case(case, dtype)
    began = time.perf_counter()
    try:
        got = sample_chain(
            CastVerifier(candidate, device, dtype), cast, n_steps, derive_seed(seed, "candidate")
        )
    except Exception as error:
        failure = f"{type(error).__name__}: {error}"
        elapsed = time.perf_counter() - began
        return [candidate_failed(context, LAW_CHECK_ID, 0, str(device), dtype, failure, elapsed)]
    # Independent samples: the reference's seed differs from the candidate's.
    expected = sample_chain(reference, cast, n_steps, derive_seed(seed, "reference"))
    cast_context = CheckContext.for_case(
        context.target, cast, alpha=context.alpha, power=context.power, tv=context.tv, seed=seed
    )
    return check_sampled_laws(got, expected, cast_context, device=str(device), dtype=str(dtype))


def count_coupling_assertions(
    candidate: ChainVerifier, case: ChainCase, dtype: torch.dtype = torch.float32
) -> int:
    """Statistical assertions :func:`check_coupling` makes for ``candidate`` on ``case``: none
    on the coupled path; three per statistical (row, position) on the statistical path (law
    of the candidate, law of the reference, two-sample)."""
    if accepts_uniforms(candidate):
        return 0
    return 3 * _statistical_positions(cast_case(case, dtype))


def _statistical_positions(case: ChainCase) -> int:
    return sum(law_is_statistical(laws, i) for laws in case_laws(case) for i in range(case.k + 1))


def load_device_adapter(name: str, device: str) -> ChainVerifier:
    """The chain verifier of the registered adapter ``name``, bound to ``device``.

    Resolved through the registry (:func:`losslessness.targets.resolve_adapter`), which builds
    each adapter with its factory's default device (``"cuda"``). A device adapter's chain
    verifier keeps its device in a ``device`` attribute (a ``torch.device``: vLLM, FlashInfer,
    SGLang, transformers-cuda); when it differs from ``device`` a shallow copy is returned with
    the attribute rebound, so ``"cuda:1"`` runs the kernels on that GPU (the registry's
    factories take no arguments).

    Args:
        name: a registered adapter name (see :data:`GPU_ADAPTERS`).
        device: the run's device.

    Raises:
        AdapterUnavailable: the adapter cannot load here (package or CUDA missing), has no
            chain verifier, or is not registered (entry points not installed).
    """
    try:
        # In this process: the candidates get device tensors and coupling uniforms directly.
        chain = resolve_adapter(name, in_process=True).chain
    except AdapterNotFound as error:
        raise AdapterUnavailable(str(error)) from error
    if chain is None:
        raise AdapterUnavailable(f"{name}: the adapter has no chain verifier")
    bound = getattr(chain, "device", None)
    wanted = torch.device(device)
    if isinstance(bound, torch.device) and bound != wanted:
        chain = copy.copy(chain)
        chain.device = wanted  # type: ignore[attr-defined]
    return chain


def run_device_checks(
    device: str, n_steps: int, seed: int, family_wise_alpha: float
) -> tuple[list[CheckResult], list[tuple[str, str]]]:
    """Coupling and precision checks for every device implementation that loads here.

    On ``device="cpu"``: the reference fed float32 inputs, coupled against the float64
    reference, on every battery case, plus the precision diagnostics. On a CUDA device,
    additionally: the reference on the device (float64 and float32 inputs) and every adapter of
    :data:`GPU_ADAPTERS` that loads, each coupled when it takes ``uniforms=`` and compared
    statistically when it does not (or does not couple its final token); SGLang's target-only
    kernel on the cases with one-hot drafts (:func:`deterministic_draft_case`).

    Args:
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:0"``).
        n_steps: verification steps per case and row type.
        seed: the run seed.
        family_wise_alpha: split Bonferroni over every statistical assertion made.

    Returns:
        ``(results, unavailable)``: every CheckResult (targets named ``<adapter>@<device>/<dtype>``)
        and ``(adapter name, reason)`` for each adapter that could not load.

    Raises:
        ValueError: ``n_steps < 1``, ``family_wise_alpha`` outside (0, 1), or ``device`` is
            neither cpu nor cuda.
    """
    if torch.device(device).type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or a CUDA device, got {device!r}")
    if n_steps < 1:
        raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
    # The device checks choose their own dtypes and call sizes: the battery's cases with call
    # conditions of their own (issue 21) would only repeat the others, B = 1 at a cost.
    cases = [case for case in default_chain_battery() if not case.conditions]
    plans: list[tuple[str, ChainVerifier, torch.dtype, ChainCase, bool]] = []
    unavailable: list[tuple[str, str]] = []
    plans += [("reference", reference_verify, torch.float32, case, False) for case in cases]
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        plans += [("reference", reference_verify, torch.float64, case, False) for case in cases]
    for name in GPU_ADAPTERS:
        try:
            chain = load_device_adapter(name, device)
        except AdapterUnavailable as error:
            unavailable.append((name, str(error)))
            continue
        if not on_cuda:
            unavailable.append((name, f"device {device!r}: GPU adapters run on CUDA only"))
            continue
        one_hot = bool(getattr(chain, "requires_one_hot_draft", False))
        for case in cases:
            if one_hot and ({"disjoint", "p-equals-q"} & case.tags):
                continue
            chosen = deterministic_draft_case(case) if one_hot else case
            plans.append((name, chain, torch.float32, chosen, False))
            if accepts_uniforms(chain) and not couples_final_token(chain):
                plans.append((name, chain, torch.float32, chosen, True))
    n_assertions = sum(
        3 * _statistical_positions(cast_case(case, dtype))
        if statistical or not accepts_uniforms(chain)
        else 0
        for _, chain, dtype, case, statistical in plans
    )
    budget = ErrorBudget(max(1, n_assertions), family_wise_alpha)
    results: list[CheckResult] = []
    for name, chain, dtype, case, statistical in plans:
        label = f"{name}@{device}/{str(dtype).removeprefix('torch.')}"
        results += check_coupling(
            chain,
            case,
            n_steps,
            derive_seed(seed, label, case.case_hash),
            dtype=dtype,
            device=device,
            target=label,
            alpha=budget.per_assertion_alpha,
            statistical=statistical or not accepts_uniforms(chain),
        )
    for case in cases:
        context = CheckContext.for_case(
            PRECISION_CHECK_ID, case, alpha=budget.per_assertion_alpha, power=0.9, tv=0.05,
            seed=seed,
        )
        results += check_precision(case, context)
    return results, unavailable
