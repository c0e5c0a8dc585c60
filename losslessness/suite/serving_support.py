"""What the property suite's serving test shares (issue 21, item 6): the serving case strategy
for one engine profile, the explicit witness cases, one example run on the engine's pieces (the
serving sampler :func:`losslessness.engine.serving.sample_serving` and the serving checks
:func:`losslessness.checks.serving.check_serving`) and the failure message (check, row kind,
request, position, seed, replay).

A serving example is a batch as a serving engine builds it (:class:`~losslessness.cases.
ServingCase`): 1..:data:`~losslessness.suite.support.SERVING_MAX_KINDS` row kinds, each a
request from :func:`strategies.requests.requests` restricted to the fields the target's engine
profile implements (greedy rows beside sampled rows at several temperatures; top-k, top-p,
min-p, logit bias; penalties with output histories; ``min_tokens`` with its boundary moved into
the draft block; seeded beside unseeded rows), its own ``num_draft_tokens`` in ``0..k``, logits
from :func:`strategies.logits.logits_vectors` (ties at the maximum, ``-inf`` masks), draft
probabilities from :func:`strategies.probability_vectors` or none (fixed drafts, the target's
argmax or any token), ``copies`` of each kind per call (B from 1 up) and float32, bfloat16 or
float64 logits. The law every emitted token must follow is the profile's
(:class:`~losslessness.reference.serving.ServingRowLaws`); the suite's per-assertion level is
the suite budget's (:func:`~losslessness.suite.support.suite_budget`), the same for every test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from hypothesis import HealthCheck, assume, event, settings
from hypothesis import strategies as st

import strategies as project_strategies
from losslessness.cases import ServingCase, ServingRow
from losslessness.checks.ids import SERVING_STRUCTURE_CHECK_ID
from losslessness.checks.serving import check_serving
from losslessness.engine.serving import sample_serving
from losslessness.protocol import ServingVerifier
from losslessness.reference.profiles import EngineProfile
from losslessness.reference.profiles.steps import NoTokenLeft
from losslessness.reference.serving import ServingRowLaws
from losslessness.requests import Request, UnsupportedRequest
from losslessness.results import CheckContext, CheckResult, Verdict
from losslessness.seeding import derive_seed
from losslessness.suite.support import (
    SERVING_MAX_COPIES,
    SERVING_MAX_K,
    SERVING_MAX_KINDS,
    SERVING_MAX_VOCAB,
    SERVING_STEPS_PER_ROW,
    SuiteBudget,
    failure_headline,
    suite_budget,
)
from losslessness.worker import ProtocolViolation
from strategies.logits import logits_vectors
from strategies.requests import REQUEST_FIELDS, requests

__all__ = [
    "SERVING_LOGIT_MAGNITUDE",
    "SERVING_SUITE_DTYPES",
    "SERVING_SUITE_SETTINGS",
    "SERVING_WITNESSES",
    "ServingFailure",
    "run_serving_example",
    "serving_seed",
    "suite_serving_cases",
    "supported_fields",
    "witness_case",
]

SERVING_SUITE_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)
"""The Hypothesis settings of the serving and serving tree tests (over the profile's): no
deadline (a call of a target may take seconds), and the examples' size, speed and rejections
(requests the profile refuses) are the tests' business."""

SERVING_SUITE_DTYPES = ("float32", "bfloat16", "float64")
"""Logits dtypes of generated serving cases (shrinking towards float32, what engines serve)."""

SERVING_LOGIT_MAGNITUDE = 30.0
"""Bound on the finite logits of a generated row (LM logits reach 15-30)."""

_PROBES: dict[str, dict[str, object]] = {
    "temperature": {"temperature": 0.7},
    "top_k": {"top_k": 2},
    "top_p": {"top_p": 0.9},
    "min_p": {"min_p": 0.1},
    "logit_bias": {"logit_bias": ((0, 1.0),)},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "presence_penalty": {"presence_penalty": 0.5},
    "repetition_penalty": {"repetition_penalty": 1.2},
    "min_tokens": {"min_tokens": 2, "stop_token_ids": (0,)},
    "allowed_token_ids": {"allowed_token_ids": (0, 1)},
    "bad_token_ids": {"bad_token_ids": (0,)},
    "seed": {"seed": 1},
}
"""One request per field of :data:`strategies.requests.REQUEST_FIELDS` with that field alone
on: what :func:`supported_fields` asks a profile about."""


class ServingFailure(AssertionError):
    """A serving example failed: the message names the check, the row kind and its request,
    the position, the case, the seed and a replay command."""


def supported_fields(profile: EngineProfile) -> tuple[frozenset[str], bool]:
    """The request fields ``profile`` implements, and whether it has a greedy sampler.

    Each field of :data:`strategies.requests.REQUEST_FIELDS` is asked for alone (a request
    with that field on, logits over 4 tokens, a history of one token); a profile that raises
    :class:`~losslessness.requests.UnsupportedRequest` lacks it. Combinations a profile refuses
    (FlashInfer's min-p with top-k or top-p) are rejected per example by
    :func:`suite_serving_cases`.

    Returns:
        ``(fields, greedy)``.
    """
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0], dtype=torch.float64)

    def implements(values: dict[str, object]) -> bool:
        try:
            profile.law(logits, Request(**values), [1])  # type: ignore[arg-type]
        except UnsupportedRequest:
            return False
        return True

    fields = frozenset(name for name in REQUEST_FIELDS if implements(_PROBES[name]))
    return fields, implements({"temperature": 0.0})


