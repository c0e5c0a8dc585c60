"""The reference tree verifier on CPU: the compiled kernel and its fused value checks.

On CPU, :func:`losslessness.reference.tree.verify_tree` walks every row's tree in
``losslessness.reference.tree_kernel.verify_tree_rows``; float32/float64 inputs with int64
parents and ids are *screened* (the protocol's structure checks first, the ``O(B N V)`` value
checks on the kernel's way). Pinned here, all exact:

- **Same outputs**: the screened call equals the validated call (int32 parents and ids), the
  thread split, and expanded (stride-0) inputs, for the three draft schemes; and it agrees
  with the accelerators' torch implementation (run here on CPU) on random rows, as two
  roundings of one rule must away from decision boundaries.
- **Same errors**: every malformed value (NaN, negative mass, a row sum off, a draft on a zero
  of q, repeated siblings under ``without-replacement``, a ``top-k`` child beaten by an
  unexpanded token), in the first or the second thread's rows, raises exactly the validator's
  ``InvalidInputError`` and leaves the generator as it found it; values the validator allows
  (the draft rows of leaves need not sum to 1; repeated iid siblings) pass.

The law itself is pinned statistically against the exact laws by ``test_tree.py`` and
``test_tree_laws.py``, whose samples take this path.
"""

from __future__ import annotations

import pytest
import torch

import losslessness.reference.tree as tree
from losslessness.protocol import (
    DRAFT_SCHEMES,
    InvalidInputError,
    sample_siblings,
    validate_tree_inputs,
)
from losslessness.reference.tree import verify_tree
from tests.reference.tree_helpers import dirichlet

SEED = 20261125
"""Root of every random tensor in this file."""

PARENTS = (0, 0, 1, 1, 2, 0, 5)
"""Seven nodes: a root with three children, two grandchildren under node 1, chains below."""


