"""The serving tree protocol (issue 21): its validation, the battery's processed laws, the
reference verifier against the plain tree reference, the zoo's mutants and control through the
audit, and a ``pkg.module:fn`` target named with ``--protocol serving-tree``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from losslessness.batteries.serving_tree import (
    SERVING_TREE_CASE_IDS,
    default_serving_tree_battery,
    serving_tree_case,
)
from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.engine.draw import ServingTreeCall
from losslessness.engine.plan import plan_run
from losslessness.protocol import InvalidInputError, validate_serving_tree_inputs
from losslessness.reference.profiles import get_profile
from losslessness.reference.serving_tree import ServingTreeReference, path_histories
from losslessness.reference.tree import verify_tree
from losslessness.requests import Request
from losslessness.results import TargetVerdict, Verdict
from losslessness.zoo.registry import SERVING_MUTANTS, mutant
from losslessness.zoo.serving_tree import serving_tree_zoo
from tests.serving.profile import PROFILE_NAME, small_profile

STEPS = 1280
"""Trees per case in the zoo tests (20 calls of 64)."""


def _inputs(case_id: str = "stree-top-k", count: int = 4, profile: str = "vllm-v1"):  # type: ignore[no-untyped-def]
    case = next(c for c in default_serving_tree_battery(profile) if c.case_id == case_id)
    ids = case.draw_trees(count, torch.Generator().manual_seed(1))
    _, draft = case.inputs(ids)
    parents = case.parents_tensor.expand(count, -1).contiguous()
    assert case.serving is not None
    return case, case.logits(ids), draft, parents, ids, [case.serving.request] * count


def test_validation_names_the_argument_of_every_malformed_serving_tree_input() -> None:
    """NaN, +inf and all -inf logit rows, an integer dtype, a wrong number of requests, a
    request naming a token outside V and a cyclic parent each raise InvalidInputError naming
    ``target_logits``, ``requests`` or ``parents``; the well-formed call returns (B, N, V)."""
    case, logits, draft, parents, ids, requests = _inputs()
    gen = torch.Generator()
    scheme = case.draft_scheme
    assert validate_serving_tree_inputs(logits, draft, parents, ids, scheme, requests, gen) == (
        4, case.n_nodes, 16
    )
    for bad, problem in (
        (logits.clone().index_fill_(-1, torch.tensor([3]), float("nan")), "NaN"),
        (logits.clone().index_fill_(-1, torch.tensor([3]), float("inf")), r"\+inf"),
        (torch.full_like(logits, float("-inf")), "every logit -inf"),
        (logits.to(torch.int64), "expected float32"),
    ):
        with pytest.raises(InvalidInputError, match=f"target_logits.*{problem}"):
            validate_serving_tree_inputs(bad, draft, parents, ids, scheme, requests, gen)
    with pytest.raises(InvalidInputError, match=r"requests.*3 requests for B = 4"):
        validate_serving_tree_inputs(logits, draft, parents, ids, scheme, requests[:3], gen)
    with pytest.raises(InvalidInputError, match=r"requests.*row 0"):
        validate_serving_tree_inputs(logits, draft, parents, ids, scheme,
                                     [Request(logit_bias={99: 1.0})] * 4, gen)
    cyclic = parents.clone()
    cyclic[:, 0] = 1
    with pytest.raises(InvalidInputError, match="parents"):
        validate_serving_tree_inputs(logits, draft, cyclic, ids, scheme, requests, gen)


def test_battery_tables_are_the_profiles_law_of_the_logits_the_verifier_receives() -> None:
    """Each case's target table holds the profile's law of the raw logits rounded to the case's
    dtype, at the node's history length (the min_tokens case: stop tokens masked at the root
    only); :meth:`TreeCase.logits` gives those raw rows; a request with penalties is refused
    (naming ``request``); every id is listed in SERVING_TREE_CASE_IDS."""
    profile = get_profile("vllm-v1")
    cases = default_serving_tree_battery("vllm-v1")
    assert [case.case_id for case in cases] == list(SERVING_TREE_CASE_IDS)
    for case in cases:
        spec = case.serving
        assert spec is not None and spec.profile == "vllm-v1"
        history = list(spec.request.output_token_ids)
        assert torch.equal(case.root_target, profile.law(spec.root_logits, spec.request, history))
        row = spec.logit_table[1, 1]
        want = profile.law(row, spec.request, [*history, 0, 0])
        assert torch.equal(case.target_table[1, 1], want)
        assert torch.equal(spec.root_logits, spec.root_logits.to(torch.float32).to(torch.float64))
    tokens = next(c for c in cases if c.case_id == "stree-min-tokens")
    assert float(tokens.root_target[[0, 1]].sum()) == 0.0
    assert float(tokens.target_table[0, :, [0, 1]].sum(dim=-1).min()) > 0.15
    _, logits, _, _, _, _ = _inputs()
    case = cases[1]
    assert case.serving is not None
    assert torch.equal(logits[:, 0].to(torch.float64), case.serving.root_logits.expand(4, -1))
    assert logits.dtype == torch.float32
    with pytest.raises(ValueError, match=r"request: .*penalties"):
        serving_tree_case(
            "x", "x", (0,), "iid", torch.zeros(4), torch.zeros(1, 4, 4), torch.full((4,), 0.25),
            torch.full((1, 4, 4), 0.25), Request(frequency_penalty=0.5), "vllm-v1",
        )


@pytest.mark.parametrize("case_id", ["stree-top-k-top-p", "stree-greedy", "stree-min-tokens"])
def test_reference_equals_the_tree_reference_on_the_processed_laws(case_id: str) -> None:
    """On the same generator the serving tree reference's output equals the plain tree
    reference's on the profile's laws at every node, token for token: the conversion of raw
    logits and path histories into laws loses nothing (histories: the request's output, then
    the path's tokens)."""
    case, logits, draft, parents, ids, requests = _inputs(case_id, count=32)
    got = ServingTreeReference("vllm-v1")(
        logits, draft, parents, ids, case.draft_scheme, requests, torch.Generator().manual_seed(5)
    )
    target, _ = case.inputs(ids)
    want = verify_tree(target, draft, parents, ids, case.draft_scheme,
                       torch.Generator().manual_seed(5))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(
        got.accepted_nodes, want.accepted_nodes
    )
    paths = path_histories(parents[:1], ids[:1])
    assert paths[0][0] == [] and paths[0][-1][-1] == int(ids[0, -1])


def test_profiles_that_process_differently_give_different_cases_and_refuse_one_run() -> None:
    """A case built for SGLang's profile and for vLLM's differ (their laws, and their hashes,
    which name the profile), so one run with serving tree targets of both profiles is refused
    naming the case; a target without an engine profile is refused naming the fix."""
    vllm = {c.case_id: c for c in default_serving_tree_battery("vllm-v1")}
    sglang = {c.case_id: c for c in default_serving_tree_battery("sglang-torch")}
    assert vllm["stree-top-k-top-p"].case_hash != sglang["stree-top-k-top-p"].case_hash
    assert not torch.equal(vllm["stree-top-k-top-p"].target_table,
                           sglang["stree-top-k-top-p"].target_table)
    adapters = [
        dataclasses.replace(entry.adapter, name=f"{profile}-tree")
        for profile in ("vllm-v1", "sglang-torch")
        for entry in serving_tree_zoo(profile)
        if entry.name == "serving-tree-reference"
    ]
    config = RunConfig(cases=("stree-top-k-top-p",), steps=64)
    with pytest.raises(ValueError, match="stree-top-k-top-p differs between the engine profiles"):
        plan_run(config, adapters)
    unnamed = dataclasses.replace(adapters[0], engine_profile=None)
    with pytest.raises(ValueError, match="without an engine profile"):
        plan_run(config, [unnamed])


def test_serving_tree_call_hands_the_verifier_raw_logits_and_the_cases_request() -> None:
    """The sampler's wrapper calls the serving tree verifier with the case's raw logits of the
    drafted trees and one copy of the case's request per tree, not the processed laws."""
    case, logits, draft, parents, ids, requests = _inputs()
    seen: list[tuple[torch.Tensor, list[Request]]] = []

    def verifier(*args: object) -> str:
        seen.append((args[0], list(args[5])))  # type: ignore[arg-type]
        return "output"

    target, _ = case.inputs(ids)
    call = ServingTreeCall(verifier, case)  # type: ignore[arg-type]
    assert call(target, draft, parents, ids, case.draft_scheme, torch.Generator()) == "output"
    assert torch.equal(seen[0][0], logits) and seen[0][1] == requests


def test_a_mixed_case_calls_the_verifier_with_companion_trees_and_keeps_its_own() -> None:
    """A mixed-batch case's call carries, after each of its trees, one copy per companion
    request (same tokens, logits and draft laws); only the case's own trees' outputs come
    back, and a verifier output of the wrong size is a ProtocolViolation."""
    from losslessness.protocol import TreeOutput
    from losslessness.worker import ProtocolViolation

    case, _, draft, parents, ids, _ = _inputs("stree-mixed-sampled", count=3)
    assert case.serving is not None and len(case.serving.companions) == 2
    seen: list[tuple[torch.Tensor, list[Request]]] = []

    def verifier(*args: Any) -> TreeOutput:
        token_ids, requests = args[3], args[5]
        seen.append((token_ids, list(requests)))
        batch = token_ids.shape[0]
        tokens = torch.full((batch, case.depth + 1), -1, dtype=torch.int64)
        tokens[:, 0] = torch.arange(batch)
        return TreeOutput(tokens, torch.full((batch, case.depth), -1, dtype=torch.int64))

    def short(*args: Any) -> TreeOutput:
        tokens, nodes = verifier(*args)
        return TreeOutput(tokens[:2], nodes[:2])

    target, _ = case.inputs(ids)
    output = ServingTreeCall(verifier, case)(target, draft, parents, ids, "iid",
                                             torch.Generator())
    token_ids, requests = seen[0]
    assert torch.equal(token_ids, ids.repeat_interleave(3, dim=0))
    assert requests == [case.serving.request, *case.serving.companions] * 3
    assert output.tokens[:, 0].tolist() == [0, 3, 6]
    with pytest.raises(ProtocolViolation):
        ServingTreeCall(short, case)(target, draft, parents, ids, "iid", torch.Generator())


def test_a_batch_level_greedy_flag_passes_every_unmixed_case_and_fails_the_mixed_one() -> None:
    """``serving-tree-greedy-flag-from-any-request`` (one greedy request makes its whole batch
    greedy) is LOSSLESS on an unmixed sampled case and on the greedy-beside-sampled mix; only
    the sampled-beside-greedy mix shows it (its LOSSY run is the zoo test's)."""
    entry = next(e for e in serving_tree_zoo(small_profile())
                 if e.name == "serving-tree-greedy-flag-from-any-request")
    cases = ("stree-top-k-top-p", "stree-mixed-greedy")
    result = run_audit([entry.adapter], RunConfig(cases=cases, steps=STEPS))
    assert result.targets[0].verdict is TargetVerdict.LOSSLESS, [
        c.message for c in result.targets[0].checks if c.verdict is not Verdict.PASS
    ]


@pytest.mark.parametrize(
    ("name", "failing"),
    [("serving-tree-ignores-min-p", "stree-min-p"),
     ("serving-tree-min-tokens-at-root", "stree-min-tokens"),
     ("serving-tree-greedy-flag-from-any-request", "stree-mixed-sampled")],
)
def test_serving_tree_mutant_is_lossy_on_its_case(name: str, failing: str) -> None:
    """Each lossy entry (built for the test profile) is LOSSY through run_audit on its case,
    at a law check."""
    entry = next(e for e in serving_tree_zoo(small_profile()) if e.name == name)
    assert entry.case.case_id == failing  # type: ignore[union-attr]
    result = run_audit([entry.adapter], RunConfig(cases=(failing,), steps=STEPS))
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSY, [c.message for c in target.checks]
    assert any(c.check_id == "tree.law" and c.verdict is Verdict.LOSSY for c in target.checks)


def test_serving_tree_reference_control_is_lossless_and_registered_entries_resolve() -> None:
    """The control passes its case (LOSSLESS); every registered serving tree entry resolves as
    ``mutant/<name>`` in the serving tree slot, claiming the zoo's profile, citing a source."""
    entry = next(e for e in serving_tree_zoo(small_profile())
                 if e.name == "serving-tree-reference")
    result = run_audit([entry.adapter], RunConfig(cases=("stree-top-k-top-p",), steps=STEPS))
    assert result.targets[0].verdict is TargetVerdict.LOSSLESS
    names = [name for name in SERVING_MUTANTS if name.startswith("serving-tree-")]
    assert len(names) == 4
    for name in names:
        adapter = mutant(f"mutant/{name}").adapter
        assert adapter.serving_tree is not None and adapter.serving is None
        assert SERVING_MUTANTS[name].source.startswith("https://")


def test_audit_cli_takes_protocol_serving_tree_and_replays_with_it(tmp_path: Path) -> None:
    """``losslessness audit --protocol serving-tree pkg.module:fn`` audits a bare function in
    its worker on the serving tree battery of its profile (LOSSLESS at fixed steps); the
    replay lines name the protocol and the profile."""
    small_profile()
    record = tmp_path / "audit.json"
    result = CliRunner().invoke(
        main,
        ["audit", "--protocol", "serving-tree", "tests.serving.targets:tree_reference",
         "--case", "stree-greedy", "--steps", "256", "--no-progress", "--json", str(record)],
    )
    assert result.exit_code == 0, result.output
    checks = json.loads(record.read_text())["targets"][0]["checks"]
    assert {check["verdict"] for check in checks} == {"PASS"}
    assert checks[0]["replay"].startswith(
        "losslessness audit --protocol serving-tree tests.serving.targets:tree_reference "
        f"--engine-profile {PROFILE_NAME} --seed"
    ), checks[0]["replay"]
