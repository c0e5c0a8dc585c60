"""OpenVINO GenAI's ``LLMPipeline`` with speculation on, behind a loopback HTTP API (issue 22).

Run by the OpenVINO environment's Python (:mod:`losslessness.adapters.e2e.openvino` builds it),
never by the audit's: it imports the standard library, numpy and OpenVINO only (numpy comes
with OpenVINO; no torch, no losslessness), so that nothing of the audit's environment is in the
engine's process::

    python -I openvino_server.py --port PORT --target IR_DIR (--draft IR_DIR | --lookup)
        [--num-assistant-tokens K (3)] [--max-ngram-size M (3)] [--threads N (1)]

Endpoints (JSON in and out; 400 for a malformed request, 500 for an engine failure, the body
``{"error": ...}`` naming what failed):

- ``GET /health``: 200 once both the pipeline and the law's model are compiled, with the
  versions, V, its process id, the requests served and how many of them had counters read
  with short steps (:func:`draft_model_counts`).
- ``POST /generate`` ``{prompt_ids, max_new_tokens, seed, sampling}`` -> ``{tokens, drafted,
  accepted}``: one ``LLMPipeline.generate`` on token ids with speculation on, exactly
  ``max_new_tokens`` new ids (``ignore_eos``), ``rng_seed = seed``; ``sampling`` is
  ``{temperature (null: greedy, do_sample false), top_k, top_p, min_p}`` (null: off). The draft
  counters are derived per request as :func:`draft_model_counts` and
  :func:`prompt_lookup_counts` explain.
- ``POST /law`` ``{prefix_ids, sampling}`` -> ``{probs: [V floats]}``: the engine's own
  non-speculative next-token law after the whole prefix: the exported ``openvino_model.xml``
  compiled directly (f32 compute and KV cache, one thread), its last logits processed as
  OpenVINO GenAI's sampler processes them (:func:`processed_law`).

Every model runs with ``INFERENCE_PRECISION_HINT=f32``, ``KV_CACHE_PRECISION=f32`` (the CPU
plug-in keeps the KV cache in f16 otherwise, even with the f32 hint: per-sequence log-probs
then differ from f32 by about 7e-5) and ``INFERENCE_NUM_THREADS`` (1 by default: the audit's
machine is shared), and the pipelines with an explicit ``SchedulerConfig``: prefix caching off
(with the latency-oriented default, prefix caching on, a draft-model pipeline failed once in
500 requests on ``sequence_group.cpp:32``'s ``content_length`` check), a 1 GB KV cache.

Sources: openvinotoolkit/openvino.genai at commit da1db864 (2026-08-21), the nearest stored
snapshot of the installed release 2026.4.1.0 (build ``2026.4.1.0-3408-ab01d1771e4``): the
installed library carries the same assertion strings and symbols, and the sampling and
verification read there were reproduced token for token by an emulation during issue 22's
investigation.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from typing import Any

import numpy as np

if __package__:
    from .json_server import RequestError, serve
else:  # run as a script by the engine's Python (python -I: its folder is not on sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from json_server import RequestError, serve  # type: ignore[import-not-found,no-redef]

PROPERTIES_F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
"""Plug-in properties of every compiled model (module docstring)."""


class CounterError(RuntimeError):
    """The engine's per-step counts admit no single reading (HTTP 500): the engine did not
    behave as the source read in :func:`draft_model_counts` says, so no counters are made up."""


# --------------------------------------------------------------------------- the sampler's law


def processed_law(
    logits: Any,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
) -> Any:
    """The law OpenVINO GenAI's multinomial sampler draws from, given one row of logits.

    Read from ``src/cpp/src/sampling/logit_processor.hpp`` (``LogitProcessor``'s constructor:
    the order ``top_k -> temperature -> min_p -> top_p``, each only when active),
    ``src/cpp/src/sampling/logit_transformers.hpp`` (``TopKFilter``, ``TemperatureLogitTransform``,
    ``MinPFilter``, ``TopPFilter``) and ``src/cpp/src/sampling/sampler.cpp``
    (``Sampler::_multinomial_sample``, ``Sampler::_greedy_sample``):

    1. **top_k** (active when ``0 < top_k``; a no-op when ``top_k >= V``): the k largest logits
       (``TopKFilter::apply``, a k-element min-heap fed in index order that admits a logit only
       when strictly larger than its minimum; the order among logits tied at the k-th value is
       the heap's, unspecified: here the lowest indices are kept).
    2. **temperature**: softmax of ``(logit - max) / T`` over the survivors in float32,
       normalised (``TemperatureLogitTransform::apply``, standard path; ``1/T`` is computed in
       float32 and multiplied). With top_k active, ``top_p == 1`` and ``min_p == 0`` the
       engine defers the exponential to the draw (``defer_expf``): weights
       ``exp(logit/T - max(logit/T))``, the same law.
    3. **min_p** (active when ``> 0``): keep the probabilities ``>= float32(min_p) * p_max``
       (``MinPFilter::apply``), **not** renormalised.
    4. **top_p** (active when ``float32(top_p) != 1``): sort the remaining probabilities in
       decreasing order (``std::sort``/``std::partial_sort``: the order of equal probabilities
       is unspecified; here the lower index first) and keep the shortest prefix whose float32
       running sum is strictly greater than ``top_p`` (all of them if none is), **not**
       renormalised (``TopPFilter::apply``). The running sum starts from the
       min_p-filtered, unrenormalised probabilities, so after min_p the nucleus holds
       ``top_p`` of the mass *before* min_p's cut.
    5. **draw**: ``r = total_weight * u``, the first survivor whose running weight exceeds
       ``r`` (``_multinomial_sample``): each survivor with probability weight / total weight.

    The returned law is that last step's, in float64. Greedy decoding (``temperature`` None)
    applies none of these (``LogitProcessor`` adds the filters only for multinomial sampling)
    and takes the first largest logit (``_greedy_sample``'s strict ``>`` scan): the returned
    law is then the unprocessed softmax, whose lowest-index argmax is that token.

    Args:
        logits: ``[V]`` float32 logits of the next token.
        temperature: > 0, or None for greedy decoding.
        top_k: k, or None/0 for off.
        top_p: in (0, 1], or None for off (1.0).
        min_p: in [0, 1], or None for off (0.0).

    Returns:
        ``[V]`` float64 probabilities summing to 1 (0 outside the survivors).

    Raises:
        ValueError: ``logits`` is not one row of finite values.
    """
    row = np.asarray(logits, dtype=np.float32)
    if row.ndim != 1 or row.size == 0 or not np.all(np.isfinite(row)):
        raise ValueError(f"logits: expected one row of finite values, got shape {row.shape}")
    size = row.size
    if temperature is None:
        return _softmax64(row)
    scale = np.float32(1.0) / np.float32(temperature)
    k = int(top_k or 0)
    nucleus = np.float32(1.0 if top_p is None else top_p)
    floor = np.float32(0.0 if min_p is None else min_p)
    ids = np.arange(size)
    top_k_active = 0 < k < size
    if top_k_active:
        ids = np.sort(np.argsort(-row, kind="stable")[:k])
    values = row[ids]
    law = np.zeros(size, dtype=np.float64)
    if top_k_active and nucleus == np.float32(1.0) and not floor > 0:
        # defer_expf: the logits are scaled first, then the draw subtracts their maximum.
        scaled = values if temperature == 1.0 else values * scale
        weights = np.exp(scaled - scaled.max()).astype(np.float64)
        law[ids] = weights / weights.sum()
        return law
    shifted = values - values.max()
    weights = np.exp(shifted if temperature == 1.0 else shifted * scale).astype(np.float32)
    probs = weights / np.cumsum(weights, dtype=np.float32)[-1]
    if floor > 0:
        kept = probs >= np.float32(floor * probs.max())
        ids, probs = ids[kept], probs[kept]
    if nucleus != np.float32(1.0):
        order = np.argsort(-probs, kind="stable")
        running = np.cumsum(probs[order], dtype=np.float32)
        # TopPFilter keeps m_top_p as a double made from the float top_p and compares the
        # float running sum with it: the comparison is exact in float64.
        over = np.nonzero(running.astype(np.float64) > float(nucleus))[0]
        count = int(over[0]) + 1 if over.size else order.size
        ids, probs = ids[order[:count]], probs[order[:count]]
    mass = probs.astype(np.float64)
    law[ids] = mass / mass.sum()
    return law


def _softmax64(row: Any) -> Any:
    shifted = row.astype(np.float64) - float(row.max())
    weights = np.exp(shifted)
    return weights / weights.sum()


# --------------------------------------------------------------------------- draft counters


def draft_model_counts(
    step_counts: list[int], new_tokens: int, num_assistant_tokens: int, greedy: bool
) -> tuple[int, int, int]:
    """(drafted, accepted, short steps) of one draft-model request, from the main model's
    per-step counts.

    Why not the engine's own counters: ``SDPerModelsPerfMetrics`` (``extended_perf_metrics``)
    skips the acceptance of the step that finishes the request
    (``fast_draft_strategy.cpp``, ``SpeculativeDecodingImpl::step``: ``if
    (updated_seq_info.inserted_tokens_cnt == 0 || main_generated_requests.empty())
    continue;``) and counts drafts from the draft pipeline's insertions, so its totals are
    not the request's: ``get_num_accepted_tokens`` can exceed ``get_num_draft_tokens`` (2
    accepted of 0 drafted for 4 tokens), and a request read below as 4 accepted of 6 drafted
    was reported 3 of 5. What is reliable is the main model's ``raw_metrics.m_batch_sizes``:
    one entry per main step, the sampler's iterations in that step
    (``SequenceGroupSamplingInfo::sampler_output.num_generated_tokens``,
    ``Sampler::sample_from_sequence_group``), and its number of steps
    (``raw_metrics.m_durations``).

    The reading (``sampler.cpp``, ``sample_from_sequence_group`` and ``validate_candidate``;
    ``pipeline_impl.cpp``, ``ContinuousBatchingForSpeculativeDecodingImpl::multistep``): the
    first step is the prefill and emits one token (count 1). Before a later step, with ``g``
    tokens generated, the draft proposes ``d = min(K, L - g - 1)`` tokens (``multistep`` stops
    at K or one token short of ``max_new_tokens``). The main model then validates them in
    order: all accepted emits ``d + 1`` tokens in ``d + 1`` iterations; a rejection of the
    j-th (0-based) emits ``j + 1`` tokens, in ``j + 1`` iterations when greedy (the mismatch's
    iteration emits the target's token and stops) and in ``j + 2`` when sampling (the
    rejected row's iteration ``continue``s to the next row, which is sampled and emitted);
    ``d = 0`` is one plain iteration. So every step emits its accepted drafts plus one, and
    accepted is always ``L - steps``.

    The drafted tokens need each step's ``d``, hence which steps rejected: the readings that
    end at exactly L tokens are searched (dynamic programming over (step, tokens so far)).
    With every ``d`` as above the reading is unique for every history with K <= 5 and L <= 18
    (checked exhaustively), and 1296 requests of both pipelines (K 1, 3, 4; L 2 to 16; greedy
    and sampling) each had one. The sampled draft path sometimes proposes fewer (a step after a
    rejection proposing none: counts ``[1, 2, 1, 1]`` for L 4, K 3, seen once in about 17000
    requests; the same path also draws some tokens from a row that is not the emitted
    prefix's, and a fixed seed does not always reproduce its output), so a step may be read
    as proposing fewer than ``d`` ("short"): the reading taken has the fewest short steps and,
    among those, the most drafted tokens, so that the acceptance share is never overstated.

    Args:
        step_counts: the main model's ``m_batch_sizes`` for the request.
        new_tokens: L, the tokens the request generated.
        num_assistant_tokens: K.
        greedy: whether the request decoded greedily.

    Returns:
        (draft tokens the main model was given, those it accepted, short steps read).

    Raises:
        CounterError: no reading at all.
    """
    counts = tuple(int(count) for count in step_counts)
    if not counts or counts[0] != 1:
        raise CounterError(f"the first main step must be the prefill's 1, got {list(counts)}")

    def outcomes(count: int, proposed: int) -> list[tuple[int, int]]:
        """(emitted, accepted) of a step of ``proposed`` drafts that gives ``count``."""
        if proposed == 0:
            return [(1, 0)] if count == 1 else []
        if greedy:
            return [(count, count - 1)] if 1 <= count <= proposed + 1 else []
        found = [(proposed + 1, proposed)] if count == proposed + 1 else []
        return found + ([(count - 1, count - 2)] if 2 <= count <= proposed + 1 else [])

    @functools.cache
    def best(step: int, generated: int) -> tuple[int, int, int] | None:
        """The best reading of steps ``step..`` after ``generated`` tokens:
        (short steps, -drafted, accepted), or None."""
        if step == len(counts):
            return (0, 0, 0) if generated == new_tokens else None
        if generated >= new_tokens:
            return None
        expected = min(num_assistant_tokens, new_tokens - generated - 1)
        found: tuple[int, int, int] | None = None
        for proposed in range(expected, -1, -1):
            for emitted, kept in outcomes(counts[step], proposed):
                rest = best(step + 1, generated + emitted)
                if rest is not None:
                    reading = (rest[0] + (proposed < expected), rest[1] - proposed, rest[2] + kept)
                    found = reading if found is None else min(found, reading)
        return found

    reading = best(1, 1)
    if reading is None:
        raise CounterError(
            f"main step counts {list(counts)} for L={new_tokens}, K={num_assistant_tokens}, "
            f"greedy={greedy} have no reading"
        )
    short, negative_drafted, accepted = reading
    return -negative_drafted, accepted, short


def lookup_candidates(context: list[int], wanted: int, max_ngram_size: int) -> list[int]:
    """The candidates prompt lookup proposes after ``context`` (prompt and generated tokens).

    ``ContinuousBatchingForPromptLookupImpl::generate_candidates``
    (``src/cpp/src/prompt_lookup/continuous_batching_for_prompt_lookup.cpp``): for n from
    ``max_ngram_size`` (at most half the context) down to 1, the *earliest* earlier occurrence
    of the context's last n tokens; the candidates are the (at most ``wanted``) tokens that
    follow it. None found: no candidates (the engine pads with id -1, which never matches).
    """
    if wanted <= 0:
        return []
    length = len(context)
    largest = max_ngram_size if max_ngram_size < length else length // 2
    for size in range(largest, 0, -1):
        ngram = context[length - size:]
        for start in range(length - size):
            if context[start:start + size] == ngram:
                follow = start + size
                return context[follow:follow + min(length - follow, wanted)]
    return []


def prompt_lookup_counts(
    prompt: list[int],
    tokens: list[int],
    step_counts: list[int],
    num_assistant_tokens: int,
    max_ngram_size: int,
) -> tuple[int, int]:
    """(drafted, accepted) of one prompt-lookup request, replayed from its output.

    The engine reports no draft counters for prompt lookup (``extended_perf_metrics`` is None)
    and pads every step's candidates to K with id -1, so the real candidates are replayed:
    validation is sample-and-match for greedy and sampling alike (``validate_candidate`` with
    ``has_real_probabilities`` false: accept while the target's token equals the candidate,
    stop at the first mismatch, whose iteration emits the target's token), so each step's
    count (``raw_metrics.m_batch_sizes``) is the tokens it emitted. Before each step after the
    prefill the candidates are :func:`lookup_candidates` of the prompt and the tokens so far,
    at most ``min(K, L - g - 1)`` (``generate_candidates_for_prompt_lookup``); the step
    accepted ``count - 1`` of them. The replay checks that the accepted tokens are the
    candidates' prefix and that the next token is not the next candidate.

    Args:
        prompt: the request's prompt ids.
        tokens: the L generated ids.
        step_counts: ``perf_metrics.raw_metrics.m_batch_sizes``.
        num_assistant_tokens: K.
        max_ngram_size: the request's ``max_ngram_size``.

    Returns:
        (real candidates proposed, those accepted).

    Raises:
        CounterError: the output and the counts disagree with that reading.
    """
    counts = [int(count) for count in step_counts]
    if not counts or counts[0] != 1 or sum(counts) != len(tokens):
        raise CounterError(
            f"prompt-lookup step counts {counts} do not add up to {len(tokens)} tokens"
        )
    generated, drafted, accepted = 1, 0, 0
    for count in counts[1:]:
        wanted = min(num_assistant_tokens, len(tokens) - generated - 1)
        candidates = lookup_candidates(prompt + tokens[:generated], wanted, max_ngram_size)
        kept = count - 1
        matched = tokens[generated:generated + kept] == candidates[:kept]
        stopped = kept == len(candidates) or tokens[generated + kept] != candidates[kept]
        if kept > len(candidates) or not matched or not stopped:
            raise CounterError(
                f"prompt-lookup step after {generated} tokens accepted {kept} of candidates "
                f"{candidates}, output {tokens}"
            )
        drafted += len(candidates)
        accepted += kept
        generated += count
    return drafted, accepted


# --------------------------------------------------------------------------- the engine


class Engine:
    """The pipeline with speculation on and the directly compiled target (module docstring).

    Args:
        target: the target's OpenVINO IR directory (``optimum-cli export openvino``'s).
        draft: the draft's IR directory, or None with ``lookup``.
        lookup: prompt lookup instead of a draft model.
        num_assistant_tokens: K, candidates per step.
        max_ngram_size: prompt lookup's n-gram size.
        threads: ``INFERENCE_NUM_THREADS``.
    """

    def __init__(
        self,
        target: str,
        draft: str | None,
        lookup: bool,
        num_assistant_tokens: int,
        max_ngram_size: int,
        threads: int,
    ) -> None:
        import openvino as ov  # the engine's environment only
        import openvino_genai as og

        self.ov, self.og = ov, og
        self.lookup = lookup
        self.num_assistant_tokens = num_assistant_tokens
        self.max_ngram_size = max_ngram_size
        properties: dict[str, Any] = {**PROPERTIES_F32, "INFERENCE_NUM_THREADS": threads}
        scheduler = og.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        scheduler.cache_size = 1
        if lookup:
            self.pipeline = og.LLMPipeline(
                target, "CPU", scheduler_config=scheduler, prompt_lookup=True, **properties
            )
        else:
            self.pipeline = og.LLMPipeline(
                target, "CPU", scheduler_config=scheduler,
                draft_model=og.draft_model(draft, "CPU", **properties), **properties,
            )
        compiled = ov.Core().compile_model(f"{target}/openvino_model.xml", "CPU", properties)
        self.vocab_size = int(compiled.output("logits").get_partial_shape()[2].get_length())
        self.request = compiled.create_infer_request()
        # One request at a time: the pipeline and the infer request keep state.
        self.lock = threading.Lock()
        self.requests = 0
        self.short_requests = 0  # draft-model requests whose counts needed short steps
        self.versions = {"openvino": ov.get_version(), "openvino_genai": og.get_version()}

    def _check_ids(self, name: str, ids: Any) -> list[int]:
        if not isinstance(ids, list) or not ids or not all(
            isinstance(token, int) and 0 <= token < self.vocab_size for token in ids
        ):
            raise RequestError(f"{name}: expected a non-empty list of ids in [0, "
                               f"{self.vocab_size}), got {ids!r:.200}")
        return list(ids)

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One request with speculation on (``POST /generate``).

        Raises:
            RequestError: a malformed field, named.
            CounterError: the counts admit no single reading.
            RuntimeError: the engine returned another number of tokens than asked.
        """
        prompt = self._check_ids("prompt_ids", payload.get("prompt_ids"))
        new_tokens, seed = payload.get("max_new_tokens"), payload.get("seed")
        if not isinstance(new_tokens, int) or new_tokens < 1:
            raise RequestError(f"max_new_tokens: expected an int >= 1, got {new_tokens!r}")
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise RequestError(f"seed: expected an int in [0, 2**64), got {seed!r}")
        temperature, top_k, top_p, min_p = _sampling(payload.get("sampling"))
        config = self.og.GenerationConfig()
        config.max_new_tokens = new_tokens
        config.ignore_eos = True  # exactly L tokens; not min_new_tokens, which masks EOS
        config.rng_seed = seed
        config.num_assistant_tokens = self.num_assistant_tokens
        if self.lookup:
            config.max_ngram_size = self.max_ngram_size
        if temperature is None:
            config.do_sample = False
        else:
            config.do_sample = True
            config.temperature = temperature
            config.top_k = top_k or 0  # 0: no top-k (LogitProcessor needs top_k > 0)
            config.top_p = 1.0 if top_p is None else top_p
            config.min_p = 0.0 if min_p is None else min_p
        ids = self.ov.Tensor(np.array([prompt], dtype=np.int64))
        with self.lock:
            result = self.pipeline.generate(ids, config)
            self.requests += 1
        tokens = [int(token) for token in result.tokens[0]]
        if len(tokens) != new_tokens:
            raise RuntimeError(f"asked for {new_tokens} tokens, the engine returned {tokens}")
        if self.lookup:
            raw = result.perf_metrics.raw_metrics
            drafted, accepted = prompt_lookup_counts(
                prompt, tokens, list(raw.m_batch_sizes), self.num_assistant_tokens,
                self.max_ngram_size,
            )
            steps = len(raw.token_infer_durations)
        else:
            raw = result.extended_perf_metrics.main_model_metrics.raw_metrics
            drafted, accepted, short = draft_model_counts(
                list(raw.m_batch_sizes), new_tokens, self.num_assistant_tokens,
                temperature is None,
            )
            steps = len(raw.m_durations)
            if short:
                self.short_requests += 1
                print(f"seed {seed}: main step counts {list(raw.m_batch_sizes)} read with "
                      f"{short} short step(s): drafted {drafted}, accepted {accepted}",
                      file=sys.stderr, flush=True)
        if accepted != new_tokens - steps:
            raise CounterError(f"accepted {accepted} but {new_tokens} tokens in {steps} steps")
        return {"tokens": tokens, "drafted": drafted, "accepted": accepted}

    def law(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The non-speculative next-token law after ``prefix_ids`` (``POST /law``).

        Raises:
            RequestError: a malformed field, named.
        """
        prefix = self._check_ids("prefix_ids", payload.get("prefix_ids"))
        sampling = _sampling(payload.get("sampling"))
        length = len(prefix)
        with self.lock:
            # The exported model is stateful (its KV cache is internal state): a fresh
            # state, then the whole prefix in one pass, as the pipeline's prefill.
            self.request.reset_state()
            self.request.infer({
                "input_ids": np.array([prefix], dtype=np.int64),
                "attention_mask": np.ones((1, length), dtype=np.int64),
                "position_ids": np.arange(length, dtype=np.int64)[None],
                "beam_idx": np.zeros(1, dtype=np.int32),
            })
            logits = np.array(self.request.get_tensor("logits").data[0, -1], dtype=np.float32)
        return {"probs": processed_law(logits, *sampling).tolist()}


def _sampling(value: Any) -> tuple[float | None, int | None, float | None, float | None]:
    """``{temperature, top_k, top_p, min_p}`` checked (RequestError naming the field)."""
    if not isinstance(value, dict):
        raise RequestError(f"sampling: expected an object, got {value!r:.200}")
    temperature, top_k = value.get("temperature"), value.get("top_k")
    top_p, min_p = value.get("top_p"), value.get("min_p")
    if temperature is not None and not (
        isinstance(temperature, (int, float)) and 0 < temperature < float("inf")
    ):
        raise RequestError(f"sampling.temperature: expected > 0 or null, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 0):
        raise RequestError(f"sampling.top_k: expected an int >= 0 or null, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise RequestError(f"sampling.top_p: expected a number in (0, 1] or null, got {top_p!r}")
    if min_p is not None and not (isinstance(min_p, (int, float)) and 0 <= min_p <= 1):
        raise RequestError(f"sampling.min_p: expected a number in [0, 1] or null, got {min_p!r}")
    return (
        None if temperature is None else float(temperature),
        top_k,
        None if top_p is None else float(top_p),
        None if min_p is None else float(min_p),
    )


# --------------------------------------------------------------------------- HTTP


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, build the engine, serve until terminated (SIGTERM ends it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True, help="the target's OpenVINO IR directory")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--draft", help="the draft's OpenVINO IR directory")
    mode.add_argument("--lookup", action="store_true", help="prompt lookup, no draft model")
    parser.add_argument("--num-assistant-tokens", type=int, default=3)
    parser.add_argument("--max-ngram-size", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    if options.num_assistant_tokens < 1 or options.max_ngram_size < 1 or options.threads < 1:
        parser.error("--num-assistant-tokens, --max-ngram-size and --threads must be >= 1")
    began = time.perf_counter()
    engine = Engine(
        options.target, options.draft, options.lookup, options.num_assistant_tokens,
        options.max_ngram_size, options.threads,
    )
    drafter = (
        f"prompt lookup (max_ngram_size {options.max_ngram_size})" if options.lookup
        else f"draft model {options.draft}"
    )
    description = (
        f"OpenVINO GenAI {engine.versions['openvino_genai']} LLMPipeline on CPU (f32, "
        f"{options.threads} thread(s)), {drafter}, num_assistant_tokens "
        f"{options.num_assistant_tokens}"
    )
    serve(
        options.port, {"/generate": engine.generate, "/law": engine.law},
        lambda: {"description": description, "vocab_size": engine.vocab_size,
                 **engine.versions, "pid": os.getpid(), "requests": engine.requests,
                 "short_step_requests": engine.short_requests},
        description, began,
    )


if __name__ == "__main__":
    main()