def _inputs(
    batch: int, vocab: int, scheme: str, seed: int, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct rows: p and q ``[B, N+1, V]`` (Dirichlet(0.5), so with tiny entries), parents
    ``[B, N]`` and ids drafted per row under ``scheme``."""
    generator = torch.Generator().manual_seed(seed)
    nodes = len(PARENTS)
    p = dirichlet((batch, nodes + 1, vocab), generator, 0.5)
    q = dirichlet((batch, nodes + 1, vocab), generator, 0.5)
    ids = torch.zeros((batch, nodes), dtype=torch.int64)
    for parent in range(nodes + 1):
        children = [j for j, node in enumerate(PARENTS) if node == parent]
        if children:
            ids[:, children] = sample_siblings(q[:, parent], len(children), scheme, generator)
    parents = torch.tensor(PARENTS, dtype=torch.int64).expand(batch, -1).contiguous()
    return p.to(dtype), q.to(dtype), parents, ids


def _equal(a: object, b: object) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[call-overload]


@pytest.mark.parametrize("scheme", DRAFT_SCHEMES)
@pytest.mark.parametrize("threads_used", [1, 2], ids=["one-thread", "two-threads"])
def test_screened_tree_call_equals_validated_expanded_and_split_calls(
    request: pytest.FixtureRequest, scheme: str, threads_used: int
) -> None:
    """Exact, same generator seed: the screened call equals the validated one (int32 parents
    and ids), on one thread or split over two; expanded inputs (one row's p and q for the
    whole batch, not materialised) equal their materialised copy."""
    if threads_used == 2:
        request.getfixturevalue("two_threads")
    p, q, parents, ids = _inputs(53, 12, scheme, SEED)
    assert tree._screenable(p, q, parents, ids, torch.Generator())
    screened = verify_tree(p, q, parents, ids, scheme, torch.Generator().manual_seed(SEED))
    validated = verify_tree(
        p, q, parents.int(), ids.int(), scheme, torch.Generator().manual_seed(SEED)
    )
    assert _equal(screened, validated)
    shared = (p[:1].expand(53, -1, -1), q[:1].expand(53, -1, -1), parents, ids[:1].expand(53, -1))
    assert _equal(
        verify_tree(*shared, scheme, torch.Generator().manual_seed(SEED + 1)),
        verify_tree(
            *(t.contiguous() for t in shared), scheme, torch.Generator().manual_seed(SEED + 1)
        ),
    )


@pytest.mark.parametrize("scheme", DRAFT_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_tree_kernel_agrees_with_the_accelerators_torch_arithmetic(
    scheme: str, dtype: torch.dtype
) -> None:
    """The two implementations of the rule (compiled on CPU, torch ops on accelerators, here
    on CPU) emit the same tokens and accepted nodes on 3,000 random rows per scheme, with the
    same uniforms: they differ in rounding only. A divergence beyond rounding fails this."""
    p, q, parents, ids = _inputs(3000, 16, scheme, SEED + 2, dtype)
    generator = torch.Generator().manual_seed(SEED + 3)
    accept = torch.rand(ids.shape, generator=generator, dtype=torch.float64)
    sample = torch.rand((3000,), generator=generator, dtype=torch.float64)
    kernel, _ = tree._kernel_tree(p, q, parents, ids, scheme, accept, sample)
    torch_path = tree._verify_tree_validated(
        p.double(), q.double(), parents, ids, scheme, accept, sample
    )
    assert _equal(kernel, torch_path)


def _corrupt(name: str, p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor, row: int) -> str:
    """Make one value of batch row ``row`` malformed in place; return the scheme to use."""
    if name == "nan-target":
        p[row, 3, 2] = float("nan")
    elif name == "negative-draft":
        q[row, 0, 1] -= 0.25
        q[row, 0, 2] += 0.25
    elif name == "tiny-negative-target":
        p[row, 7, 0] = -1e-300
    elif name == "row-sum-draft":
        q[row, 1] *= 1.001
    elif name == "inf-leaf-draft":
        q[row, 4, 0] = float("inf")
    elif name == "draft-on-zero":
        token = int(ids[row, 0])
        q[row, 0, (token + 1) % q.shape[-1]] += q[row, 0, token]
        q[row, 0, token] = 0.0
    elif name == "repeated-siblings":
        ids[row, 1] = ids[row, 0]
        return "without-replacement"
    elif name == "top-k-beaten":
        unexpanded = [t for t in range(q.shape[-1]) if t not in ids[row, [0, 1, 5]].tolist()]
        q[row, 0, unexpanded[0]], q[row, 0, int(ids[row, 0])] = (
            q[row, 0, int(ids[row, 0])] + 0.5, q[row, 0, unexpanded[0]] + 0.0
        )
        q[row, 0] /= q[row, 0].sum()
        return "top-k"
    else:
        raise AssertionError(name)
    return "iid"


CORRUPTIONS = [
    "nan-target",
    "negative-draft",
    "tiny-negative-target",
    "row-sum-draft",
    "inf-leaf-draft",
    "draft-on-zero",
    "repeated-siblings",
    "top-k-beaten",
]


@pytest.mark.parametrize("row", [0, 40], ids=["first-thread", "second-thread"])
@pytest.mark.parametrize("name", CORRUPTIONS)
@pytest.mark.usefixtures("two_threads")
def test_malformed_tree_values_raise_the_validators_own_error_and_leave_the_generator_alone(
    name: str, row: int
) -> None:
    """Exact: a malformed value in either thread's rows makes the screened call raise the very
    ``InvalidInputError`` of ``validate_tree_inputs`` (argument and message), with the
    generator's state unchanged."""
    scheme = "top-k" if name == "top-k-beaten" else "iid"
    p, q, parents, ids = _inputs(53, 12, scheme, SEED + 4)
    scheme = _corrupt(name, p, q, ids, row)
    with pytest.raises(InvalidInputError) as expected:
        validate_tree_inputs(p, q, parents, ids, scheme)
    generator = torch.Generator().manual_seed(SEED)
    state = generator.get_state()
    with pytest.raises(InvalidInputError) as got:
        verify_tree(p, q, parents, ids, scheme, generator)
    assert (got.value.argument, str(got.value)) == (expected.value.argument, str(expected.value))
    assert torch.equal(generator.get_state(), state)


def test_values_the_validator_allows_pass_the_screened_call() -> None:
    """Exact: a leaf's draft row that does not sum to 1 and repeated iid siblings are valid
    for the validator, and the screened call accepts them too."""
    p, q, parents, ids = _inputs(40, 12, "iid", SEED + 5)
    q[:, 4] *= 0.5
    ids[:, 1] = ids[:, 0]
    validate_tree_inputs(p, q, parents, ids, "iid")
    output = verify_tree(p, q, parents, ids, "iid", torch.Generator().manual_seed(SEED))
    assert output.tokens.shape == (40, 4)
