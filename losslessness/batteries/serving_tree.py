"""The serving tree battery (issue 21, items 3 and 5): tree cases as a serving engine verifies
them, raw logits at every node and a request per tree, for serving tree verifiers
(:class:`~losslessness.protocol.ServingTreeVerifier`).

A serving tree case is a :class:`~losslessness.cases.TreeCase` whose target tables hold an
engine profile's law of raw logit tables (:func:`serving_tree_case`), with the raw tables and
the request attached (:class:`~losslessness.cases.ServingTree`): the verifier gets the raw
logits of each node (:meth:`~losslessness.cases.TreeCase.logits`), and the tree checks hold its
output to the processed tables, the law the engine's own non-speculative sampler draws from.
The tables are the profile's, so the battery is built per profile.

The tree checks pool nodes by depth and token (a Markov tree), so a request's law at a node may
read its history only through the history's length: temperature, top-k, top-p, min-p, logit
bias, allowed and bad ids, ``min_tokens`` (its boundary falls at a depth) and greedy rows.
Penalties read the tokens on the path; the serving chain battery covers them
(:mod:`losslessness.batteries.serving`). The draft schemes are iid, without replacement and
top-k (EAGLE's and SGLang's trees, whose siblings are the draft's top tokens). Every tree of
one call carries the case's request, except in the mixed-batch cases, whose calls carry other
requests' trees beside the checked ones (:attr:`~losslessness.cases.ServingTree.companions`).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from losslessness.batteries.builders import softmax, tree_depth
from losslessness.cases import SERVING_TREE_DTYPES, ServingTree, TreeCase
from losslessness.reference.profiles import EngineProfile, get_profile
from losslessness.requests import Request, UnsupportedRequest

__all__ = [
    "SERVING_TREE_CASE_IDS",
    "SERVING_TREE_SEED",
    "default_serving_tree_battery",
    "reads_path_tokens",
    "serving_tree_case",
    "serving_tree_tables",
]

SERVING_TREE_SEED = 20_311
"""Seed of every serving tree case's raw logits and draft laws."""

_V = 16
_ROWS = 2
"""Table rows per depth at V = 16 (tokens share rows by parity): the tree checks test the law
of each (depth, row) class, so few classes leave each deep position an identity test."""
_WIDE = (0, 0, 0, 1, 1, 2)
"""Three root children, two grandchildren under the first, one under the second (depth 2)."""
_DEEP = (0, 1, 2, 2, 3)
"""A chain of depth 4 with a fork at depth 3."""


def reads_path_tokens(request: Request) -> bool:
    """Whether ``request``'s law reads which tokens its history holds (penalties), not only
    how many (the tree checks' Markov pooling needs the latter)."""
    return (
        request.frequency_penalty != 0.0
        or request.presence_penalty != 0.0
        or request.repetition_penalty != 1.0
    )


def serving_tree_case(
    case_id: str,
    summary: str,
    parents: tuple[int, ...],
    draft_scheme: str,
    root_logits: torch.Tensor,
    logit_table: torch.Tensor,
    root_draft: torch.Tensor,
    draft_table: torch.Tensor,
    request: Request,
    profile: str | EngineProfile,
    dtype: str = "float32",
    batch_size: int = 64,
    token_rows: torch.Tensor | None = None,
    tags: frozenset[str] = frozenset(),
    companions: tuple[Request, ...] = (),
) -> TreeCase:
    """A serving tree case: the target tables are ``profile``'s law of the raw logits, as the
    verifier receives them in ``dtype``, at each node's history length.

    Args:
        case_id, summary, parents, draft_scheme, root_draft, draft_table, batch_size,
            token_rows, tags: as :class:`~losslessness.cases.TreeCase`'s.
        root_logits: ``[V]`` float raw logits at the root.
        logit_table: ``[D, S, V]`` float raw logits of a node at depth ``d`` with token x:
            ``logit_table[d-1, row(x)]``.
        request: every tree's request; the root's history is its ``output_token_ids``, a node
            at depth d adds d tokens.
        profile: the engine profile (or its registered name) whose law the tables hold.
        dtype: the logits' dtype, a key of :data:`~losslessness.cases.SERVING_TREE_DTYPES`.
        companions: the other requests of every call (a mixed batch,
            :attr:`~losslessness.cases.ServingTree.companions`), each one ``profile``
            implements.

    Returns:
        The :class:`~losslessness.cases.TreeCase`, its ``serving`` set.

    Raises:
        ValueError: naming ``request`` for penalties (:func:`reads_path_tokens`), ``dtype``
            for an unknown dtype, ``logit_table`` for a shape that is not ``[D, S, V]``.
        UnsupportedRequest: a field ``profile`` does not implement, in ``request`` or a
            companion.
        NoTokenLeft: a node where the masks of ``request`` or a companion leave no token.
        InvalidInputError: :class:`~losslessness.cases.TreeCase`'s errors.
    """
    if reads_path_tokens(request):
        raise ValueError(
            f"request: {request!r} has penalties, which read the tokens on a node's path; a "
            "serving tree case's law may read the history's length only (the tree checks pool "
            "nodes by depth and token)"
        )
    if dtype not in SERVING_TREE_DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(SERVING_TREE_DTYPES)}")
    engine = get_profile(profile) if isinstance(profile, str) else profile
    torch_dtype = SERVING_TREE_DTYPES[dtype]
    root = root_logits.to(torch_dtype).to(torch.float64)
    table = logit_table.to(torch_dtype).to(torch.float64)
    if table.dim() != 3 or table.shape[-1] != root.shape[-1]:
        raise ValueError(
            f"logit_table: expected [D, S, V] with V = {root.shape[-1]}, got {tuple(table.shape)}"
        )
    for companion in companions:
        # A companion tree is verified on every node's law too: each must exist.
        _node_laws(engine, root, table, companion)
    target_root, target_table = _node_laws(engine, root, table, request)
    return TreeCase(
        case_id=case_id,
        summary=f"{summary} [{engine.name}, {dtype} logits]",
        parents=parents,
        root_target=target_root,
        root_draft=root_draft.to(torch.float64),
        target_table=target_table,
        draft_table=draft_table.to(torch.float64),
        draft_scheme=draft_scheme,
        batch_size=batch_size,
        tags=tags | {"serving"},
        token_rows=token_rows,
        serving=ServingTree(request, engine.name, root, table, dtype, tuple(companions)),
    )