def _fits(profile: EngineProfile, case: ServingCase) -> bool:
    """Whether every row kind of ``case`` has a law under ``profile`` at every position (no
    field combination the engine refuses, some token left after its masks). The empty prefix
    suffices: a longer history only lifts masks (``min_tokens``) and penalties mask nothing."""
    try:
        for kind in range(case.n_rows):
            laws = ServingRowLaws(profile, case, kind)
            for position in range(case.rows[kind].num_draft_tokens + 1):
                laws.law(position, ())
    except (UnsupportedRequest, NoTokenLeft):
        return False
    return True


@st.composite
def _serving_row(
    draw: st.DrawFn, vocab: int, k: int, with_draft_probs: bool, fields: frozenset[str],
    greedy: bool,
) -> ServingRow:
    """One row kind: logits ``[k+1, V]``, a request, its drafts (draft laws or fixed ids)."""
    logits = torch.stack([
        draw(logits_vectors(vocab, max_magnitude=SERVING_LOGIT_MAGNITUDE)) for _ in range(k + 1)
    ]).to(torch.float64)
    request = draw(requests(vocab, fields=sorted(fields), greedy=None if greedy else False,
                            max_history=4))
    # Drawn down from k: Hypothesis favours small integers, and full draft blocks are where
    # the positions after accepted drafts (and their histories) are tested.
    n = k - draw(st.integers(0, k))
    if request.min_tokens:
        # Put the boundary where it matters: before, inside or right after the draft block.
        boundary = len(request.output_token_ids) + draw(st.integers(0, k + 1))
        request = dataclasses.replace(request, min_tokens=max(1, boundary))
    label = "greedy" if request.greedy else f"T {request.temperature:.3g}"
    label += "" if request.seed is None else ", seeded"
    if with_draft_probs:
        q = [draw(project_strategies.probability_vectors(vocab)) for _ in range(k)]
        draft_probs = torch.stack(q) if k else torch.zeros((0, vocab), dtype=torch.float64)
        return ServingRow(label, logits, request, n, draft_probs=draft_probs.to(torch.float64))
    drafts = tuple(
        int(torch.argmax(logits[i])) if draw(st.booleans())
        else draw(st.integers(0, vocab - 1))
        for i in range(n)
    )
    return ServingRow(label, logits, request, n, drafts=drafts)


