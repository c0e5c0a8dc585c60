"""Calibration and power of the sequential (anytime-valid) tests, measured by simulation.

What is measured:

- **Null, e-process by e-process.** i.i.d. samples from the null law (four token laws from
  V = 2 to V = 1000, pooled at a planned n as the run pools them; three acceptance rates),
  RUNS = 2,000 runs each, looked at after every call of the sequential call schedule (32 steps,
  doubling, up to 20,000); a run is a false alarm when the e-value crosses ``1 / alpha`` at
  any look. Judged at alpha = 1e-2 and 1e-3.
- **Null, whole monitor on a correct verifier.** The reference verifier's own outputs on two
  battery cases, 2,000 runs of 2,000 steps each, fed call by call to :class:`ChainMonitor`
  (every law, acceptance and independence e-process of the case): the running maximum of each
  assertion's e-value, judged at 1e-2 and 1e-3 per assertion.
- **Power.** The same e-processes against known alternatives (a token law at TV 0.1, an
  acceptance rate 0.05 above its bound) at alpha = 1e-6, the order of a run's per-assertion
  sequential level.

With what confidence: every null rate is an exact one-sided binomial test of "rate > alpha" at
level 1e-3 (a calibrated e-process fails one with probability at most 1e-3; seeds are fixed).
Ville's inequality makes the guarantee exact at every level, the run's ~1e-6 included: these
measurements check the implementation, not an approximation. Measured (seed as below), false
alarms out of 2,000 runs at 1e-2 / 1e-3: token laws V2 0/0, V8 0/0, V64 0/0, V1000 1/0;
acceptance rates 0.05 0/0, 0.3 0/0, 0.8 3/1; the monitor on the reference, worst assertion
v2-tilted 4/1 (6 assertions), v32-mixed-batch 3/1 (18 assertions). Mixture e-processes are
conservative (their regret keeps them well below 1 / alpha). Power at 1e-6 was 2000/2000 for
both alternatives within 20,000 steps.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from losslessness.batteries import default_chain_battery
from losslessness.cases import ChainCase
from losslessness.checks.sequential import ChainMonitor
from losslessness.engine.draw import call_schedule
from losslessness.reference.chain import verify
from losslessness.results import CheckContext
from losslessness.stats import pooling_partition
from losslessness.stats.sequential import (
    binomial_upper_log_evalue,
    cell_partitions,
    partition_mixture_log_evalue,
)

RUNS = 2000
LEVELS = (1e-2, 1e-3)
SEED = 20261124
STEPS = 20_000
LOOKS = np.cumsum([32 * 2**j for j in range(9)] + [STEPS - 32 * (2**9 - 1)])
"""Look times: after calls of 32, 64, ..., 8192 steps, then the rest up to 20,000."""


def _laws() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    peaked = np.exp(rng.normal(size=1000) / 0.3)
    zeros = rng.dirichlet(np.ones(64))
    zeros[rng.choice(64, 16, replace=False)] = 0.0
    return {
        "V2 [0.3, 0.7]": np.array([0.3, 0.7]),
        "V8 Dirichlet(1)": rng.dirichlet(np.ones(8)),
        "V64 with 16 zeros": zeros / zeros.sum(),
        "V1000 peaked": peaked / peaked.sum(),
    }


def _max_log_evalues(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each run's largest log e-value over the looks, samples drawn from ``q``, tested
    against ``p`` (partitions at the planned n = STEPS, as the run decides them)."""
    partitions = cell_partitions(p, pooling_partition(p, STEPS)[0])
    best = np.full(RUNS, -np.inf)
    counts = np.zeros((RUNS, p.size), dtype=np.int64)
    previous = 0
    for look in LOOKS:
        counts += rng.multinomial(int(look - previous), q, size=RUNS)
        previous = look
        for run in range(RUNS):
            value = partition_mixture_log_evalue(counts[run], p, partitions)
            best[run] = max(best[run], value)
    return best


def _assert_calibrated(alarms: int, level: float, what: str) -> None:
    test = stats.binomtest(alarms, RUNS, level, alternative="greater")
    assert test.pvalue > 1e-3, f"{what}: {alarms}/{RUNS} false alarms at {level:g}"


