"""Call conditions of chain cases (issue 21): rows per verifier call, the input dtype, and the
run options that set them (``--batch-size``, ``--dtype``, ``--vocab-size``).

Each test pins one property and can fail: a sampler that ignored ``call_batch_size`` would
make calls of another size; one that ignored ``dtype`` would pass float64; a hash that left
the conditions out would make two runs under different conditions merge.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from losslessness.batteries import chain_battery_at_vocab, default_chain_battery
from losslessness.cases import ChainCase
from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine.draw import ChainSampler, paired_steps_of_calls, sample_chain
from losslessness.engine.plan import select_cases, select_tree_cases
from losslessness.protocol import InvalidInputError
from losslessness.reference import verify as reference_verify

MIXED = next(case for case in default_chain_battery() if case.case_id == "v32-mixed-batch")
"""Three row types: call sizes that are not multiples of R are the interesting ones."""


class _Recorder:
    """A chain verifier that records each call's batch size and dtype, then runs the
    reference."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.dtypes: list[torch.dtype] = []

    def __call__(self, target, draft, ids, generator):  # type: ignore[no-untyped-def]
        self.batches.append(int(target.shape[0]))
        self.dtypes.append(target.dtype)
        return reference_verify(target, draft, ids, generator)


def _conditioned(batch: int | None, dtype: str = "float64") -> ChainCase:
    return dataclasses.replace(MIXED, call_batch_size=batch, dtype=dtype)


@pytest.mark.parametrize("batch", [1, 2, 4, 7])
def test_every_call_but_the_last_carries_exactly_call_batch_size_rows(batch: int) -> None:
    """With ``call_batch_size`` B every verifier call has B rows (the last of a chunk may have
    fewer), whatever R is; the rows' types keep their order, so the outputs match a run
    with the default calls' draws row type for row type in shape."""
    recorder = _Recorder()
    samples = sample_chain(recorder, _conditioned(batch), 101, seed=3)
    assert set(recorder.batches[:-1]) == {batch}
    assert recorder.batches[-1] <= batch
    assert sum(recorder.batches) == 101 * MIXED.n_rows
    assert samples.outputs.shape == (MIXED.n_rows, 101, MIXED.k + 1)
    assert samples.calls == len(recorder.batches)


def test_pairs_never_straddle_two_calls() -> None:
    """An independence pair (steps 2j, 2j+1) is kept only when every row type's two rows were
    in one call: none at B <= R, some at B = 7 > 2R, all at the default one-call groups."""
    assert paired_steps_of_calls([64], 3, 1).size == 0
    assert paired_steps_of_calls([64], 3, 3).size == 0
    pairs = paired_steps_of_calls([70], 3, 7)
    rows_first, rows_last = pairs[:, 0] * 3, pairs[:, 1] * 3 + 2
    assert pairs.size and np.all(rows_first // 7 == rows_last // 7)
    assert len(paired_steps_of_calls([64], 3, None)) == 32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verifier_receives_the_case_dtype_and_laws_are_of_the_received_values(
    dtype: str,
) -> None:
    """The verifier gets p and q in the case's dtype; the exact laws are those of the cast
    values, renormalised in float64 (so they differ from the float64 laws by rounding only)."""
    case = _conditioned(None, dtype)
    recorder = _Recorder()
    sample_chain(recorder, case, 40, seed=1)
    assert set(recorder.dtypes) == {getattr(torch, dtype)}
    received = case.input_target_probs.to(torch.float64)
    expected = received / received.sum(-1, keepdim=True)
    assert torch.equal(case.law_target_probs, expected)
    assert not torch.equal(case.law_target_probs, MIXED.target_probs)
    assert float((case.laws[0].emitted - MIXED.laws[0].emitted).abs().max()) < 1e-2


def test_case_hash_covers_the_conditions_and_keeps_the_default_hash() -> None:
    """Conditions change the hash (replays and merges cannot confuse two conditions); the
    default conditions keep the battery's hash as it was."""
    hashes = {_conditioned(b, d).case_hash for b in (None, 1, 4) for d in ("float64", "float32")}
    assert len(hashes) == 6
    assert _conditioned(None).case_hash == MIXED.case_hash


def test_bad_conditions_raise_naming_the_field() -> None:
    """``call_batch_size`` < 1 and an unknown dtype raise InvalidInputError naming them."""
    with pytest.raises(InvalidInputError, match="call_batch_size"):
        _conditioned(0)
    with pytest.raises(InvalidInputError, match="dtype"):
        _conditioned(None, "float16")


def test_replay_of_a_conditioned_case_is_exact() -> None:
    """The same seed gives the same outputs under the same conditions (B = 1 calls)."""
    first = sample_chain(reference_verify, _conditioned(1, "float32"), 30, seed=5)
    again = sample_chain(reference_verify, _conditioned(1, "float32"), 30, seed=5)
    assert np.array_equal(first.outputs, again.outputs)


def test_run_options_set_every_chain_case_and_tree_batch() -> None:
    """``batch_size`` and ``dtype`` of the config reach every chain case; ``batch_size`` every
    tree case; ``vocab_size`` replaces the chain battery by LM-like cases at that V."""
    chain, _, _ = select_cases(RunConfig(batch_size=2, dtype="float32"))
    assert {(c.call_batch_size, c.dtype) for c in chain} == {(2, "float32")}
    tree, _ = select_tree_cases(RunConfig(batch_size=3))
    assert {case.batch_size for case in tree} == {3}
    at_vocab, _, _ = select_cases(RunConfig(vocab_size=1000))
    assert {case.vocab_size for case in at_vocab} == {1000}
    assert sorted(case.k for case in at_vocab) == [1, 2, 3, 4]


def test_vocab_battery_builds_at_152k_within_the_call_budget() -> None:
    """V = 152k builds (float64 rows summing to 1) and one call of its largest case stays
    within the batch element budget."""
    cases = chain_battery_at_vocab(152_064)
    assert all(case.vocab_size == 152_064 for case in cases)
    sampler = ChainSampler(reference_verify, cases[-1], 3, seed=0)
    sampler.step()
    assert sampler.finished


@pytest.mark.parametrize(
    ("flag", "value"), [("--batch-size", "0"), ("--vocab-size", "1"), ("--dtype", "float16")]
)
def test_cli_rejects_bad_condition_values_naming_the_flag(flag: str, value: str) -> None:
    """A bad --batch-size, --vocab-size or --dtype is a usage error (exit 2) naming the flag."""
    result = CliRunner().invoke(main, ["plan", flag, value, "reference"])
    assert result.exit_code == 2, result.output
    assert flag in result.output