def suite_serving_cases(profile: EngineProfile) -> st.SearchStrategy[ServingCase]:
    """Serving cases for a target claiming ``profile`` (the module docstring says what varies).

    V in ``[2, SERVING_MAX_VOCAB]``, k in ``[0, SERVING_MAX_K]``, 1..``SERVING_MAX_KINDS`` row
    kinds, ``copies`` in ``[1, SERVING_MAX_COPIES]``; requests use only the fields
    :func:`supported_fields` finds in ``profile`` (greedy rows only where it has a greedy
    sampler). A case whose row has no law under the profile (a refused combination, every
    token masked) is rejected. Reports ``event`` for the dtype, the drafts and B.
    """
    fields, greedy = supported_fields(profile)

    @st.composite
    def cases(draw: st.DrawFn) -> ServingCase:
        vocab = draw(st.integers(2, SERVING_MAX_VOCAB))
        k = draw(st.integers(0, SERVING_MAX_K))
        with_draft_probs = draw(st.booleans())
        kinds = draw(st.integers(1, SERVING_MAX_KINDS))
        rows = tuple(
            draw(_serving_row(vocab, k, with_draft_probs, fields, greedy)) for _ in range(kinds)
        )
        copies = draw(st.integers(1, SERVING_MAX_COPIES))
        dtype = draw(st.sampled_from(SERVING_SUITE_DTYPES))
        drafted = "draft probs" if with_draft_probs else "no draft probs"
        summary = (
            f"V={vocab} k={k} {kinds} row kind{'s' if kinds > 1 else ''} x {copies} "
            f"(B={kinds * copies}), {drafted}, {dtype} logits"
        )
        case = ServingCase("hypothesis", summary, rows, copies=copies, dtype=dtype)
        assume(_fits(profile, case))
        event(f"serving dtype={dtype}")
        event(f"serving {drafted}")
        event(f"serving B={kinds * copies}")
        return case

    return cases()


def _logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _witness_filters() -> ServingCase:
    """Sampled rows whose laws the request's filters and temperature shape, beside a greedy
    row, with draft probabilities far from the target: where a verifier that drops the
    request's temperature and top-p (vLLM #9834), min-p and logit bias (vLLM #42744), swaps
    the top-k/top-p order (SGLang #36173) or draws the residual with the acceptance uniform
    (vllm-ascend #16370) is off by a TV of 0.2 or more at position 0."""
    logits = _logits([1.0, 0.7, 0.3, -0.2, -1.0], [0.5, 1.0, -0.5, 0.0, 0.2])
    far = torch.tensor([[0.02, 0.03, 0.05, 0.3, 0.6]], dtype=torch.float64)
    return ServingCase(
        "witness-serving-filters",
        "V=5 k=1 witness: temperature and top-p, top-k with top-p, min-p with a bias, greedy",
        (
            ServingRow("T 0.5, top-p 0.8", logits, Request(temperature=0.5, top_p=0.8), 1,
                       draft_probs=far),
            ServingRow("top-k 2 + top-p 0.5", logits, Request(top_k=2, top_p=0.5), 1,
                       draft_probs=far),
            ServingRow("min-p 0.5, bias +2 on token 4", logits,
                       Request(min_p=0.5, logit_bias=((4, 2.0),)), 1, draft_probs=far),
            ServingRow("greedy", logits, Request(temperature=0.0), 1, draft_probs=far),
        ),
        copies=1,
        dtype="float32",
    )


def _witness_history() -> ServingCase:
    """Rows whose law reads the history, one seeded, beside unseeded rows, with fixed drafts
    (no draft probabilities): a frequency penalty of 2 on a token emitted three times, a
    presence and a repetition penalty, ``min_tokens`` ending inside the draft block. A
    verifier that ignores the penalties (vLLM #18902, TensorRT-LLM #17701) moves most of the
    first position's mass; one that hands unseeded rows of a batch with seeded rows stale
    noise (vLLM #9441) emits the same tokens every call."""
    logits = _logits([1.0, 0.8, 0.0, -0.5], [0.3, 1.0, 0.2, -0.4], [0.0, 0.5, 1.0, 0.0])
    return ServingCase(
        "witness-serving-history",
        "V=4 k=2 witness: penalties with histories, seeded beside unseeded, min_tokens",
        (
            ServingRow("frequency penalty 2, seeded", logits,
                       Request(frequency_penalty=2.0, seed=7, output_token_ids=(0, 0, 0)), 2,
                       drafts=(1, 2)),
            ServingRow("presence 1.5 + repetition 2", logits,
                       Request(presence_penalty=1.5, repetition_penalty=2.0,
                               output_token_ids=(0, 1)), 1, drafts=(1,)),
            ServingRow("min_tokens 2 (stop 0)", logits,
                       Request(min_tokens=2, stop_token_ids=(0,), output_token_ids=(3,)), 2,
                       drafts=(1, 0)),
        ),
        copies=1,
        dtype="bfloat16",
    )


