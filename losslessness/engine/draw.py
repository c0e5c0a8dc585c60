"""Drawing samples from targets: the run draws the drafts d ~ q, the target verifies; every call
of a target goes through :func:`call_target`, which bounds its time.

This is the only place of the engine that calls a target's verifier or generator (the device
checks' candidates excepted, :mod:`losslessness.engine.device`). The errors a call raises
(:class:`ProtocolViolation`, :class:`TargetTimeout`, :class:`TargetCrashed`,
:class:`TargetRaised`) are defined with the worker process (:mod:`losslessness.worker`), which
raises them too.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from losslessness.cases import ChainCase, GreedyCase, GreedyTreeCase, TreeCase
from losslessness.checks.sequence_law import sequence_seed
from losslessness.protocol import (
    ChainVerifier,
    EndToEndGenerator,
    GeneratesBatches,
    GreedyTreeVerifier,
    GreedyVerifier,
    InvalidInputError,
    ServingTreeVerifier,
    TreeOutput,
    TreeVerifier,
    tree_depths,
)
from losslessness.reference.sampling import sample_inverse_cdf
from losslessness.samples import ChainSamples, TreeSamples
from losslessness.seeding import derive_seed
from losslessness.worker import ProtocolViolation as ProtocolViolation
from losslessness.worker import RemoteCallable
from losslessness.worker import TargetCrashed as TargetCrashed
from losslessness.worker import TargetRaised as TargetRaised
from losslessness.worker import TargetTimeout as TargetTimeout

BATCH_ELEMENT_BUDGET = 1 << 22
"""Upper bound on ``B * (2k+1) * V`` per verifier call (32 MiB of float64 inputs), so that a
call's inputs stay small whatever V is, while small-V cases still get batches of thousands."""


_T = TypeVar("_T")


def _timeout_message(function: Callable[..., Any], timeout_s: float) -> str:
    name = getattr(function, "__qualname__", type(function).__name__)
    return (
        f"the call of {name} did not return within {timeout_s:g} s (--timeout); the target is "
        "taken as hung"
    )