@pytest.mark.parametrize(
    "name",
    [
        "V2 [0.3, 0.7]",
        "V8 Dirichlet(1)",
        pytest.param("V64 with 16 zeros", marks=pytest.mark.slow),
        pytest.param("V1000 peaked", marks=pytest.mark.slow),
    ],
)
def test_token_law_e_process_false_alarm_rate_at_most_nominal(name: str) -> None:
    """Under the null (tokens i.i.d. p), the identity e-process crosses 1 / alpha at some look
    in at most an alpha share of runs, at 1e-2 and 1e-3."""
    p = _laws()[name]
    best = _max_log_evalues(p, p, np.random.default_rng(SEED))
    for level in LEVELS:
        _assert_calibrated(int((best >= math.log(1 / level)).sum()), level, name)


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.8])
def test_acceptance_e_process_false_alarm_rate_at_most_nominal(rate: float) -> None:
    """Under the null (acceptances i.i.d. Bernoulli(rate), the bound itself), the one-sided
    acceptance e-process crosses 1 / alpha in at most an alpha share of runs."""
    rng = np.random.default_rng(SEED)
    successes = np.zeros(RUNS, dtype=np.int64)
    best = np.full(RUNS, -np.inf)
    previous = 0
    for look in LOOKS:
        successes += rng.binomial(int(look - previous), rate, size=RUNS)
        previous = look
        values = [binomial_upper_log_evalue(int(s), int(look), rate) for s in successes]
        best = np.maximum(best, values)
    for level in LEVELS:
        _assert_calibrated(int((best >= math.log(1 / level)).sum()), level, f"rate {rate}")


@pytest.mark.slow
def test_e_processes_detect_known_alternatives_at_a_run_level_of_1e_6() -> None:
    """Power: a token law at TV 0.1 from p (V = 8) and an acceptance rate 0.05 above its bound
    are detected within 20,000 steps in at least 99% of runs at alpha = 1e-6."""
    rng = np.random.default_rng(SEED)
    p = _laws()["V8 Dirichlet(1)"]
    q = p.copy()
    low, high = int(np.argmin(p)), int(np.argmax(p))
    shift = min(0.1, p[high])
    q[high] -= shift
    q[low] += shift
    assert 0.5 * np.abs(q - p).sum() == pytest.approx(shift)
    best = _max_log_evalues(p, q, rng)
    assert (best >= math.log(1e6)).mean() >= 0.99
    successes = rng.binomial(STEPS, 0.35, size=RUNS)
    detected = [binomial_upper_log_evalue(int(s), STEPS, 0.3) >= math.log(1e6) for s in successes]
    assert np.mean(detected) >= 0.99


def _reference_outputs(case: ChainCase, runs: int, steps: int, seed: int) -> np.ndarray:
    """``[runs, R, steps, k+1]`` outputs of the reference on ``case`` (shared-row fast path)."""
    generator = torch.Generator().manual_seed(seed)
    rows, k = case.n_rows, case.k
    batch = runs * steps
    drafts = torch.empty((batch, rows, k), dtype=torch.int64)
    for r in range(rows):
        for i in range(k):
            drafts[:, r, i] = torch.multinomial(
                case.draft_probs[r, i], batch, replacement=True, generator=generator
            )
    outputs = np.empty((batch, rows, k + 1), dtype=np.int64)
    for r in range(rows):
        target = case.target_probs[r : r + 1].expand(batch, -1, -1)
        draft = case.draft_probs[r : r + 1].expand(batch, -1, -1)
        outputs[:, r] = verify(target, draft, drafts[:, r], generator).numpy()
    shaped = outputs.reshape(runs, steps, rows, k + 1).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(shaped), drafts.numpy().reshape(runs, steps, rows, k).transpose(
        0, 2, 1, 3
    )


@pytest.mark.parametrize(
    "case_id", ["v2-tilted", pytest.param("v32-mixed-batch", marks=pytest.mark.slow)]
)
def test_monitor_on_the_reference_false_alarm_rate_at_most_nominal(case_id: str) -> None:
    """The whole monitor (every law, acceptance and independence e-process of the case) fed
    the reference verifier's outputs call by call: each assertion's running e-value crosses
    1 / alpha in at most an alpha share of 2,000 runs, at 1e-2 and 1e-3."""
    case = next(case for case in default_chain_battery() if case.case_id == case_id)
    steps = 2000
    outputs, drafts = _reference_outputs(case, RUNS, steps, SEED)
    context = CheckContext("reference", case.case_id, case.summary, case.case_hash,
                           1e-3, 0.9, 0.05, SEED)
    sizes = call_schedule(case, steps, ramp=True)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    best: dict[tuple[str, int, int], np.ndarray] = {}
    for run in range(RUNS):
        # A level no e-value reaches, so that no assertion stops the others' looks.
        monitor = ChainMonitor(case, steps, 1e-300, context)
        for start, end in itertools.pairwise(bounds):
            pairs = np.stack([np.arange(0, end - start - 1, 2),
                              np.arange(1, end - start, 2)], axis=1)
            assert not monitor.update(outputs[run, :, start:end], drafts[run, :, start:end],
                                      pairs)
            for key, value in monitor.log_evalues.items():
                running = best.setdefault(key, np.full(RUNS, -np.inf))
                running[run] = max(running[run], value)
    assert len(best) >= 3
    for key, values in best.items():
        for level in LEVELS:
            _assert_calibrated(int((values >= math.log(1 / level)).sum()), level, str(key))
