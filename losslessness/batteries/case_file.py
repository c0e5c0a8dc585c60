"""Case files: a user's chain, tree, serving and serving tree cases in TOML (``--case-file
FILE.toml``; the format, every field with its default and range, in docs/case-file.md).

A case file holds arrays of tables ``[[chain]]``, ``[[tree]]``, ``[[serving]]`` and
``[[serving_tree]]``, one case each, named by a unique ``id``. :func:`read_case_file` parses
it with :mod:`tomllib` and validates every field before anything is built; an error names the
file, the table (``chain[2]``, with its id when it has one) and the field (``vocab_size: must
be >= 2, got 1``). The cases are built from the battery's own builders
(:func:`losslessness.batteries.chain.chain_case`, :mod:`losslessness.batteries.builders`,
:class:`losslessness.batteries.serving.ServingDraws`,
:func:`losslessness.batteries.serving_tree.serving_tree_case`), each from its table's ``seed``,
so a file gives the same cases, and hashes, on every machine. A serving tree case's target laws
are an engine profile's: it is built for the profile of the target that runs it
(:meth:`CaseFile.serving_tree_cases`). The run adds them to the battery's cases and plans them
inside its one error budget (:mod:`losslessness.engine.plan`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import numpy as np
import tomllib
import torch

from losslessness.batteries.builders import (
    dirichlet_rows,
    markov_tables,
    mix,
    softmax,
    softmax_markov_tables,
    tree_depth,
)
from losslessness.batteries.chain import LOGIT_SCALE, chain_case
from losslessness.batteries.serving import ServingDraws
from losslessness.batteries.serving_tree import (
    reads_path_tokens,
    serving_tree_case,
    serving_tree_tables,
)
from losslessness.batteries.tree import (
    LM_DRAFT_NOISE,
    LM_LOGIT_SCALE,
    TABLE_CELLS,
    VOCAB_SHAPES,
    tree_case_in_dtype,
    trees_per_call,
)
from losslessness.cases import (
    CHAIN_INPUT_DTYPES,
    SERVING_DTYPES,
    SERVING_TREE_DTYPES,
    ChainCase,
    ServingCase,
    ServingRow,
    TreeCase,
)
from losslessness.protocol import DRAFT_SCHEMES
from losslessness.reference.profiles import PROFILES, get_profile
from losslessness.requests import Request, UnsupportedRequest

__all__ = [
    "CASE_FILE_KINDS",
    "CHAIN_REGIMES",
    "TREE_LAWS",
    "TREE_SHAPES",
    "CaseFile",
    "CaseFileError",
    "ChainSpec",
    "ServingRowSpec",
    "ServingSpec",
    "ServingTreeSpec",
    "TreeSpec",
    "read_case_file",
]

CASE_FILE_KINDS = ("chain", "tree", "serving", "serving_tree")
"""The tables a case file may hold (each an array of tables)."""

MAX_VOCAB = 1 << 18
"""Largest ``vocab_size`` of a case-file case (262144: every real vocabulary up to Gemma's
256k); a chain case holds ``(2k+1) V`` float64 per row type."""

MAX_DIRICHLET_TREE_VOCAB = 256
"""Largest ``vocab_size`` of a tree case with ``laws = "dirichlet"``: its Markov tables hold a
row per token (``[D, V, V]``, 0.5 MB per depth at V = 256); the ``lm`` laws share rows and
take any V."""

MAX_K = 16
"""Longest draft block ``k`` of a chain or serving case (chain cases' exact laws and sizing
cost grow with k)."""

MAX_NODES = 64
"""Most nodes of a case file's tree (``parents``)."""

MAX_ROWS = 64
"""Most row types of a chain case and row kinds of a serving case."""

CHAIN_REGIMES: dict[str, str] = {
    "dense": "Dirichlet(concentration = 2) rows",
    "sparse": "sparse Dirichlet(concentration = 0.1) rows",
    "flat": "flat Dirichlet(concentration = 200) rows",
    "dirichlet": "Dirichlet(concentration) rows, concentration 1 unless given",
    "zeros": "Dirichlet(concentration = 1) rows with a share zero_share of exact zeros",
    "peaked": "softmax(z / temperature), z ~ N(0, 1), temperature 0.25 (thousands of tiny "
    "masses at large V)",
    "lm": "language-model-like softmax(z / temperature), temperature 1/3 (the --vocab-size "
    "cases' softmax(3 z))",
    "one-hot": "one-hot p (its token emitted with certainty)",
    "disjoint": "p on the first half of the tokens, q on the second (no draft accepted)",
    "p-equals-q": "q equal to p (every draft accepted by an optimal verifier)",
}
"""The chain regimes a case file names (``regime``), the shapes of the battery's cases."""