SERVING_WITNESSES: dict[str, Callable[[], ServingCase]] = {
    "witness-serving-filters": _witness_filters,
    "witness-serving-history": _witness_history,
}
"""The serving test's explicit cases, by name, run by every profile besides the generated
ones (each function's docstring says which bugs it guarantees to reach). Counted in the
suite's budget (:data:`losslessness.suite.support.SERVING_WITNESS_EXAMPLES`)."""


def witness_case(name: str, profile: EngineProfile) -> ServingCase | None:
    """The witness ``name`` restricted to the row kinds ``profile`` gives a law for (an
    engine without a field keeps the other rows), or None when no row kind is left."""
    case = SERVING_WITNESSES[name]()
    rows = tuple(
        row for row in case.rows
        if _fits(profile, dataclasses.replace(case, rows=(row,)))
    )
    return dataclasses.replace(case, rows=rows) if rows else None


def _describe(request: Request) -> str:
    """The request's fields that differ from their defaults, ``name=value`` pairs."""
    default = Request()
    parts = [
        f"{field.name}={getattr(request, field.name)!r}"
        for field in dataclasses.fields(Request)
        if getattr(request, field.name) != getattr(default, field.name)
    ]
    return "Request(" + ", ".join(parts) + ")"


def serving_failure_message(
    case: ServingCase, result: CheckResult, budget: SuiteBudget, seed: int, replay: str
) -> str:
    """The message of a failed serving assertion: the check, position and row kind, the
    case, the kind's request and drafts, the evidence, the seed and a replay command."""
    lines = failure_headline(result, case.summary, budget, row_word="row kind")
    if result.row is not None:
        row = case.rows[result.row]
        lines.append(f"  row kind {result.row} ({row.label}): {_describe(row.request)}")
        lines.append(
            f"  num_draft_tokens {row.num_draft_tokens}, "
            + ("drafts drawn from draft_probs" if row.drafts is None else f"drafts {row.drafts}")
        )
    lines.append(f"  {result.message}")
    lines.append(f"  seed {seed} (derived from the case hash {case.case_hash})")
    lines.append(f"  replay: {replay}")
    return "\n".join(lines)


def serving_seed(case: ServingCase) -> int:
    """The seed of ``case``'s samples in the suite, derived from its content hash (re-runs of a
    case while Hypothesis shrinks reuse it)."""
    return derive_seed(0, "suite-serving", case.case_hash)


def run_serving_example(
    verifier: ServingVerifier, profile: EngineProfile, case: ServingCase, replay: str,
    timeout_s: float | None = None,
) -> None:
    """Sample ``case`` on ``verifier`` (:data:`SERVING_STEPS_PER_ROW` rows per kind, each call
    within ``timeout_s`` seconds) and decide with the serving checks on ``profile`` at the
    suite's per-assertion level; fail on the first LOSSY result.

    Raises:
        ServingFailure: with :func:`serving_failure_message` (a malformed output:
            ``serving.structure`` with the sampler's message).
        TargetTimeout: a call took longer than ``timeout_s``.
    """
    budget = suite_budget()
    seed = serving_seed(case)
    try:
        samples = sample_serving(verifier, case, SERVING_STEPS_PER_ROW, seed, timeout_s)
    except ProtocolViolation as violation:
        raise ServingFailure("\n".join([
            f"losslessness: LOSSY {SERVING_STRUCTURE_CHECK_ID} ({case.summary})",
            f"  {violation}",
            f"  seed {seed} (derived from the case hash {case.case_hash})",
            f"  replay: {replay}",
        ])) from None
    context = CheckContext(
        getattr(verifier, "__name__", "serving"), case.case_id, case.summary, case.case_hash,
        budget.per_assertion_alpha, 0.9, 0.1, seed, n_rows=case.n_rows,
    )
    results = check_serving(samples, profile, context)
    lossy = [result for result in results if result.verdict is Verdict.LOSSY]
    if lossy:
        raise ServingFailure(serving_failure_message(case, lossy[0], budget, seed, replay))
