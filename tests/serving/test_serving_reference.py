"""The reference serving verifier: its emitted tokens follow the profile's law at every
position (checked by the serving checks), its seeded rows obey the seed contract, and the
serving checks catch a verifier whose law differs (a mutant) while passing the reference."""

from __future__ import annotations

import torch

from losslessness.cases import ServingCase, ServingRow
from losslessness.checks.serving import check_serving, serving_design
from losslessness.engine.serving import sample_serving
from losslessness.reference.serving import ServingReference, ServingRowLaws
from losslessness.requests import Request
from losslessness.results import CheckContext, Verdict
from losslessness.zoo.serving import IgnoresFrequencyPenalty
from tests.serving.profile import small_profile


def _case() -> ServingCase:
    generator = torch.Generator().manual_seed(3)

    def row(label: str, request: Request, drafts: int) -> ServingRow:
        logits = torch.randn(3, 6, generator=generator, dtype=torch.float64)
        q = torch.softmax(torch.randn(2, 6, generator=generator, dtype=torch.float64), -1)
        return ServingRow(label, logits, request, drafts, q)

    return ServingCase(
        "tiny",
        "a penalty row beside a top-k row and a greedy row",
        (
            row("frequency 1.5", Request(frequency_penalty=1.5, output_token_ids=(0,)), 2),
            row("top-k 3", Request(top_k=3, seed=7), 1),
            row("greedy", Request(temperature=0.0), 2),
        ),
    )


def _verdicts(verifier: ServingReference, steps: int = 1500) -> dict[str, Verdict]:
    case, profile = _case(), small_profile()
    samples = sample_serving(verifier, case, steps, 11, None)
    context = CheckContext("t", case.case_id, case.summary, case.case_hash, 1e-3, 0.9, 0.1, 11)
    design = serving_design(case, profile, 0.1, 1e-3, 0.9, steps, 1)
    worst: dict[str, Verdict] = {}
    for result in check_serving(samples, profile, context, design):
        label = str(result.details.get("label", result.check_id))
        if result.verdict is not Verdict.PASS or label not in worst:
            worst[label] = result.verdict
    return worst


def test_reference_serving_verifier_passes_every_serving_check() -> None:
    """Control: the reference's law, acceptance and greedy results all PASS."""
    assert set(_verdicts(ServingReference(small_profile())).values()) == {Verdict.PASS}


def test_serving_law_check_catches_an_ignored_frequency_penalty_on_its_row_only() -> None:
    """A verifier ignoring the frequency penalty fails the penalty row's law (grouped by the
    accepted prefix); the other rows still pass."""
    verdicts = _verdicts(IgnoresFrequencyPenalty(small_profile()))
    assert verdicts["frequency 1.5"] is Verdict.LOSSY
    assert verdicts["top-k 3"] is Verdict.PASS and verdicts["greedy"] is Verdict.PASS


def test_seeded_row_output_is_the_same_whatever_its_batch_and_place() -> None:
    """The seed contract of the reference: a seeded row alone, or second in a batch beside
    other rows and another generator state, gives the same tokens."""
    case = _case()
    reference = ServingReference(small_profile())
    seeded = case.rows[1].request
    logits = case.served_logits
    drafts = torch.tensor([[2, 1], [3, -1], [0, 5]])
    counts = torch.tensor([2, 1, 2])
    alone = reference(
        logits[1:2], None, drafts[1:2], counts[1:2], (seeded,), torch.Generator().manual_seed(1)
    )
    requests = (case.rows[0].request, seeded, case.rows[2].request)
    batch = reference(logits, None, drafts, counts, requests, torch.Generator().manual_seed(2))
    assert torch.equal(alone[0], batch[1])


def test_reach_probabilities_of_a_history_dependent_row_match_simulation() -> None:
    """The enumerated reach of position 2 of the penalty row agrees with the reference's
    simulated frequency (within 4 standard errors)."""
    case = _case()
    laws = ServingRowLaws(small_profile(), case, 0)
    samples = sample_serving(ServingReference(small_profile()), case, 4000, 5, None)
    observed = float((samples.outputs[0][:, 2] != -1).mean())
    error = (laws.reach[2] * (1 - laws.reach[2]) / 4000) ** 0.5
    assert laws.history_dependent
    assert abs(observed - laws.reach[2]) < 4 * error + 1e-9