_CONCENTRATION = {"dense": 2.0, "sparse": 0.1, "flat": 200.0, "dirichlet": 1.0, "zeros": 1.0}
_TEMPERATURE = {"peaked": 0.25, "lm": 1.0 / LOGIT_SCALE}

TREE_SHAPES: dict[str, tuple[int, ...]] = {name: parents for name, _, parents in VOCAB_SHAPES}
"""The named tree shapes a case file may give as ``shape`` (the tree battery's; ``parents``
gives any other)."""

TREE_LAWS = ("lm", "dirichlet")
"""How a tree case's p and q are drawn (``laws``): ``lm``, softmax of random logits
(:func:`~losslessness.batteries.builders.softmax_markov_tables`), or ``dirichlet``
(:func:`~losslessness.batteries.builders.markov_tables`)."""

MAX_SERVING_TREE_ROWS = 64
"""Most table rows per depth of a serving tree case (each row's law is the profile's, computed
once per depth and row when the case is built)."""

_Spec = TypeVar("_Spec", "ChainSpec", "TreeSpec", "ServingSpec")
_Case = TypeVar("_Case", ChainCase, TreeCase, ServingCase)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_REQUEST_FIELDS = tuple(field.name for field in dataclasses.fields(Request))
_REQUIRED = object()


class CaseFileError(ValueError):
    """A case file that cannot be read or holds an invalid table. The message reads
    ``case_file: PATH: chain[2] (id 'x'): vocab_size: must be >= 2, got 1`` (the
    commands report it under ``--case-file``).

    Args:
        path: the file. where: the table (``chain[2] (id 'x')``), or empty for the whole
            file. field: the field (``rows[1].top_p`` inside a serving row), or empty.
        what: what is wrong.
    """

    def __init__(self, path: str, where: str, field: str, what: str) -> None:
        parts = [part for part in (where, field) if part]
        super().__init__(f"case_file: {': '.join([path, *parts, what])}")


