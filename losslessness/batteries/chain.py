"""The chain battery of the default audit: the chain-verifier cases a LOSSLESS verdict stands on.

It spans V from 2 to 4096; flat, dense, peaked (hundreds of masses below 1e-3) and skewed
distributions; exact zeros in p where q is positive and the reverse; q near p and far from it;
draft lengths k = 1..4; batches of identical rows and of different rows; calls of one row,
calls of distinct rows only, float32 and bfloat16 inputs; and the exact edge cases of
docs/architecture.md, 'What lossless means' (disjoint supports, one-hot p, p == q). Every case
is built from :data:`BATTERY_SEED`, so the battery, and each case's hash, is the same on every
machine.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from losslessness.batteries.builders import mix, probs_tensor, softmax
from losslessness.cases import ChainCase
from losslessness.laws import total_variation

BATTERY_SEED = 20221130
"""Seed of the battery's construction (the date of Leviathan et al.'s first arXiv version);
the greedy battery (:mod:`losslessness.batteries.greedy`) uses ``BATTERY_SEED + 1``."""


def chain_case(
    case_id: str,
    regime: str,
    target: list[list[np.ndarray]],
    draft: list[list[np.ndarray]],
    tags: set[str],
    call_batch_size: int | None = None,
    dtype: str = "float64",
) -> ChainCase:
    """A chain case from its rows, its summary stating V, k, the regime, the range of TV(p, q)
    over its positions, its row types and its call conditions (the battery's and a case
    file's cases are built here).

    Args:
        case_id: the case's id. regime: words for the summary.
        target: R row types, each k+1 ``[V]`` float64 rows (normalised here).
        draft: R row types, each k ``[V]`` float64 rows (normalised here).
        tags: regime labels. call_batch_size: rows per call, or None.
        dtype: a key of :data:`losslessness.cases.CHAIN_INPUT_DTYPES`.

    Raises:
        InvalidInputError: rows that do not form chain inputs (:class:`ChainCase`).
    """
    target_probs = torch.stack([probs_tensor(rows) for rows in target])
    draft_probs = torch.stack([probs_tensor(rows) for rows in draft])
    k = draft_probs.shape[1]
    tv = total_variation(target_probs[:, :k], draft_probs)
    tv_text = f"TV(p,q) {float(tv.min()):.2f}-{float(tv.max()):.2f}" if k else "k=0"
    rows = f", {target_probs.shape[0]} row types" if target_probs.shape[0] > 1 else ""
    batch = "" if call_batch_size is None else f", B={call_batch_size}"
    precision = "" if dtype == "float64" else f", {dtype}"
    summary = f"V={target_probs.shape[2]} k={k} {regime}, {tv_text}{rows}{batch}{precision}"
    return ChainCase(
        case_id, summary, target_probs, draft_probs, frozenset(tags), call_batch_size, dtype
    )


def default_chain_battery() -> list[ChainCase]:
    """The chain-verifier battery of the default audit.

    Returns:
        Sixteen :class:`ChainCase` objects, deterministic (built from :data:`BATTERY_SEED`).
    """
    return list(_default_chain_battery())


@functools.cache
def _default_chain_battery() -> tuple[ChainCase, ...]:
    """Built once per process (cases are immutable; targets get copies of their tensors)."""
    rng = np.random.default_rng(BATTERY_SEED)

    def dirichlet(vocab: int, concentration: float) -> np.ndarray:
        return rng.dirichlet(np.full(vocab, concentration))

    cases = []
    cases.append(
        chain_case(
            "v2-tilted",
            "dense",
            [[np.array([0.3, 0.7]), np.array([0.6, 0.4]), np.array([0.45, 0.55])]],
            [[np.array([0.5, 0.5]), np.array([0.2, 0.8])]],
            {"dense"},
        )
    )
    cases.append(
        chain_case(
            "v2-skewed",
            "tiny masses",
            [[np.array([0.004, 0.996]), np.array([0.99, 0.01])]],
            [[np.array([0.3, 0.7])]],
            {"skewed"},
        )
    )
    cases.append(
        chain_case(
            "v8-far",
            "dense, q far from p",
            [[dirichlet(8, 2.0) for _ in range(2)]],
            [[dirichlet(8, 2.0)]],
            {"dense", "far"},
        )
    )
    p16 = [dirichlet(16, 2.0) for _ in range(5)]
    cases.append(
        chain_case(
            "v16-near-k4",
            "dense, q near p",
            [p16],
            [[mix(p, dirichlet(16, 2.0), 0.1) for p in p16[:4]]],
            {"dense", "near"},
        )
    )

    def with_zeros(vocab: int, zero_share: float) -> np.ndarray:
        probs = dirichlet(vocab, 1.0)
        probs[rng.random(vocab) < zero_share] = 0.0
        probs[rng.integers(vocab)] += 0.05  # never an all-zero row
        return probs

    p64 = [with_zeros(64, 0.35) for _ in range(4)]
    q64 = []
    for p in p64[:3]:
        q = mix(p / p.sum(), dirichlet(64, 1.0), 0.3)
        q[rng.random(64) < 0.3] = (
            0.0  # zeros of q where p is positive: only the residual emits them
        )
        q[int(np.argmax(p))] += 0.05
        q64.append(q)
    cases.append(chain_case("v64-zeros", "exact zeros in p and in q", [p64], [q64], {"zeros"}))

    def peaked(vocab: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
        logits = rng.standard_normal(vocab)
        return logits, softmax(logits / temperature)

    # Temperature 0.25: the top token holds most of the mass and thousands of tokens sit below
    # 1e-3; the draft is the same logits, perturbed, at a slightly higher temperature.
    peaked_rows = [peaked(1000, 0.25) for _ in range(3)]
    cases.append(
        chain_case(
            "v1000-peaked",
            "peaked (low temperature), q a perturbed temperature",
            [[probs for _, probs in peaked_rows]],
            [
                [
                    softmax((logits + 0.1 * rng.standard_normal(1000)) / 0.27)
                    for logits, _ in peaked_rows[:2]
                ]
            ],
            {"peaked", "near"},
        )
    )
    p4096 = [dirichlet(4096, 200.0) for _ in range(2)]
    cases.append(
        chain_case(
            "v4096-flat",
            "flat",
            [p4096],
            [[mix(p4096[0], dirichlet(4096, 200.0), 0.8)]],
            {"flat"},
        )
    )
    mixed_target, mixed_draft = [], []
    for concentration, weight in ((2.0, 0.1), (0.5, 0.6), (1.0, 0.5)):
        ps = [dirichlet(32, concentration) for _ in range(3)]
        mixed_target.append(ps)
        mixed_draft.append([mix(p, dirichlet(32, concentration), weight) for p in ps[:2]])
    cases.append(
        chain_case(
            "v32-mixed-batch",
            "different rows in one batch",
            mixed_target,
            mixed_draft,
            {"mixed-batch", "near", "far"},
        )
    )
    p300 = [dirichlet(300, 0.1), dirichlet(300, 0.1)]
    cases.append(
        chain_case(
            "v300-far-k1",
            "sparse Dirichlet(0.1), q far from p",
            [p300],
            [[mix(p300[0], dirichlet(300, 0.1), 0.6)]],
            {"far", "peaked"},
        )
    )
    half = np.concatenate([np.ones(8), np.zeros(8)])
    cases.append(
        chain_case(
            "edge-disjoint",
            "disjoint supports",
            [[half * dirichlet(16, 1.0) for _ in range(3)]],
            [[half[::-1] * dirichlet(16, 1.0) for _ in range(2)]],
            {"disjoint"},
        )
    )
    hot_tokens = rng.choice(32, size=4, replace=False)
    cases.append(
        chain_case(
            "edge-one-hot",
            "one-hot p",
            [[np.eye(32)[token] for token in hot_tokens]],
            [[mix(np.eye(32)[token], dirichlet(32, 1.0), 0.3) for token in hot_tokens[:3]]],
            {"one-hot"},
        )
    )
    same = [dirichlet(32, 1.0) for _ in range(3)]
    cases.append(
        chain_case(
            "edge-p-equals-q",
            "p == q",
            [[*same, dirichlet(32, 1.0)]],
            [same],
            {"p-equals-q"},
        )
    )
    # Call conditions (issue 21): a verifier may be lossy only in small batches, only when a
    # call's rows all differ, or only for reduced-precision inputs. Built last, so that the
    # cases above keep their draws and hashes.
    # Small V and k: every step of these two is one verifier call (of 1 and 4 rows), so they
    # are kept to the fewest steps the design allows.
    p_b1 = [dirichlet(8, 1.0) for _ in range(2)]
    cases.append(
        chain_case(
            "v8-b1",
            "dense, q far from p, one row per call",
            [p_b1],
            [[mix(p_b1[0], dirichlet(8, 1.0), 0.5)]],
            {"dense", "far", "small-batch"},
            call_batch_size=1,
        )
    )
    distinct_target = [[dirichlet(8, 1.0) for _ in range(2)] for _ in range(4)]
    cases.append(
        chain_case(
            "v8-distinct-b4",
            "four distinct rows in every call",
            distinct_target,
            [[mix(ps[0], dirichlet(8, 1.0), 0.5)] for ps in distinct_target],
            {"dense", "far", "distinct-rows"},
            call_batch_size=4,
        )
    )
    # The precision cases are small (V = 16): a dtype-only bug shows at any V, and the law
    # tests at V = 128-256 cost the default audit about a minute per worker target.
    float32_rows = [peaked(16, 0.5) for _ in range(4)]
    cases.append(
        chain_case(
            "v16-float32",
            "peaked, q a perturbed temperature, float32 inputs",
            [[probs for _, probs in float32_rows]],
            [
                [
                    softmax((logits + 0.3 * rng.standard_normal(16)) / 0.6)
                    for logits, _ in float32_rows[:3]
                ]
            ],
            {"peaked", "near", "float32"},
            dtype="float32",
        )
    )
    p_bf16 = [dirichlet(16, 1.0) for _ in range(3)]
    cases.append(
        chain_case(
            "v16-bfloat16",
            "dense, bfloat16 inputs",
            [p_bf16],
            [[mix(p, dirichlet(16, 1.0), 0.5) for p in p_bf16[:2]]],
            {"dense", "bfloat16"},
            dtype="bfloat16",
        )
    )
    return tuple(cases)


VOCAB_BATTERY_SEED = BATTERY_SEED + 2
"""Seed of :func:`chain_battery_at_vocab` (the greedy battery uses ``BATTERY_SEED + 1``)."""

LOGIT_SCALE = 3.0
"""Standard deviation of the LM-like cases' raw logits: softmax(3 z), z ~ N(0, 1), puts a few
per cent of the mass on the top token and most of it on the top few hundred at V = 32k."""


@functools.cache
def chain_battery_at_vocab(vocab_size: int) -> tuple[ChainCase, ...]:
    """LM-like chain cases at one vocabulary size V (``--vocab-size``): the target a softmax of
    random logits (scale :data:`LOGIT_SCALE`), the draft the same logits perturbed, a little
    (q near p) or much (q far from p), k = 1..4.

    Args:
        vocab_size: V >= 2. Memory: the case holds ``(2k+1) V`` float64 per row type and the
            sampler at most :data:`losslessness.engine.draw.BATCH_ELEMENT_BUDGET` elements per
            call, so V = 152k costs about 11 MB per case and a few copies per call.

    Returns:
        Four :class:`ChainCase` objects, deterministic (built from
        :data:`VOCAB_BATTERY_SEED` and V).

    Raises:
        ValueError: naming ``vocab_size`` when it is below 2.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size: must be >= 2, got {vocab_size}")
    rng = np.random.default_rng([VOCAB_BATTERY_SEED, vocab_size])

    def lm_case(k: int, noise: float, regime: str) -> ChainCase:
        logits = LOGIT_SCALE * rng.standard_normal((k + 1, vocab_size))
        drafts = logits[:k] + noise * rng.standard_normal((k, vocab_size))
        tags = {"lm-like", "near" if noise < 1 else "far"}
        return chain_case(
            f"v{vocab_size}-lm-{regime}-k{k}",
            f"LM-like softmax of random logits, q {regime} p",
            [[softmax(row) for row in logits]],
            [[softmax(row) for row in drafts]],
            tags,
        )

    return (
        lm_case(1, 0.3, "near"),
        lm_case(2, 3.0, "far"),
        lm_case(3, 0.5, "near"),
        lm_case(4, 1.5, "far"),
    )