def call_target(function: Callable[..., _T], *args: Any, timeout_s: float | None) -> _T:
    """``function(*args)``, given at most ``timeout_s`` seconds.

    A target in a worker process (a :class:`~losslessness.worker.RemoteCallable`) is called
    there: past ``timeout_s`` the worker is killed and the next call starts a fresh one
    (:meth:`losslessness.worker.TargetWorker.call`). In the main thread the call runs there,
    under a ``SIGALRM`` interval timer whose handler raises :class:`TargetTimeout` (the call
    keeps the thread's torch and OpenMP state: calling from a fresh thread made small-op
    targets such as transformers' about twice as slow). The
    timer interrupts Python code and interruptible waits (``time.sleep``, I/O); a hang inside
    one C call is interrupted when that call returns. Outside the main thread (signals cannot
    be used there) the call runs in a daemon thread that the run stops waiting for.

    Args:
        function: a target's verifier or generator method.
        args: its arguments.
        timeout_s: seconds to wait; None waits for ever.

    Returns:
        What ``function`` returned.

    Raises:
        TargetTimeout: the call did not return within ``timeout_s``.
        TargetCrashed: the worker process of an isolated target exited or died in the call.
        ProtocolViolation: an isolated target wrote into its input tensors.
        Exception: whatever ``function`` raised, unchanged (an isolated target's exceptions
            as :class:`~losslessness.worker.TargetRaised`, but for the protocol's own).
    """
    if isinstance(function, RemoteCallable):
        value: _T = function.call(args, timeout_s)
        return value
    if timeout_s is None:
        return function(*args)
    if threading.current_thread() is threading.main_thread():

        def expire(signum: int, frame: object) -> None:
            raise TargetTimeout(_timeout_message(function, timeout_s))

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return function(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as error:
            outcome["error"] = error

    worker = threading.Thread(target=run, name="losslessness-target-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TargetTimeout(_timeout_message(function, timeout_s))
    if "error" in outcome:
        raise outcome["error"]
    returned: _T = outcome["value"]
    return returned


def rows_per_call(case: ChainCase) -> int:
    """How many copies of each row type one verifier call carries: as many as
    :data:`BATCH_ELEMENT_BUDGET` allows, or ``B // R`` (at least 1) for a case with a
    ``call_batch_size`` B (the independence check pairs copies of one call)."""
    if case.call_batch_size is not None:
        return max(1, case.call_batch_size // case.n_rows)
    return _budget_steps(case)


def _budget_steps(case: ChainCase) -> int:
    """Steps (copies of every row type) whose inputs fit :data:`BATCH_ELEMENT_BUDGET`."""
    per_row = case.n_rows * (2 * case.k + 1) * case.vocab_size
    return max(1, BATCH_ELEMENT_BUDGET // per_row)


def steps_per_group(case: ChainCase) -> int:
    """The steps of every row type one :meth:`ChainSampler.step` makes at most.

    Without a ``call_batch_size`` a group is one call (:func:`rows_per_call`). With one, B,
    a group is whole calls of B rows: a multiple of ``B / gcd(B, R)`` steps (then its ``m R``
    rows are exactly ``m R / B`` calls), as many as :data:`BATCH_ELEMENT_BUDGET` allows, so that
    the sequential monitor still looks at the samples every few thousand steps at B = 1.
    """
    budget = _budget_steps(case)
    if case.call_batch_size is None:
        return budget
    unit = _group_unit(case)
    return max(unit, budget // unit * unit)


def _group_unit(case: ChainCase) -> int:
    """Fewest steps whose rows fill whole calls of ``call_batch_size`` rows (1 without one)."""
    if case.call_batch_size is None:
        return 1
    return case.call_batch_size // math.gcd(case.call_batch_size, case.n_rows)


def coerce_output(value: object, batch: int, k: int) -> np.ndarray:
    """Turn a verifier's return value into a ``[batch, k+1]`` int64 array.

    Raises:
        ProtocolViolation: not array-like, wrong shape, or not integer.
    """
    try:
        array = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value)
    except Exception as error:
        raise ProtocolViolation(f"output is not array-like: {error}") from error
    if array.shape != (batch, k + 1):
        raise ProtocolViolation(
            f"output has shape {array.shape}, expected [B, k+1] = {(batch, k + 1)}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise ProtocolViolation(f"output dtype is {array.dtype}, expected int64 token ids")
    return array.astype(np.int64, copy=False)


def _draw_drafts(case: ChainCase, m: int, generator: torch.Generator) -> torch.Tensor:
    """``[m * R, k]`` int64 drafts d_i ~ q_i for ``m`` copies of every row type, interleaved
    (row ``b`` has type ``b % R``): one shared cumulative table per (row type, position), from
    the q the verifier receives (``ChainCase.law_draft_probs``)."""
    rows, k = case.n_rows, case.k
    uniforms = torch.rand((rows, k, m), generator=generator, dtype=torch.float64)
    draft_ids = torch.empty((m, rows, k), dtype=torch.int64)
    draft_law = case.law_draft_probs
    for r in range(rows):
        for i in range(k):
            draft_ids[:, r, i] = sample_inverse_cdf(draft_law[r, i], uniforms[r, i])
    return draft_ids.reshape(m * rows, k)


def _inputs_intact(case: ChainCase, target: torch.Tensor, draft: torch.Tensor) -> bool:
    """Whether the reused input buffers still hold ``m`` copies of the case's rows."""
    m = target.shape[0] // case.n_rows
    expected_target, expected_draft = case.input_target_probs, case.input_draft_probs
    return torch.equal(
        target.view(m, *expected_target.shape), expected_target.expand(m, -1, -1, -1)
    ) and torch.equal(
        draft.view(m, *expected_draft.shape), expected_draft.expand(m, -1, -1, -1)
    )


FIRST_CALL_STEPS = 32
"""Copies of each row type in the first call of a sequential (ramped) case; each later call
doubles it up to :func:`rows_per_call`, so a case can stop after a few hundred steps and a
fast target still reaches full-size calls after a handful."""


def call_schedule(case: ChainCase, n_steps: int, ramp: bool) -> list[int]:
    """Steps of every row type each :meth:`ChainSampler.step` carries: one verifier call each,
    or, for a case with a ``call_batch_size``, whole calls of that many rows each
    (:func:`steps_per_group`).

    Args:
        case: the case (its :func:`steps_per_group` caps a step).
        n_steps: steps per row type, >= 0.
        ramp: start at :data:`FIRST_CALL_STEPS` (rounded up to whole calls) and double
            (sequential runs), else every step full-size.

    Returns:
        Sizes summing to ``n_steps``; the schedule decides the samples, so a replay uses
        the same one.
    """
    chunk = steps_per_group(case)
    unit = _group_unit(case)
    sizes: list[int] = []
    size = min(-(-FIRST_CALL_STEPS // unit) * unit, chunk) if ramp else chunk
    done = 0
    while done < n_steps:
        m = min(size, n_steps - done)
        sizes.append(m)
        done += m
        size = min(2 * size, chunk)
    return sizes


def pairs_within_group(start: int, m: int, rows: int, call_rows: int | None) -> np.ndarray:
    """The independence pairs of one group of steps ``start .. start + m - 1``: global steps
    ``(2j, 2j+1)`` both inside it whose rows of every type were in one verifier call.

    Args:
        start: the group's first step. m: its steps.
        rows: R, the case's row types (the group's rows are ``m R``, type ``b % R``).
        call_rows: rows per call (the group cut into calls from its first row), or None (the
            group is one call).

    Returns:
        ``[P, 2]`` int64 step indices within the group.
    """
    first = start + (start % 2)
    local = np.arange(first, start + m - 1, 2, dtype=np.int64) - start
    if call_rows is not None:
        local = local[(local * rows) // call_rows == ((local + 2) * rows - 1) // call_rows]
    return np.stack([local, local + 1], axis=1)


def paired_steps_of_calls(
    sizes: Sequence[int], rows: int = 1, call_rows: int | None = None
) -> np.ndarray:
    """The step pairs ``(2m, 2m+1)`` that one verifier call carried together, for groups of
    ``sizes`` steps laid out one after the other (a pair straddling two calls is dropped).

    Args:
        sizes: steps of each group (:func:`call_schedule`).
        rows: R, the case's row types.
        call_rows: rows per verifier call within a group (None: a group is one call).

    Returns:
        ``[P, 2]`` int64 step indices.
    """
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    if call_rows is not None:
        starts_of = np.concatenate([[0], ends[:-1]]) if ends.size else ends
        found = [
            pairs_within_group(int(begin), int(size), rows, call_rows) + int(begin)
            for begin, size in zip(starts_of, sizes, strict=True)
        ]
        return np.concatenate(found).astype(np.int64) if found else np.zeros((0, 2), np.int64)
    n_steps = int(ends[-1]) if ends.size else 0
    starts = np.arange(0, max(n_steps - 1, 0), 2)
    call = np.searchsorted(ends, starts, side="right")
    same = call == np.searchsorted(ends, starts + 1, side="right")
    starts = starts[same]
    return np.stack([starts, starts + 1], axis=1).astype(np.int64)


class ChainSampler:
    """Draws one chain case's steps call by call, so that the run can look at the samples
    between calls (sequential tests), interleave cases and stop early.

    Each call carries every row type, interleaved (row ``b`` has type ``b % R``), with fresh
    drafts d_i ~ q_i drawn by inverse CDF from a generator seeded with ``seed``; the verifier
    gets its own generator seeded from ``seed`` too. The ``target_probs`` and ``draft_probs``
    a call gets are contiguous (kernels that assume a dense layout read them correctly) and
    built once per case: every call gets a view of the same buffers, so the audit adds no
    ``O(B k V)`` work per call to the verifier's own (``fresh_inputs`` gives every call its
    own copy instead, for verifiers found writing into their inputs).

    Args:
        verifier: a chain verifier (the protocol of :mod:`losslessness.protocol`).
        case: the case to sample.
        n_steps: verification steps per row type (>= 1).
        seed: replays the drafts and the verifier's randomness exactly (with the same
            schedule).
        timeout_s: seconds each call may take (None: no limit).
        ramp: the call schedule of :func:`call_schedule`.
        fresh_inputs: a fresh copy of p and q for every call.

    Raises:
        ValueError: ``n_steps`` < 1.
    """

    def __init__(
        self,
        verifier: ChainVerifier,
        case: ChainCase,
        n_steps: int,
        seed: int,
        timeout_s: float | None = None,
        ramp: bool = False,
        fresh_inputs: bool = False,
    ) -> None:
        if n_steps < 1:
            raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
        self.verifier, self.case, self.seed = verifier, case, seed
        self.timeout_s, self.fresh_inputs, self.ramp = timeout_s, fresh_inputs, ramp
        self.schedule = call_schedule(case, n_steps, ramp)
        self.draft_generator = torch.Generator().manual_seed(seed)
        self.verifier_generator = torch.Generator().manual_seed(derive_seed(seed, "verifier"))
        rows, k = case.n_rows, case.k
        self.outputs = np.empty((rows, n_steps, k + 1), dtype=np.int64)
        self.drafts = np.empty((rows, n_steps, k), dtype=np.int64)
        # With a call batch size B, a call starting at row type r reads rows r .. r + B - 1 of
        # the buffer, so it holds ceil((B + R - 1) / R) copies; else the largest call's.
        copies = (
            max(self.schedule)
            if case.call_batch_size is None
            else -(-(case.call_batch_size + rows - 1) // rows)
        )
        self.target_buffer = case.input_target_probs.repeat(copies, 1, 1)
        self.draft_buffer = case.input_draft_probs.repeat(copies, 1, 1)
        self.done = 0
        self.groups = 0
        self.calls = 0
        self.verifier_time_s = 0.0
        self.wall_time_s = 0.0

    @property
    def finished(self) -> bool:
        """Every scheduled group of calls was made."""
        return self.groups == len(self.schedule)

    def step(self) -> tuple[int, int]:
        """Make the next call (the next group of calls of ``call_batch_size`` rows for a case
        that has one).

        Returns:
            ``(start, m)``: the call's steps are ``start .. start + m - 1`` of every row type
            (``outputs[:, start:start + m]``).

        Raises:
            ProtocolViolation: the verifier returned a malformed output.
            TargetTimeout: the call took longer than ``timeout_s``.
            Exception: whatever the verifier raised, unchanged.
        """
        began_wall = time.perf_counter()
        case, rows, k = self.case, self.case.n_rows, self.case.k
        m = self.schedule[self.groups]
        batch = m * rows
        draft_ids = _draw_drafts(case, m, self.draft_generator)
        call_rows = batch if case.call_batch_size is None else case.call_batch_size
        outputs = []
        for first in range(0, batch, call_rows):
            size = min(call_rows, batch - first)
            # The group starts at row type 0, so the call's first row has type first % R.
            offset = first % rows
            target = self.target_buffer[offset : offset + size]
            draft = self.draft_buffer[offset : offset + size]
            if self.fresh_inputs:
                target, draft = target.clone(), draft.clone()
            began = time.perf_counter()
            result = call_target(
                self.verifier, target, draft, draft_ids[first : first + size],
                self.verifier_generator, timeout_s=self.timeout_s,
            )
            self.verifier_time_s += time.perf_counter() - began
            outputs.append(coerce_output(result, size, k))
            self.calls += 1
        array = np.concatenate(outputs).reshape(m, rows, k + 1)
        start = self.done
        self.outputs[:, start : start + m] = array.transpose(1, 0, 2)
        self.drafts[:, start : start + m] = draft_ids.reshape(m, rows, k).numpy().transpose(
            1, 0, 2
        )
        self.done += m
        self.groups += 1
        self.wall_time_s += time.perf_counter() - began_wall
        return start, m

    def inputs_intact(self) -> bool:
        """Whether the reused input buffers still hold the case's p and q (a verifier that
        writes into its inputs is found here; always True with ``fresh_inputs``)."""
        return self.fresh_inputs or _inputs_intact(
            self.case, self.target_buffer, self.draft_buffer
        )

    def call_pairs(self, start: int, m: int) -> np.ndarray:
        """The independence pairs of the call (group of calls) of steps
        ``start .. start + m - 1``, as indices within it (global pairs ``(2j, 2j+1)`` both
        inside one call: :func:`pairs_within_group`)."""
        return pairs_within_group(start, m, self.case.n_rows, self.case.call_batch_size)

    def samples(self) -> ChainSamples:
        """The steps drawn so far (all of them once :attr:`finished`)."""
        done = self.done
        return ChainSamples(
            case=self.case,
            outputs=self.outputs[:, :done],
            drafts=self.drafts[:, :done],
            pairs=paired_steps_of_calls(
                self.schedule[: self.groups], self.case.n_rows, self.case.call_batch_size
            ),
            seed=self.seed,
            wall_time_s=self.wall_time_s,
            verifier_time_s=self.verifier_time_s,
            calls=self.calls,
            steps_per_call=rows_per_call(self.case),
        )


def sample_chain(
    verifier: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> ChainSamples:
    """Run ``n_steps`` verification steps per row type of ``case`` (:class:`ChainSampler`
    to the end, full-size calls).

    A verifier that writes into its inputs is detected after the last call (one comparison
    pass) and the case is sampled again with a fresh copy per call, so its samples never come
    from altered p or q.

    Args:
        verifier: a chain verifier (the protocol of :mod:`losslessness.protocol`).
        case: the case to sample.
        n_steps: verification steps per row type (>= 1).
        seed: replays the drafts and the verifier's randomness exactly.
        progress: called with the number of steps done after each call.
        timeout_s: seconds each call may take (None: no limit).

    Returns:
        :class:`ChainSamples`; its ``pairs`` are the steps ``(2m, 2m+1)`` that one call
        carried together.

    Raises:
        ValueError: ``n_steps`` < 1.
        ProtocolViolation: the verifier returned a malformed output.
        TargetTimeout: a call took longer than ``timeout_s``.
        Exception: whatever the verifier raised, unchanged.
    """
    sampler = ChainSampler(verifier, case, n_steps, seed, timeout_s)
    while not sampler.finished:
        _, m = sampler.step()
        if progress is not None:
            progress(m)
    if not sampler.inputs_intact():
        # The progress callback has already been told every step once.
        sampler = ChainSampler(verifier, case, n_steps, seed, timeout_s, fresh_inputs=True)
        while not sampler.finished:
            sampler.step()
    return sampler.samples()


def sample_greedy(
    verifier: GreedyVerifier, case: GreedyCase, timeout_s: float | None = None
) -> np.ndarray:
    """One call of a greedy verifier on every row of ``case`` (on copies of its tensors).

    Returns:
        ``[B, k+1]`` int64 outputs.

    Raises:
        ProtocolViolation: a malformed output.
        TargetTimeout: the call took longer than ``timeout_s``.
        Exception: whatever the verifier raised, unchanged.
    """
    result = call_target(
        verifier, case.target_logits.clone(), case.draft_token_ids.clone(), timeout_s=timeout_s
    )
    return coerce_output(result, case.batch_size, case.k)


def paired_steps(n_steps: int, steps_per_call: int) -> np.ndarray:
    """The step pairs ``(2m, 2m+1)`` that one verifier call carried together, for calls of
    ``steps_per_call`` steps (the last one shorter): :func:`paired_steps_of_calls`.

    Returns:
        ``[P, 2]`` int64 step indices.
    """
    full, rest = divmod(n_steps, steps_per_call)
    return paired_steps_of_calls([steps_per_call] * full + ([rest] if rest else []))


def coerce_tree_output(value: object, batch: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Turn a tree verifier's return value into ``([batch, depth+1], [batch, depth])`` int64
    arrays (tokens, accepted nodes).

    Args:
        value: a :class:`~losslessness.protocol.TreeOutput` or any pair (tokens, accepted
            nodes) of array-likes.
        batch: trees of the call.
        depth: D, the depth of the case's tree.

    Raises:
        ProtocolViolation: not a pair, not array-like, wrong shape, or not integer.
    """
    tokens_value: object
    nodes_value: object
    try:
        tokens_value, nodes_value = value  # type: ignore[misc]
    except (TypeError, ValueError) as error:
        raise ProtocolViolation(
            f"output is not a TreeOutput (tokens, accepted_nodes) pair: {error}"
        ) from error
    arrays = []
    for name, item, width in (
        ("tokens", tokens_value, depth + 1),
        ("accepted_nodes", nodes_value, depth),
    ):
        try:
            array = np.asarray(item.cpu() if isinstance(item, torch.Tensor) else item)
        except Exception as error:
            raise ProtocolViolation(f"output {name} is not array-like: {error}") from error
        if array.shape != (batch, width):
            raise ProtocolViolation(
                f"output {name} has shape {array.shape}, expected {(batch, width)} "
                f"([B, {'D+1' if name == 'tokens' else 'D'}] with D = {depth})"
            )
        if not np.issubdtype(array.dtype, np.integer):
            raise ProtocolViolation(f"output {name} dtype is {array.dtype}, expected int64")
        arrays.append(array.astype(np.int64, copy=False))
    return arrays[0], arrays[1]


def sample_tree(
    verifier: TreeVerifier,
    case: TreeCase,
    steps: int,
    seed: int,
    timeout_s: float | None = None,
    progress: Callable[[int], None] | None = None,
    monitor: Callable[[TreeSamples], bool] | None = None,
) -> TreeSamples:
    """Run ``steps`` tree verification steps of ``case``, ``case.batch_size`` trees per call.

    The run drafts every tree itself (``case.draw_trees`` on a generator seeded with
    ``seed``), builds each call's inputs with ``case.inputs`` (fresh tensors per call, so a
    verifier that writes into its inputs never alters a later call) and gives the verifier its
    own generator, seeded ``derive_seed(seed, "verifier")``. Trees ``2m`` and ``2m+1`` of one
    call have the same p and q tables and independent drafts: they are the pairs of the
    independence check (:func:`paired_steps`, the chain path's design).

    Args:
        verifier: a tree verifier (:class:`losslessness.protocol.TreeVerifier`).
        case: the case.
        steps: trees to verify, >= 1.
        seed: replays the trees and the verifier's randomness exactly.
        timeout_s: seconds each call may take (None: no limit).
        progress: called with the number of trees done after each call.
        monitor: called after each call with that call's trees (pairs indexed within it);
            True stops the sampling there (sequential tests).

    Returns:
        :class:`~losslessness.samples.TreeSamples` of the trees drawn (all ``steps`` unless
        ``monitor`` stopped it).

    Raises:
        ValueError: ``steps`` < 1.
        ProtocolViolation: the verifier returned a malformed output.
        TargetTimeout: a call took longer than ``timeout_s``.
        Exception: whatever the verifier raised, unchanged.
    """
    if steps < 1:
        raise ValueError(f"steps: must be >= 1, got {steps}")
    draft_generator = torch.Generator().manual_seed(seed)
    verifier_generator = torch.Generator().manual_seed(derive_seed(seed, "verifier"))
    n_nodes, depth, chunk = case.n_nodes, case.depth, case.batch_size
    token_ids = np.empty((steps, n_nodes), dtype=np.int64)
    tokens = np.empty((steps, depth + 1), dtype=np.int64)
    accepted = np.empty((steps, depth), dtype=np.int64)
    start = time.perf_counter()
    verifier_time = 0.0
    calls = 0
    done = 0
    while done < steps:
        m = min(chunk, steps - done)
        ids = case.draw_trees(m, draft_generator)
        target, draft = case.inputs(ids)
        parents = case.parents_tensor.expand(m, -1).contiguous()
        began = time.perf_counter()
        result = call_target(
            verifier,
            target.contiguous(),
            draft.contiguous(),
            parents,
            ids.clone(),
            case.draft_scheme,
            verifier_generator,
            timeout_s=timeout_s,
        )
        verifier_time += time.perf_counter() - began
        calls += 1
        got_tokens, got_nodes = coerce_tree_output(result, m, depth)
        token_ids[done : done + m] = ids.numpy()
        tokens[done : done + m] = got_tokens
        accepted[done : done + m] = got_nodes
        done += m
        if progress is not None:
            progress(m)
        if monitor is not None:
            call = TreeSamples(case, ids.numpy(), got_tokens, got_nodes,
                               paired_steps(m, chunk), seed, steps_per_call=chunk)
            if monitor(call):
                break
    return TreeSamples(
        case=case,
        token_ids=token_ids[:done],
        tokens=tokens[:done],
        accepted_nodes=accepted[:done],
        pairs=paired_steps(done, chunk),
        seed=seed,
        wall_time_s=time.perf_counter() - start,
        verifier_time_s=verifier_time,
        calls=calls,
        steps_per_call=chunk,
    )


class ServingTreeCall:
    """A serving tree verifier called as a tree verifier on one serving tree case
    (:attr:`~losslessness.cases.TreeCase.serving`): :func:`sample_tree` hands it the case's
    processed target laws, and it calls the verifier with the raw logits of the drafted trees
    (:meth:`~losslessness.cases.TreeCase.logits`) and the case's request for every tree. A
    case with companion requests (:attr:`~losslessness.cases.ServingTree.companions`) is called
    in a mixed batch: each of its trees followed by one copy per companion request, and only
    its own trees' outputs come back.

    Args:
        verifier: the serving tree verifier
            (:class:`~losslessness.protocol.ServingTreeVerifier`).
        case: a serving tree case.

    Raises:
        ValueError: ``case`` is not a serving tree case.
    """

    def __init__(self, verifier: ServingTreeVerifier, case: TreeCase) -> None:
        if case.serving is None:
            raise ValueError(f"case: {case.case_id} is not a serving tree case")
        self.verifier = verifier
        self.case = case
        self.request = case.serving.request
        self.companions = case.serving.companions

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        generator: torch.Generator,
    ) -> TreeOutput:
        """The verifier's output on the raw logits of ``token_ids``'s trees (``target_probs``,
        the processed laws the checks use, is not passed on).

        Raises:
            ProtocolViolation: a malformed output for a mixed batch (its shape is checked
                before the case's trees are taken out of it).
        """
        logits = self.case.logits(token_ids).contiguous()
        trees = int(token_ids.shape[0])
        if not self.companions:
            return self.verifier(logits, draft_probs, parents, token_ids, draft_scheme,
                                 [self.request] * trees, generator)
        width = 1 + len(self.companions)
        requests = [self.request, *self.companions] * trees

        def mixed(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.repeat_interleave(width, dim=0).contiguous()

        output = self.verifier(mixed(logits), mixed(draft_probs), mixed(parents),
                               mixed(token_ids), draft_scheme, requests, generator)
        tokens, nodes = coerce_tree_output(output, trees * width, self.case.depth)
        return TreeOutput(torch.from_numpy(tokens[::width].copy()),
                          torch.from_numpy(nodes[::width].copy()))


def sample_greedy_tree(
    verifier: GreedyTreeVerifier, case: GreedyTreeCase, timeout_s: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One call of a greedy tree verifier on every tree of ``case`` (on copies of its tensors).

    Returns:
        (tokens ``[B, D+1]``, accepted nodes ``[B, D]``) int64, D the deepest node of the
        batch's trees.

    Raises:
        ProtocolViolation: a malformed output.
        TargetTimeout: the call took longer than ``timeout_s``.
        Exception: whatever the verifier raised, unchanged.
    """
    depth = int(tree_depths(case.parents).max())
    result = call_target(
        verifier,
        case.target_logits.clone(),
        case.parents.clone(),
        case.token_ids.clone(),
        timeout_s=timeout_s,
    )
    return coerce_tree_output(result, case.batch_size, depth)


SEQUENCE_PROGRESS_EVERY = 64
"""Sequences generated between two progress reports of :func:`generate_sequences`."""


def _describe(value: object) -> str:
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def generate_sequences(
    generator: EndToEndGenerator,
    prompt_ids: Sequence[int],
    new_tokens: int,
    n: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> tuple[list[object], float]:
    """``generate(prompt, L, sequence_seed(seed, j))`` for ``j < n``: an end-to-end engine's
    sequences (docs/architecture.md, 'Protocols', end-to-end generators); see
    :func:`generate_for_seeds`."""
    seeds = [sequence_seed(seed, index) for index in range(n)]
    return generate_for_seeds(generator, prompt_ids, new_tokens, seeds, progress, timeout_s)


def generate_for_seeds(
    generator: EndToEndGenerator,
    prompt_ids: Sequence[int],
    new_tokens: int,
    seeds: Sequence[int],
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> tuple[list[object], float]:
    """``generate(prompt, L, s)`` for each seed ``s``, in order. An engine that batches
    (:class:`~losslessness.protocol.GeneratesBatches`) gets the seeds in batches of its
    ``batch_size``, ``timeout_s`` applying to each batch.

    Returns:
        (one returned value per seed, unchecked; seconds spent inside ``generate``).

    Raises:
        TargetTimeout: one call took longer than ``timeout_s``.
        InvalidInputError: naming ``generate_batch`` when a batch's answer is not a list of
            one value per seed, or ``batch_size`` when it is not an int >= 1.
        Exception: whatever the generator raised, unchanged.
    """
    seeds = [int(value) for value in seeds]
    n = len(seeds)
    size = 1
    if isinstance(generator, GeneratesBatches):
        size = generator.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidInputError("batch_size", f"expected an int >= 1, got {size!r}")
    sequences: list[object] = []
    inside = 0.0
    reported = 0
    for start in range(0, n, size):
        chunk = seeds[start:start + size]
        began = time.perf_counter()
        if isinstance(generator, GeneratesBatches):
            values = call_target(
                generator.generate_batch, list(prompt_ids), new_tokens, chunk,
                timeout_s=timeout_s,
            )
            if not isinstance(values, list | tuple) or len(values) != len(chunk):
                raise InvalidInputError(
                    "generate_batch", f"expected a list of {len(chunk)} sequences (one per "
                    f"seed), got {_describe(values)}"
                )
            sequences.extend(values)
        else:
            sequences.append(
                call_target(
                    generator.generate, list(prompt_ids), new_tokens, chunk[0],
                    timeout_s=timeout_s,
                )
            )
        inside += time.perf_counter() - began
        if progress is not None:
            while len(sequences) - reported >= SEQUENCE_PROGRESS_EVERY:
                progress(SEQUENCE_PROGRESS_EVERY)
                reported += SEQUENCE_PROGRESS_EVERY
    if progress is not None and n > reported:
        progress(n - reported)
    return sequences, inside