class _Table:
    """One TOML table being validated: typed field reads with defaults and ranges, each error
    naming the file, the table and the field."""

    def __init__(self, path: str, where: str, values: Any, known: Collection[str],
                 prefix: str = "") -> None:
        self.path, self.where, self.prefix = path, where, prefix
        if not isinstance(values, dict):
            self.fail("", f"must be a table, got {type(values).__name__}")
        self.values: dict[str, Any] = values
        unknown = sorted(set(values) - set(known))
        if unknown:
            self.fail(unknown[0], f"unknown field; known: {', '.join(sorted(known))}")

    def fail(self, name: str, what: str) -> NoReturn:
        """Raise :class:`CaseFileError` for field ``name``."""
        raise CaseFileError(self.path, self.where, self.prefix + name, what)

    def has(self, name: str) -> bool:
        """Whether the table gives ``name``."""
        return name in self.values

    def _get(self, name: str, default: Any) -> Any:
        if name in self.values:
            return self.values[name]
        if default is _REQUIRED:
            self.fail(name, "missing (required)")
        return default

    def integer(self, name: str, default: Any, low: int, high: int | None = None) -> Any:
        """An int field in ``[low, high]`` (``default`` when absent; may be None)."""
        value = self._get(name, default)
        if value is None or name not in self.values:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"must be an integer, got {value!r}")
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            self.fail(name, f"must be {bound}, got {value}")
        return value

    def number(self, name: str, default: float, low: float, high: float | None = None,
               low_open: bool = False) -> float:
        """A finite float field in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
        value = self._get(name, default)
        if name not in self.values:
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value
        ):
            self.fail(name, f"must be a finite number, got {value!r}")
        if (value <= low if low_open else value < low) or (high is not None and value > high):
            left = "(" if low_open else "["
            bound = f"> {low:g}" if high is None and low_open else (
                f">= {low:g}" if high is None else f"in {left}{low:g}, {high:g}]"
            )
            self.fail(name, f"must be {bound}, got {value}")
        return float(value)

    def choice(self, name: str, default: Any, choices: Collection[str]) -> str:
        """A string field among ``choices``."""
        value = self._get(name, default)
        if not isinstance(value, str) or value not in choices:
            self.fail(name, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        """A true/false field."""
        value = self._get(name, default)
        if not isinstance(value, bool):
            self.fail(name, f"must be true or false, got {value!r}")
        return value

    def text(self, name: str, default: Any) -> str:
        """A non-empty string field."""
        value = self._get(name, default)
        if not isinstance(value, str) or not value:
            self.fail(name, f"must be a non-empty string, got {value!r}")
        return value

    def unused(self, names: Collection[str], why: str) -> None:
        """Refuse fields that do not apply to this table (``why`` says why)."""
        for name in names:
            if name in self.values:
                self.fail(name, f"not used {why}")


@dataclass(frozen=True)
class ChainSpec:
    """A validated ``[[chain]]`` table (docs/case-file.md).

    Attributes:
        where: the table, for errors (``chain[0] (id 'x')``).
        case_id: ``id``. vocab_size: V. k: draft length. regime: a key of
            :data:`CHAIN_REGIMES`. concentration: the Dirichlet parameter (Dirichlet regimes,
            else None). temperature: the softmax temperature (``peaked``, ``lm``, else None).
        zero_share: share of tokens zeroed in p (``zeros``). draft_mix: weight w of
            ``q = (1 - w) p + w p'``, p' another draw of the regime. rows: R distinct row
            types. batch_size: rows per verifier call or None. dtype: a key of
            :data:`losslessness.cases.CHAIN_INPUT_DTYPES`. seed: the builder's seed.
    """

    where: str
    case_id: str
    vocab_size: int
    k: int
    regime: str
    concentration: float | None
    temperature: float | None
    zero_share: float
    draft_mix: float
    rows: int
    batch_size: int | None
    dtype: str
    seed: int



@dataclass(frozen=True)
class TreeSpec:
    """A validated ``[[tree]]`` table (docs/case-file.md).

    Attributes:
        where: the table, for errors. case_id: ``id``. parents: the topology (node j+1's
            parent ``parents[j]``). shape: the named shape, or ``"parents"``. scheme: one of
            :data:`losslessness.protocol.DRAFT_SCHEMES`. vocab_size: V. laws: one of
            :data:`TREE_LAWS`. logit_scale, draft_noise: the ``lm`` laws' parameters.
            closeness, zeros: the ``dirichlet`` laws' parameters. batch_size: trees per call.
            dtype: ``float64`` or ``float32``. seed: the builder's seed.
    """

    where: str
    case_id: str
    parents: tuple[int, ...]
    shape: str
    scheme: str
    vocab_size: int
    laws: str
    logit_scale: float
    draft_noise: float
    closeness: float
    zeros: int
    batch_size: int
    dtype: str
    seed: int



@dataclass(frozen=True)
class ServingRowSpec:
    """One validated row kind of a ``[[serving]]`` table.

    Attributes:
        label: what the row exercises. request: its :class:`~losslessness.requests.Request`.
        num_draft_tokens: its drafts, ``0..k``. draft_support: draft laws on this many of
            the largest tokens (histories' prefixes stay few), or None (every token).
    """

    label: str
    request: Request
    num_draft_tokens: int
    draft_support: int | None


@dataclass(frozen=True)
class ServingSpec:
    """A validated ``[[serving]]`` table (docs/case-file.md).

    Attributes:
        where: the table, for errors. case_id: ``id``. vocab_size: V. k: draft length.
        dtype: a key of :data:`losslessness.cases.SERVING_DTYPES`. draft_probs: whether calls
            pass draft probabilities (else fixed drafts, as n-gram drafters). logit_scale: sd
            of the Gaussian logits. copies: rows of each kind per call. profile: the engine
            profile the requests were checked against, or None. max_steps: cap on the rows
            per kind, or None. seed: the builder's seed. rows: the row kinds.
    """

    where: str
    case_id: str
    vocab_size: int
    k: int
    dtype: str
    draft_probs: bool
    logit_scale: float
    copies: int
    profile: str | None
    max_steps: int | None
    seed: int
    rows: tuple[ServingRowSpec, ...]



@dataclass(frozen=True)
class ServingTreeSpec:
    """A validated ``[[serving_tree]]`` table (docs/case-file.md).

    Attributes:
        where: the table, for errors. case_id: ``id``. parents: the topology. shape: the
            named shape, or ``"parents"``. scheme: one of
            :data:`losslessness.protocol.DRAFT_SCHEMES`. vocab_size: V. rows: raw logit rows
            per depth (token x reads row ``x mod rows``). logit_scale: sd of the Gaussian
            logits. batch_size: trees per call. dtype: a key of
            :data:`losslessness.cases.SERVING_TREE_DTYPES`. profile: the profile the request
            was checked against, or None. seed: the builder's seed. label: what the request
            exercises. request: the checked trees' request. companions: the requests of the
            other trees of every call (:attr:`losslessness.cases.ServingTree.companions`).
    """

    where: str
    case_id: str
    parents: tuple[int, ...]
    shape: str
    scheme: str
    vocab_size: int
    rows: int
    logit_scale: float
    batch_size: int
    dtype: str
    profile: str | None
    seed: int
    label: str
    request: Request
    companions: tuple[Request, ...] = ()


@dataclass(frozen=True)
class CaseFile:
    """A read case file: its path and its validated tables, in file order.

    Attributes:
        path: the file, as given. chain, tree, serving, serving_tree: the tables of each
            kind.
    """

    path: str
    chain: tuple[ChainSpec, ...] = ()
    tree: tuple[TreeSpec, ...] = ()
    serving: tuple[ServingSpec, ...] = ()
    serving_tree: tuple[ServingTreeSpec, ...] = ()

    @property
    def specs(self) -> tuple[ChainSpec | TreeSpec | ServingSpec | ServingTreeSpec, ...]:
        """Every table, chain first."""
        return (*self.chain, *self.tree, *self.serving, *self.serving_tree)

    @property
    def case_ids(self) -> tuple[str, ...]:
        """Every case's id."""
        return tuple(spec.case_id for spec in self.specs)

    def chain_cases(self) -> list[ChainCase]:
        """The chain cases, built.

        Raises:
            CaseFileError: a case its builder refuses (rows that do not survive the cast to
                bfloat16, say), naming the table.
        """
        return [self._built(spec, _build_chain) for spec in self.chain]

    def tree_cases(self) -> list[TreeCase]:
        """The tree cases, built (errors as :meth:`chain_cases`)."""
        return [self._built(spec, _build_tree) for spec in self.tree]

    def serving_cases(self) -> list[ServingCase]:
        """The serving cases, built (errors as :meth:`chain_cases`)."""
        return [self._built(spec, _build_serving) for spec in self.serving]

    def serving_tree_cases(self, profile: str, dtype: str | None = None) -> list[TreeCase]:
        """The serving tree cases, built for engine profile ``profile`` (the target's: the
        cases' target laws are its law of their logits), their logits in ``dtype`` (the run's
        ``--dtype``) or each table's own.

        Raises:
            CaseFileError: naming the table, when ``profile`` does not implement its request
                (or the builder refuses the case otherwise).
        """
        return [self.serving_tree_case(spec, profile, dtype) for spec in self.serving_tree]

    def serving_tree_case(
        self, spec: ServingTreeSpec, profile: str, dtype: str | None = None
    ) -> TreeCase:
        """One of :meth:`serving_tree_cases`: ``spec``'s case built for ``profile``.

        Raises:
            CaseFileError: as :meth:`serving_tree_cases`.
        """
        try:
            return _build_serving_tree(spec, profile, dtype or spec.dtype)
        except (ValueError, UnsupportedRequest) as error:
            raise CaseFileError(
                self.path, spec.where, "", f"cannot be built for profile {profile!r}: {error}"
            ) from error

    def _built(self, spec: _Spec, build: Callable[[_Spec], _Case]) -> _Case:
        try:
            return build(spec)
        except ValueError as error:
            raise CaseFileError(self.path, spec.where, "", f"cannot be built: {error}") from error

    def check_reserved(self, reserved: Collection[str]) -> None:
        """Refuse ids that name a battery case or an end-to-end target (``--case`` selects by
        id, so each must name one case).

        Raises:
            CaseFileError: naming the table and ``id``.
        """
        for spec in self.specs:
            if spec.case_id in reserved:
                raise CaseFileError(
                    self.path, spec.where, "id",
                    f"{spec.case_id!r} is already a battery case or end-to-end target; choose "
                    "another id",
                )


def read_case_file(path: str | Path) -> CaseFile:
    """Read and validate a case file (nothing is built: :meth:`CaseFile.chain_cases` and its
    siblings build the cases).

    Args:
        path: the TOML file.

    Returns:
        :class:`CaseFile`.

    Raises:
        CaseFileError: the file cannot be read, is not TOML, has a top-level key other than
            :data:`CASE_FILE_KINDS`, or a table with a missing, unknown, mistyped or
            out-of-range field, a duplicate id, an unknown regime, shape, scheme or profile,
            or a request an engine profile does not implement (each naming the table and the
            field).
    """
    name = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise CaseFileError(name, "", "", f"cannot be read: {error}") from error
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise CaseFileError(name, "", "", f"not valid TOML: {error}") from error
    unknown = sorted(set(data) - set(CASE_FILE_KINDS))
    if unknown:
        raise CaseFileError(
            name, "", unknown[0],
            "unknown table; a case file holds [[chain]], [[tree]], [[serving]] and "
            "[[serving_tree]] tables",
        )
    tables: dict[str, list[Any]] = {}
    for kind in CASE_FILE_KINDS:
        value = data.get(kind, [])
        if not isinstance(value, list):
            raise CaseFileError(name, "", kind, f"must be an array of tables ([[{kind}]])")
        tables[kind] = value
    seen: dict[str, str] = {}
    specs: dict[str, list[Any]] = {kind: [] for kind in CASE_FILE_KINDS}
    readers: dict[
        str, Callable[[str, str, Any], ChainSpec | TreeSpec | ServingSpec | ServingTreeSpec]
    ] = {
        "chain": _chain_spec, "tree": _tree_spec, "serving": _serving_spec,
        "serving_tree": _serving_tree_spec,
    }
    for kind in CASE_FILE_KINDS:
        for index, values in enumerate(tables[kind]):
            where = f"{kind}[{index}]"
            case_id = values.get("id") if isinstance(values, dict) else None
            if isinstance(case_id, str):
                where += f" (id {case_id!r})"
            spec = readers[kind](name, where, values)
            if spec.case_id in seen:
                raise CaseFileError(name, where, "id",
                                    f"duplicate id {spec.case_id!r} (also {seen[spec.case_id]})")
            seen[spec.case_id] = where
            specs[kind].append(spec)
    return CaseFile(name, tuple(specs["chain"]), tuple(specs["tree"]), tuple(specs["serving"]),
                    tuple(specs["serving_tree"]))


def _case_id(table: _Table) -> str:
    case_id = table.text("id", _REQUIRED)
    if not _ID.fullmatch(case_id):
        table.fail("id", f"must be letters, digits and . _ / - (a --case name), got {case_id!r}")
    return case_id


_CHAIN_FIELDS = ("id", "vocab_size", "k", "regime", "concentration", "temperature", "zero_share",
                 "draft_mix", "rows", "batch_size", "dtype", "seed")


def _chain_spec(path: str, where: str, values: Any) -> ChainSpec:
    table = _Table(path, where, values, _CHAIN_FIELDS)
    case_id = _case_id(table)
    regime = table.choice("regime", "dense", CHAIN_REGIMES)
    vocab = table.integer("vocab_size", 16, 2, MAX_VOCAB)
    concentration = temperature = None
    if regime in _CONCENTRATION:
        concentration = table.number("concentration", _CONCENTRATION[regime], 0.0, low_open=True)
    else:
        table.unused(["concentration"], f"by regime {regime!r} (not a Dirichlet regime)")
    if regime in _TEMPERATURE:
        temperature = table.number("temperature", _TEMPERATURE[regime], 0.0, low_open=True)
    else:
        table.unused(["temperature"], f"by regime {regime!r} (only peaked and lm)")
    if regime != "zeros":
        table.unused(["zero_share"], f"by regime {regime!r} (only zeros)")
    if regime in ("disjoint", "p-equals-q"):
        table.unused(["draft_mix"], f"by regime {regime!r} (q is fixed by the regime)")
    return ChainSpec(
        where=where,
        case_id=case_id,
        vocab_size=vocab,
        k=table.integer("k", 2, 1, MAX_K),
        regime=regime,
        concentration=concentration,
        temperature=temperature,
        zero_share=table.number("zero_share", 0.35, 0.0, 0.9),
        draft_mix=table.number("draft_mix", 0.5, 0.0, 1.0),
        rows=table.integer("rows", 1, 1, MAX_ROWS),
        batch_size=table.integer("batch_size", None, 1),
        dtype=table.choice("dtype", "float64", CHAIN_INPUT_DTYPES),
        seed=table.integer("seed", 0, 0),
    )


_TREE_FIELDS = ("id", "shape", "parents", "scheme", "vocab_size", "laws", "logit_scale",
                "draft_noise", "closeness", "zeros", "batch_size", "dtype", "seed")


def _parents(table: _Table) -> tuple[int, ...]:
    value = table.values["parents"]
    if not isinstance(value, list) or not value:
        table.fail("parents", f"must be a non-empty array of node indices, got {value!r}")
    if len(value) > MAX_NODES:
        table.fail("parents", f"must have at most {MAX_NODES} nodes, got {len(value)}")
    for j, parent in enumerate(value):
        if isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent <= j:
            table.fail(f"parents[{j}]", f"node {j + 1}'s parent must be an integer in [0, {j}] "
                       f"(node 0 is the root), got {parent!r}")
    return tuple(value)


def _topology(table: _Table) -> tuple[str, tuple[int, ...]]:
    """``(shape, parents)`` of a tree table: a named ``shape`` or its ``parents``."""
    if table.has("shape") == table.has("parents"):
        table.fail("shape", "give exactly one of shape (a named tree) and parents")
    if table.has("shape"):
        shape = table.choice("shape", _REQUIRED, TREE_SHAPES)
        return shape, TREE_SHAPES[shape]
    return "parents", _parents(table)


def _check_siblings(table: _Table, parents: tuple[int, ...], scheme: str, vocab: int) -> None:
    """Refuse a vocabulary too small for the largest sibling group of distinct drafts."""
    siblings = max(parents.count(node) for node in set(parents))
    if scheme != "iid" and siblings > vocab:
        table.fail("vocab_size", f"{vocab} tokens cannot give {siblings} distinct siblings "
                   f"({scheme} drafts)")


def _tree_spec(path: str, where: str, values: Any) -> TreeSpec:
    table = _Table(path, where, values, _TREE_FIELDS)
    case_id = _case_id(table)
    shape, parents = _topology(table)
    scheme = table.choice("scheme", "iid", DRAFT_SCHEMES)
    laws = table.choice("laws", "lm", TREE_LAWS)
    high = MAX_DIRICHLET_TREE_VOCAB if laws == "dirichlet" else MAX_VOCAB
    vocab = table.integer("vocab_size", 16, 2, high)
    _check_siblings(table, parents, scheme, vocab)
    if laws == "lm":
        table.unused(["closeness", "zeros"], "by laws = 'lm' (only dirichlet)")
    else:
        table.unused(["logit_scale", "draft_noise"], "by laws = 'dirichlet' (only lm)")
    default_batch = trees_per_call(parents, vocab)
    if table.values.get("dtype") == "bfloat16":
        table.fail("dtype", "bfloat16 is not taken by tree cases (a bfloat16 row misses the "
                   "tree protocol's row-sum tolerance of 1e-5); use float32 or float64")
    return TreeSpec(
        where=where,
        case_id=case_id,
        parents=parents,
        shape=shape,
        scheme=scheme,
        vocab_size=vocab,
        laws=laws,
        logit_scale=table.number("logit_scale", LM_LOGIT_SCALE, 0.0, low_open=True),
        draft_noise=table.number("draft_noise", LM_DRAFT_NOISE, 0.0),
        closeness=table.number("closeness", 0.6, 0.0, 1.0),
        zeros=table.integer("zeros", 0, 0, vocab - 1),
        batch_size=table.integer("batch_size", default_batch, 1),
        dtype=table.choice("dtype", "float64", ("float64", "float32")),
        seed=table.integer("seed", 0, 0),
    )


_SERVING_FIELDS = ("id", "vocab_size", "k", "dtype", "draft_probs", "logit_scale", "copies",
                   "profile", "max_steps", "seed", "rows")
_ROW_FIELDS = ("label", "num_draft_tokens", "draft_support", *_REQUEST_FIELDS)


def _serving_spec(path: str, where: str, values: Any) -> ServingSpec:
    table = _Table(path, where, values, _SERVING_FIELDS)
    case_id = _case_id(table)
    vocab = table.integer("vocab_size", 16, 2, MAX_VOCAB)
    k = table.integer("k", 3, 1, MAX_K)
    draft_probs = table.boolean("draft_probs", True)
    profile = table.choice("profile", None, PROFILES) if table.has("profile") else None
    raw_rows = table._get("rows", _REQUIRED)
    if not isinstance(raw_rows, list) or not raw_rows:
        table.fail("rows", "must be a non-empty array of tables ([[serving.rows]])")
    if len(raw_rows) > MAX_ROWS:
        table.fail("rows", f"must have at most {MAX_ROWS} row kinds, got {len(raw_rows)}")
    rows = tuple(
        _serving_row(path, where, f"rows[{index}].", row, vocab, k, draft_probs, profile)
        for index, row in enumerate(raw_rows)
    )
    return ServingSpec(
        where=where,
        case_id=case_id,
        vocab_size=vocab,
        k=k,
        dtype=table.choice("dtype", "float32", SERVING_DTYPES),
        draft_probs=draft_probs,
        logit_scale=table.number("logit_scale", 1.5, 0.0, low_open=True),
        copies=table.integer("copies", 1, 1, 1024),
        profile=profile,
        max_steps=table.integer("max_steps", None, 1),
        seed=table.integer("seed", 0, 0),
        rows=rows,
    )


def _serving_row(path: str, where: str, prefix: str, values: Any, vocab: int, k: int,
                 draft_probs: bool, profile: str | None) -> ServingRowSpec:
    table = _Table(path, where, values, _ROW_FIELDS, prefix)
    request = _request(table, vocab, profile)
    if draft_probs:
        support = table.integer("draft_support", None, 1, vocab)
    else:
        table.unused(["draft_support"], "without draft probabilities (draft_probs = false)")
        support = None
    return ServingRowSpec(
        label=table.text("label", _label(request)),
        request=request,
        num_draft_tokens=table.integer("num_draft_tokens", k, 0, k),
        draft_support=support,
    )


def _request(table: _Table, vocab: int, profile: str | None) -> Request:
    """The :class:`~losslessness.requests.Request` of ``table``'s request fields, checked
    against the vocabulary and, when given, ``profile``."""
    fields = {name: table.values[name] for name in _REQUEST_FIELDS if table.has(name)}
    for name, value in fields.items():
        if isinstance(value, list):
            fields[name] = tuple(value)
    if isinstance(fields.get("logit_bias"), Mapping):
        bias = {}
        for token, value in fields["logit_bias"].items():
            if not token.isdigit():
                table.fail("logit_bias", f"keys must be token ids, got {token!r}")
            bias[int(token)] = value
        fields["logit_bias"] = bias
    elif "logit_bias" in fields:
        table.fail("logit_bias", 'must be a table of token id = bias ({ "3" = 2.5 })')
    try:
        request = Request(**fields)
        request.check_vocabulary(vocab)
    except (ValueError, TypeError) as error:
        # The message starts with the field it names (``top_p=1.5 must lie in (0, 1]``).
        field = str(error).split("=")[0].split(" ")[0].split("[")[0]
        table.fail(field if field in _REQUEST_FIELDS else "request", str(error))
    if profile is not None:
        try:
            get_profile(profile).law(torch.zeros(vocab, dtype=torch.float64), request,
                                     request.output_token_ids)
        except UnsupportedRequest as error:
            table.fail("request", f"profile {profile!r} does not implement it: {error}")
    return request


_SERVING_TREE_FIELDS = ("id", "shape", "parents", "scheme", "vocab_size", "rows", "logit_scale",
                        "batch_size", "dtype", "profile", "seed", "label", "request",
                        "companions")

MAX_COMPANIONS = 7
"""Most companion requests of a serving tree case (each multiplies the trees per call)."""


def _serving_tree_spec(path: str, where: str, values: Any) -> ServingTreeSpec:
    table = _Table(path, where, values, _SERVING_TREE_FIELDS)
    case_id = _case_id(table)
    shape, parents = _topology(table)
    scheme = table.choice("scheme", "iid", DRAFT_SCHEMES)
    vocab = table.integer("vocab_size", 16, 2, MAX_VOCAB)
    _check_siblings(table, parents, scheme, vocab)
    rows = table.integer("rows", min(vocab, 2), 1, min(vocab, MAX_SERVING_TREE_ROWS))
    profile = table.choice("profile", None, PROFILES) if table.has("profile") else None
    raw = table._get("request", {})
    request = _request(_Table(path, where, raw, _REQUEST_FIELDS, "request."), vocab, profile)
    if reads_path_tokens(request):
        table.fail("request", "penalties read the tokens on a node's path, and the tree checks "
                   "pool nodes by depth and token: use a [[serving]] case for penalties")
    raw_companions = table._get("companions", [])
    if not isinstance(raw_companions, list) or len(raw_companions) > MAX_COMPANIONS:
        table.fail("companions", f"must be an array of at most {MAX_COMPANIONS} request tables "
                   f"([{{ temperature = 0.0 }}, ...]), got {raw_companions!r}")
    companions = tuple(
        _request(_Table(path, where, raw, _REQUEST_FIELDS, f"companions[{index}]."), vocab,
                 profile)
        for index, raw in enumerate(raw_companions)
    )
    default_batch = trees_per_call(parents, vocab)
    return ServingTreeSpec(
        where=where,
        case_id=case_id,
        parents=parents,
        shape=shape,
        scheme=scheme,
        vocab_size=vocab,
        rows=rows,
        logit_scale=table.number("logit_scale", 1.5, 0.0, low_open=True),
        batch_size=table.integer("batch_size", default_batch, 1),
        dtype=table.choice("dtype", "float32", SERVING_TREE_DTYPES),
        profile=profile,
        seed=table.integer("seed", 0, 0),
        label=table.text("label", _label(request)),
        request=request,
        companions=companions,
    )


def _label(request: Request) -> str:
    """The request's fields that differ from the defaults (``temperature=0.7, top_k=5``)."""
    default = Request()
    changed = [
        f"{name}={getattr(request, name)}"
        for name in _REQUEST_FIELDS
        if getattr(request, name) != getattr(default, name)
    ]
    return ", ".join(changed) or "temperature=1.0"


def _chain_rows(rng: np.random.Generator, spec: ChainSpec, count: int) -> np.ndarray:
    """``[count, V]`` float64 rows of the spec's regime (unnormalised where zeros are set)."""
    vocab = spec.vocab_size
    if spec.concentration is not None:
        rows = dirichlet_rows(rng, count, vocab, spec.concentration)
        if spec.regime == "zeros":
            rows[rng.random(rows.shape) < spec.zero_share] = 0.0
            # Never an all-zero row (as the battery's v64-zeros).
            rows[np.arange(count), rng.integers(vocab, size=count)] += 0.05
        return rows
    if spec.temperature is not None:
        temperature = spec.temperature
        return np.stack([softmax(rng.standard_normal(vocab) / temperature) for _ in range(count)])
    if spec.regime == "one-hot":
        eye: np.ndarray = np.eye(vocab)[rng.integers(vocab, size=count)]
        return eye
    rows = dirichlet_rows(rng, count, vocab, 1.0)
    if spec.regime == "disjoint":
        rows[:, vocab // 2:] = 0.0
    return rows


@functools.cache
def _build_chain(spec: ChainSpec) -> ChainCase:
    rng = np.random.default_rng(spec.seed)
    vocab = spec.vocab_size
    target, draft = [], []
    for _ in range(spec.rows):
        p = _chain_rows(rng, spec, spec.k + 1)
        p = p / p.sum(axis=-1, keepdims=True)
        if spec.regime == "disjoint":
            q = dirichlet_rows(rng, spec.k, vocab, 1.0)
            q[:, : vocab // 2] = 0.0
        elif spec.regime == "p-equals-q":
            q = p[: spec.k].copy()
        else:
            other = (
                dirichlet_rows(rng, spec.k, vocab, 1.0) if spec.regime == "one-hot"
                else _chain_rows(rng, spec, spec.k)
            )
            other = other / other.sum(axis=-1, keepdims=True)
            q = mix(p[: spec.k], other, spec.draft_mix)
        target.append(list(p))
        draft.append(list(q))
    knob = (
        f"Dirichlet({spec.concentration:g})" if spec.concentration is not None
        else f"temperature {spec.temperature:.3g}" if spec.temperature is not None else ""
    )
    mixed = "" if spec.regime in ("disjoint", "p-equals-q") else f", q mix {spec.draft_mix:g}"
    regime = f"{spec.regime} {knob}".strip() + mixed + " (case file)"
    return chain_case(spec.case_id, regime, target, draft, {"case-file", spec.regime},
                      spec.batch_size, spec.dtype)


@functools.cache
def _build_tree(spec: TreeSpec) -> TreeCase:
    rng = np.random.default_rng(spec.seed)
    vocab, depth = spec.vocab_size, tree_depth(spec.parents)
    token_rows = None
    if spec.laws == "lm":
        rows = max(1, min(vocab, TABLE_CELLS // vocab))
        root_p, root_q, target, draft = softmax_markov_tables(
            rng, vocab, depth, spec.logit_scale, spec.draft_noise, rows
        )
        token_rows = torch.arange(vocab, dtype=torch.int64) % rows
        laws = f"softmax of random logits x {spec.logit_scale:g} ({rows} table rows per depth)"
    else:
        root_p, root_q, target, draft = markov_tables(rng, vocab, depth, spec.closeness,
                                                      spec.zeros)
        laws = f"Dirichlet, q closeness {spec.closeness:g}" + (
            f", {spec.zeros} zero-mass tokens per p row" if spec.zeros else ""
        )
    case = TreeCase(
        spec.case_id,
        f"{spec.shape} N={len(spec.parents)} V={vocab} {spec.scheme}, {laws}, "
        f"{spec.batch_size} trees per call (case file)",
        spec.parents, root_p, root_q, target, draft, spec.scheme, spec.batch_size,
        frozenset({"case-file", spec.shape, spec.scheme}), token_rows,
    )
    if spec.dtype == "float32":
        # The rounded case keeps the file's id (tree_case_in_dtype suffixes the battery's).
        case = dataclasses.replace(tree_case_in_dtype(case, torch.float32), case_id=spec.case_id)
    return case


@functools.cache
def _build_serving(spec: ServingSpec) -> ServingCase:
    draws = ServingDraws(spec.seed)
    rows: list[ServingRow] = []
    for row in spec.rows:
        if spec.draft_probs:
            rows.append(draws.row(row.label, row.request, row.num_draft_tokens,
                                  row.draft_support, spec.vocab_size, spec.k, spec.logit_scale))
        else:
            rows.append(draws.fixed_row(row.label, row.request, row.num_draft_tokens,
                                        spec.vocab_size, spec.k, spec.logit_scale))
    drafts = "" if spec.draft_probs else ", no draft probabilities"
    summary = (f"V={spec.vocab_size} k={spec.k} {spec.dtype}, {len(rows)} row kinds x "
               f"{spec.copies}{drafts} (case file)")
    return ServingCase(spec.case_id, summary, tuple(rows), spec.copies, spec.dtype,
                       spec.max_steps)


@functools.cache
def _build_serving_tree(spec: ServingTreeSpec, profile: str, dtype: str) -> TreeCase:
    generator = torch.Generator().manual_seed(spec.seed)
    root, table, root_q, table_q = serving_tree_tables(
        generator, tree_depth(spec.parents), spec.rows, spec.vocab_size, spec.logit_scale
    )
    return serving_tree_case(
        spec.case_id,
        f"{spec.label}; {spec.shape} N={len(spec.parents)} V={spec.vocab_size} ({spec.rows} "
        f"table rows) {spec.scheme}, {spec.batch_size} trees per call (case file)",
        spec.parents, spec.scheme, root, table, root_q, table_q, spec.request, profile, dtype,
        batch_size=spec.batch_size,
        token_rows=torch.arange(spec.vocab_size, dtype=torch.int64) % spec.rows,
        tags=frozenset({"case-file", spec.shape, spec.scheme}),
        companions=spec.companions,
    )