def _node_laws(
    engine: EngineProfile, root: torch.Tensor, table: torch.Tensor, request: Request
) -> tuple[torch.Tensor, torch.Tensor]:
    """``engine``'s law of ``request`` at the root (``[V]``) and at every (depth, row) of the
    logit table (``[D, S, V]``), the history grown by one token per depth."""
    history = list(request.output_token_ids)
    return engine.law(root, request, history), torch.stack([
        torch.stack([engine.law(row, request, history + [0] * depth) for row in table[depth - 1]])
        for depth in range(1, table.shape[0] + 1)
    ])


def serving_tree_tables(
    generator: torch.Generator, depth: int, rows: int, vocab: int, scale: float = 1.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw logit tables of a serving tree case and draft laws near them, drawn from
    ``generator``: ``(root logits [V], logit table [D, S, V], root q [V], q table [D, S, V])``,
    float64, the logits Gaussian times ``scale``, q the softmax of the logits plus unit
    Gaussian noise (portably rounded). ``S = rows`` table rows per depth."""
    root = torch.randn(vocab, generator=generator, dtype=torch.float64) * scale
    table = torch.randn(depth, rows, vocab, generator=generator, dtype=torch.float64) * scale
    noise_root = torch.randn(vocab, generator=generator, dtype=torch.float64)
    noise = torch.randn(depth, rows, vocab, generator=generator, dtype=torch.float64)
    root_q = torch.from_numpy(softmax((root + noise_root).numpy()))
    table_q = torch.from_numpy(softmax((table + noise).numpy()))
    return root, table, root_q, table_q


_KINDS: tuple[tuple[str, str, tuple[int, ...], str, Request, int], ...] = (
    ("stree-temperature", "T 0.7", _WIDE, "without-replacement", Request(temperature=0.7), _V),
    ("stree-top-k", "top-k 4", _WIDE, "iid", Request(top_k=4), _V),
    ("stree-top-p", "top-p 0.7", _DEEP, "iid", Request(top_p=0.7), _V),
    ("stree-min-p", "min-p 0.15", _WIDE, "without-replacement", Request(min_p=0.15), _V),
    ("stree-top-k-top-p", "T 0.8 top-k 5 + top-p 0.6", _DEEP, "iid",
     Request(temperature=0.8, top_k=5, top_p=0.6), _V),
    ("stree-logit-bias", "logit bias", _WIDE, "iid",
     Request(logit_bias=((1, 3.0), (2, -100.0), (5, 1.5))), _V),
    ("stree-min-tokens", "min_tokens 2, one output token: stop ids 0, 1 masked at the root only "
     "(their logits +2.5 everywhere)", _DEEP, "iid",
     Request(min_tokens=2, stop_token_ids=(0, 1), output_token_ids=(3,)), 4),
    ("stree-greedy", "greedy", _WIDE, "without-replacement", Request(temperature=0.0), _V),
    ("stree-eagle-top-p", "T 0.9 top-p 0.8 on an EAGLE tree (siblings: the draft's top tokens)",
     _WIDE, "top-k", Request(temperature=0.9, top_p=0.8), _V),
)
"""``(case id, request summary, tree, draft scheme, request, V)`` of each small case; the
``min_tokens`` case has V = 4, so that the tree checks' classes of nodes past the boundary
(one per depth and token) each get an identity test."""

_MIXED: tuple[tuple[str, str, Request, tuple[Request, ...]], ...] = (
    ("stree-mixed-sampled", "T 0.8 top-p 0.9 beside a greedy and a T 0.5 top-k 3 request",
     Request(temperature=0.8, top_p=0.9),
     (Request(temperature=0.0), Request(temperature=0.5, top_k=3))),
    ("stree-mixed-greedy", "greedy beside a T 1 and a T 0.7 top-p 0.8 request",
     Request(temperature=0.0), (Request(), Request(temperature=0.7, top_p=0.8))),
)
"""``(case id, summary, the checked request, its companions)`` of the mixed-batch cases (the
wide tree at V = 16, i.i.d. drafts): every call carries the other requests' trees too, so a
verifier whose law for a tree reads its batch (a greedy or filtering flag set per batch) fails
here while it passes every unmixed case."""

_V1024_ID = "stree-v1024-top-k"

_GREEDY_MIN_TOKENS = (
    "stree-greedy-min-tokens",
    "greedy, min_tokens 2, one output token: stop ids 0, 1 masked at the root only (their "
    "logits +2.5 everywhere)",
    Request(temperature=0.0, min_tokens=2, stop_token_ids=(0, 1), output_token_ids=(3,)),
)
"""The ``min_tokens`` case for a greedy request (V = 4, the deep tree): below the root the
argmax is often a stop token, so a verifier that keeps the stop tokens masked past the boundary
(SGLang's penalties frozen for the step) emits another token there, an exact failure."""

_STOP_BOOST = 2.5
"""Added to the stop tokens' raw logits in the ``min_tokens`` case."""

SERVING_TREE_CASE_IDS = (*(kind[0] for kind in _KINDS), _V1024_ID,
                         *(kind[0] for kind in _MIXED), _GREEDY_MIN_TOKENS[0])
"""The ids of the serving tree battery's cases, whatever the profile (``--case`` names them)."""


@functools.cache
def _battery(profile: str, dtype: str) -> tuple[TreeCase, ...]:
    # One generator for the whole battery: each case's tables are the next draws.
    generator = torch.Generator().manual_seed(SERVING_TREE_SEED)
    cases = []
    for case_id, label, parents, scheme, request, vocab in _KINDS:
        root, table, root_q, table_q = serving_tree_tables(generator, tree_depth(parents), _ROWS,
                                                         vocab)
        if request.min_tokens:
            # Likely stop tokens, as an end of text often is: the mask's boundary moves mass.
            root[list(request.stop_token_ids)] += _STOP_BOOST
            table[..., list(request.stop_token_ids)] += _STOP_BOOST
        try:
            cases.append(serving_tree_case(
                case_id, f"{label}; V = {vocab}, N = {len(parents)}, {scheme}", parents, scheme,
                root, table, root_q, table_q, request, profile, dtype,
                token_rows=torch.arange(vocab, dtype=torch.int64) % _ROWS,
            ))
        except UnsupportedRequest:
            continue
    rows = torch.arange(1024, dtype=torch.int64) % 8
    root, table, root_q, table_q = serving_tree_tables(generator, tree_depth(_WIDE), 8, 1024,
                                                     scale=3.0)
    with contextlib.suppress(UnsupportedRequest):
        cases.append(serving_tree_case(
            _V1024_ID, f"T 0.8 top-k 20; V = 1024 (8 table rows), N = {len(_WIDE)}, "
            "without-replacement", _WIDE, "without-replacement", root, table, root_q, table_q,
            Request(temperature=0.8, top_k=20), profile, dtype, token_rows=rows,
        ))
    # Drawn after the others, whose tables (and hashes) stay what they were.
    for case_id, label, request, companions in _MIXED:
        root, table, root_q, table_q = serving_tree_tables(generator, tree_depth(_WIDE), _ROWS,
                                                         _V)
        with contextlib.suppress(UnsupportedRequest):
            cases.append(serving_tree_case(
                case_id, f"{label}; V = {_V}, N = {len(_WIDE)}, iid", _WIDE, "iid", root,
                table, root_q, table_q, request, profile, dtype,
                token_rows=torch.arange(_V, dtype=torch.int64) % _ROWS,
                tags=frozenset({"mixed"}), companions=companions,
            ))
    case_id, label, request = _GREEDY_MIN_TOKENS
    root, table, root_q, table_q = serving_tree_tables(generator, tree_depth(_DEEP), _ROWS, 4)
    root[list(request.stop_token_ids)] += _STOP_BOOST
    table[..., list(request.stop_token_ids)] += _STOP_BOOST
    with contextlib.suppress(UnsupportedRequest):
        cases.append(serving_tree_case(
            case_id, f"{label}; V = 4, N = {len(_DEEP)}, iid", _DEEP, "iid", root, table,
            root_q, table_q, request, profile, dtype,
            token_rows=torch.arange(4, dtype=torch.int64) % _ROWS,
        ))
    return tuple(cases)


def default_serving_tree_battery(profile: str, dtype: str = "float32") -> list[TreeCase]:
    """The serving tree cases for ``profile`` (a registered name), processed by its law from
    logits in ``dtype``: every request kind of the module docstring on two trees at V = 16
    (min_tokens at V = 4; two table rows per depth), two mixed batches (a sampled request
    beside greedy and filtered ones, a greedy one beside sampled ones), top-k at V = 1024
    (eight rows), and ``min_tokens`` for a greedy request (V = 4). A case whose request
    ``profile`` does not implement is left out.

    Raises:
        ValueError: an unknown profile or dtype.
    """
    return list(_battery(profile, dtype))
