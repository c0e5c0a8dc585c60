"""ONNX Runtime GenAI's ``Generator`` with speculation on, behind a loopback HTTP API (issue 22).

Run by the ONNX Runtime GenAI environment's Python
(:mod:`losslessness.adapters.e2e.onnxruntime_genai` builds it), never by the audit's: it
imports the standard library, numpy and ``onnxruntime_genai`` only (no torch, no
losslessness), so that nothing of the audit's environment is in the engine's process::

    python -I ortgenai_server.py --port PORT --target DIR
        (--speculative DIR | --ngram-size N) [--max-draft-tokens K] [--threads T]

``--target`` is the model builder's directory of the target (``genai_config.json``,
``model.onnx``); ``--speculative`` a directory whose ``genai_config.json`` is the target's with
a ``model.draft`` decoder (the draft model's) and a ``speculative`` section; ``--ngram-size``
turns on n-gram speculation on the plain target instead.

Endpoints (JSON in and out; 400 for a malformed request, 500 for an engine failure, the body
``{"error": ...}`` naming what failed):

- ``GET /health``: 200 once the models are loaded, with the version, V and the server's pid.
- ``POST /generate`` ``{prompt_ids, max_new_tokens, seed, sampling}`` -> ``{tokens, drafted,
  accepted, stats}``: one ``og.Generator`` on token ids with speculation on, run until it is
  done at ``max_length = len(prompt_ids) + max_new_tokens``, so exactly ``max_new_tokens``
  new ids (a request that ends earlier, at ``</s>``, is an error: the tiny models never emit
  it); ``random_seed = seed``; ``sampling`` is ``{temperature (null: greedy, do_sample
  false), top_k, top_p, min_p}`` (null: off; ``min_p`` must be null: ONNX Runtime GenAI has no
  min-p filter). ``drafted`` and ``accepted`` are the engine's own counters of the request
  (:meth:`Engine.generate`); ``stats`` its other counters.
- ``POST /law`` ``{prefix_ids, sampling}`` -> ``{probs: [V floats]}``: the engine's own
  non-speculative next-token law after the whole prefix: a plain ``og.Generator`` of the
  target (no draft, no n-gram) given the prefix with ``append_tokens``, its ``get_logits()``
  processed as the engine's sampler processes them (:func:`processed_law`).

Every ONNX Runtime session runs with ``intra_op_num_threads = inter_op_num_threads =
--threads`` (1 by default: the audit's machine is shared), set by ``og.Config.overlay`` on the
decoder and the draft.

Sources: microsoft/onnxruntime-genai at commit a0c04eb1 (2026-08-22, ``main``), the nearest
stored snapshot of the installed 0.18.0 (``onnxruntime_genai.__commit__`` 00d66ef0, not
stored). The installed library carries every user-visible string of the files read below
(``speculative_decoding_strategy.cpp``, ``base_speculative_strategy.cpp``,
``n_gram_decoding_strategy.cpp``) and the same ``SelectProposalToken`` signature, and the
reading was reproduced token for token against it (issue 22's investigation): an emulation of
``std::mt19937``, libstdc++'s ``std::discrete_distribution`` (which draws nothing for a
single-token law) and ``std::uniform_real_distribution<float>`` with :func:`processed_law`'s
truncation gave the engine's tokens for 160 plain sampled requests of 4 tokens, 500
draft-model requests of 6 tokens and 300 n-gram requests of 6 tokens (K = 3; temperatures
0.6 to 1.3, top-k 0, 5 and 20, top-p 0.8 to 1). The law agrees with transformers within
2.1e-6 at every prefix the audits asked.
"""

from __future__ import annotations

import argparse
import json
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

SEED_MODULUS = 2**31
"""``random_seed`` is a C++ ``int`` (``Config::Search::random_seed``; -1 draws a random seed):
request seeds are taken modulo 2**31, so consecutive seeds stay distinct."""

NUCLEUS_INITIAL_CANDIDATES = 16
NUCLEUS_GROWTH = 4
"""``FindNucleus``'s ``kInitialCandidateCount`` and ``kCandidateCountGrowthFactor``."""

COUNTERS = (
    "rounds", "draft_tokens_proposed", "draft_tokens_evaluated", "draft_tokens_accepted",
    "correction_tokens", "bonus_tokens", "tokens_emitted", "tokens_discarded",
    "standard_fallback_steps", "ngram_lookup_hits", "ngram_lookup_misses",
)
"""The counters of ``Generator.get_speculative_stats()`` each answer carries."""


# --------------------------------------------------------------------------- the sampler's law


def _nucleus_size(scores: Any, order: Any, p: np.float32, max_score: np.float32,
                  inv_temp: np.float32) -> int:
    """``FindNucleus`` (``src/sampling_distribution.h``) on float32 ``scores`` whose indices are
    sorted by decreasing score in ``order``: the number of leading tokens kept.

    The search sorts 16, then 64, 256, ... candidates; after each it adds ``exp((s - max) *
    inv_temp)`` of the newly sorted ones one by one (float32) and stops at the first ``i`` with
    ``prefix >= p * (prefix + (V - i - 1) * exp_i)`` (an upper bound of the unsorted tail),
    keeping ``i + 1`` tokens, unless that ``i`` is the last of its batch, in which case the
    search goes on with the next batch (``cutoff_index < k`` is false there). With ``V <= 64``
    the cutoff is then recomputed exactly. With ``p = 1`` (top-p off) the test only holds once
    the tail bound is below float32 rounding of the prefix, so tokens of relative weight below
    about ``1e-7 / V`` are dropped: the engine's law, reproduced here.
    """
    size = int(scores.size)
    weights = np.exp((scores[order] - max_score) * inv_temp).astype(np.float32)
    prefix = np.float32(0.0)
    sorted_count, k, cutoff = 0, min(NUCLEUS_INITIAL_CANDIDATES, size), 0
    while k <= size:
        cutoff = k
        for i in range(sorted_count, k):
            prefix = np.float32(prefix + weights[i])
            tail = np.float32(np.float32(size - i - 1) * weights[i])
            if prefix >= np.float32(p * np.float32(prefix + tail)):
                cutoff = i + 1
                break
        sorted_count = k
        if cutoff < k or k == size:
            break
        k = min(k * NUCLEUS_GROWTH, size)
    if size <= NUCLEUS_INITIAL_CANDIDATES * NUCLEUS_GROWTH:
        total = np.float32(0.0)
        for weight in weights:
            total = np.float32(total + weight)
        running = np.float32(0.0)
        for i, weight in enumerate(weights):
            running = np.float32(running + weight)
            if running >= np.float32(p * total):
                return i + 1
    return cutoff


def processed_law(
    logits: Any,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
) -> Any:
    """The law ONNX Runtime GenAI's CPU sampler draws from, given one row of logits.

    Read from ``src/generators.cpp`` (``Generator::InitializeSamplingMethod``),
    ``src/search.cpp`` (``GreedySearch_Cpu::SelectTop``, ``SampleTopK``, ``SampleTopP``,
    ``SampleTopKTopP``) and ``src/sampling_distribution.h`` (``ComputeSampledCategorical``,
    ``FindNucleus``, ``SampleCategoricalToken``); the speculative verifiers build every target
    row with the same ``ComputeSampledCategorical`` (``ComputeTargetTokenSelection``,
    ``src/speculative_sampling.h``):

    - **greedy** when ``do_sample`` is false, ``top_k == 1`` or ``temperature == 0``: the first
      largest logit (``ArgMax``). For ``temperature`` None the returned law is the unprocessed
      softmax, whose lowest-index argmax is that token; for ``top_k == 1`` with sampling it is
      the point mass there.
    - **top-k** (``top_k > 1``): the ``min(k, V)`` largest logits (``std::partial_sort``: the
      order of ties is unspecified; here the lower index first), weights ``exp((s - max) / T)``
      in float32 (``inv_temp = 1/T`` in float32, multiplied), normalised; then, when ``0 < top_p
      < 1``, the shortest prefix whose float32 running sum is ``>= top_p``; the kept weights
      renormalised. Temperature comes first: the nucleus is taken of the tempered law.
    - **top-p only** (``top_k`` 0 or None): the nucleus of the whole vocabulary by
      ``FindNucleus`` with ``p = top_p`` (1 when None: top-p off still goes through it, see
      :func:`_nucleus_size`), its weights ``exp((s - max) / T)`` renormalised.
    - **draw**: ``std::discrete_distribution`` over the kept weights: each with probability
      weight / total.

    There is no min-p filter in ONNX Runtime GenAI 0.18.0 (``Config::Search``).

    Args:
        logits: ``[V]`` float32 logits of the next token.
        temperature: > 0, or None for greedy decoding.
        top_k: k >= 0, or None (0: off).
        top_p: in (0, 1], or None (1: off).

    Returns:
        ``[V]`` float64 probabilities summing to 1 (0 outside the kept tokens).

    Raises:
        ValueError: ``logits`` is not one row of finite values.
    """
    row = np.asarray(logits, dtype=np.float32)
    if row.ndim != 1 or row.size == 0 or not np.all(np.isfinite(row)):
        raise ValueError(f"logits: expected one row of finite values, got shape {row.shape}")
    size = row.size
    law = np.zeros(size, dtype=np.float64)
    k = int(top_k or 0)
    if temperature is None:
        shifted = row.astype(np.float64) - float(row.max())
        weights64 = np.exp(shifted)
        return weights64 / weights64.sum()
    if k == 1:
        law[int(np.argmax(row))] = 1.0
        return law
    inv_temp = np.float32(np.float32(1.0) / np.float32(temperature))
    nucleus = np.float32(1.0 if top_p is None else top_p)
    order = np.argsort(-row, kind="stable")
    max_score = row[order[0]]
    if k > 1:
        kept = order[: min(k, size)]
        weights = np.exp((row[kept] - max_score) * inv_temp).astype(np.float32)
        probs = (weights / np.cumsum(weights, dtype=np.float32)[-1]).astype(np.float32)
        if np.float32(0.0) < nucleus < np.float32(1.0):
            running = np.cumsum(probs, dtype=np.float32)
            reached = np.nonzero(running >= nucleus)[0]
            count = int(reached[0]) + 1 if reached.size else kept.size
            kept, probs = kept[:count], probs[:count]
        probs = _normalised(probs)  # renormalised over the kept set, by the inverse sum
    else:
        count = _nucleus_size(row, order, nucleus, max_score, inv_temp)
        kept = order[:count]
        probs = _normalised(np.exp((row[kept] - max_score) * inv_temp).astype(np.float32))
    # std::discrete_distribution normalises the float weights again, in double.
    mass = probs.astype(np.float64)
    law[kept] = mass / mass.sum()
    return law


def _normalised(weights: Any) -> Any:
    """float32 ``weights`` times ``1 / sum`` as ``ComputeSampledCategorical`` does (the sum
    accumulated in order, in float32)."""
    total = np.cumsum(weights, dtype=np.float32)[-1]
    inverse = np.float32(np.float32(1.0) / total) if total > 0 else np.float32(0.0)
    return (weights * inverse).astype(np.float32)


# --------------------------------------------------------------------------- the engine


class Engine:
    """The speculative model and the plain target (module docstring).

    Args:
        target: the target's model-builder directory.
        speculative: the composite directory (target + ``model.draft``), or None with n-gram.
        ngram_size: n-gram speculation's N (2-16), or 0 with a draft model.
        max_draft_tokens: K, draft tokens per round.
        threads: ONNX Runtime's intra- and inter-op threads per session.

    Raises:
        ValueError: neither or both of ``speculative`` and ``ngram_size``.
    """

    def __init__(
        self,
        target: str,
        speculative: str | None,
        ngram_size: int,
        max_draft_tokens: int,
        threads: int,
    ) -> None:
        import onnxruntime_genai as og  # the engine's environment only

        if (speculative is None) == (ngram_size == 0):
            raise ValueError("exactly one of speculative and ngram_size must be given")
        self.og = og
        self.ngram_size = ngram_size
        self.max_draft_tokens = max_draft_tokens
        session = {"intra_op_num_threads": threads, "inter_op_num_threads": threads}
        self.plain = og.Model(self._config(target, {"decoder": {"session_options": session}}))
        if speculative is None:
            # n-gram speculation needs no second model: GeneratorParams turns it on.
            self.speculative = self.plain
        else:
            self.speculative = og.Model(self._config(speculative, {
                "decoder": {"session_options": session}, "draft": {"session_options": session},
            }))
        with open(f"{target}/genai_config.json") as handle:
            self.vocab_size = int(json.load(handle)["model"]["vocab_size"])
        # One request at a time: a Generator is cheap, but the models' sessions are shared.
        self.lock = threading.Lock()
        self.versions = {"onnxruntime_genai": og.__version__,
                         "onnxruntime_genai_commit": getattr(og, "__commit__", "")}

    def _config(self, directory: str, model_overlay: dict[str, Any]) -> Any:
        config = self.og.Config(directory)
        config.clear_providers()  # the CPU execution provider
        config.overlay(json.dumps({"model": model_overlay}))
        return config

    def _check_ids(self, name: str, ids: Any) -> list[int]:
        if not isinstance(ids, list) or not ids or not all(
            isinstance(token, int) and 0 <= token < self.vocab_size for token in ids
        ):
            raise RequestError(f"{name}: expected a non-empty list of ids in [0, "
                               f"{self.vocab_size}), got {ids!r:.200}")
        return list(ids)

    def _search_options(
        self, max_length: int, sampling: tuple[float | None, int | None, float | None],
        seed: int,
    ) -> dict[str, Any]:
        temperature, top_k, top_p = sampling
        if top_k is not None and top_k > self.vocab_size:
            raise RequestError(f"sampling.top_k: at most V = {self.vocab_size}, got {top_k}")
        options: dict[str, Any] = {
            "max_length": max_length, "min_length": 0, "num_beams": 1,
            "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "random_seed": seed,
        }
        if temperature is None:
            options["do_sample"] = False
        else:
            # Every filter set: the builder's genai_config.json says top_k 50, which would
            # otherwise apply; top_p 1.0, not 0 (0 keeps only the top token in FindNucleus).
            options.update(do_sample=True, temperature=float(temperature),
                           top_k=int(top_k or 0), top_p=float(1.0 if top_p is None else top_p))
        return options

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One request with speculation on (``POST /generate``).

        ``drafted`` is ``draft_tokens_proposed`` and ``accepted`` ``draft_tokens_accepted`` of
        ``Generator.get_speculative_stats()`` (``SpeculativeDecodingStrategy::GetStats``): the
        draft tokens the proposer returned in the request's rounds (``BeginRound`` adds each
        round's K after ``max_length`` clamps it) and those the verifier accepted, whether or not
        the round ended at ``max_length`` (a round's accepted tokens are emitted before its
        correction or bonus token, so only that last token can be dropped). An n-gram lookup
        that finds nothing proposes nothing: that step is a plain decoding step
        (``standard_fallback_steps``) and counts no draft.

        Raises:
            RequestError: a malformed field, named.
            RuntimeError: the engine returned another number of tokens than asked.
        """
        prompt = self._check_ids("prompt_ids", payload.get("prompt_ids"))
        new_tokens, seed = payload.get("max_new_tokens"), payload.get("seed")
        if not isinstance(new_tokens, int) or new_tokens < 1:
            raise RequestError(f"max_new_tokens: expected an int >= 1, got {new_tokens!r}")
        if not isinstance(seed, int) or seed < 0:
            raise RequestError(f"seed: expected an int >= 0, got {seed!r}")
        og = self.og
        params = og.GeneratorParams(self.speculative)
        params.set_search_options(**self._search_options(
            len(prompt) + new_tokens, _sampling(payload.get("sampling")), seed % SEED_MODULUS,
        ))
        speculative: dict[str, Any] = {"max_draft_tokens": self.max_draft_tokens}
        if self.ngram_size:
            speculative["ngram_size"] = self.ngram_size
        params.set_speculative_options(**speculative)
        with self.lock:
            generator = og.Generator(self.speculative, params)
            generator.append_tokens(np.asarray(prompt, dtype=np.int32))
            while not generator.is_done():
                generator.generate_next_token()
            sequence = [int(token) for token in generator.get_sequence(0)]
            stats = generator.get_speculative_stats()
        tokens = sequence[len(prompt):]
        if sequence[:len(prompt)] != prompt or len(tokens) != new_tokens:
            raise RuntimeError(f"asked for {new_tokens} tokens after {len(prompt)}, the engine "
                               f"returned the sequence {sequence}")
        counters = {name: int(stats.get(name, 0)) for name in COUNTERS}
        return {"tokens": tokens, "drafted": counters["draft_tokens_proposed"],
                "accepted": counters["draft_tokens_accepted"], "stats": counters}

    def law(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The non-speculative next-token law after ``prefix_ids`` (``POST /law``).

        Raises:
            RequestError: a malformed field, named.
        """
        prefix = self._check_ids("prefix_ids", payload.get("prefix_ids"))
        sampling = _sampling(payload.get("sampling"))
        og = self.og
        params = og.GeneratorParams(self.plain)
        params.set_search_options(**self._search_options(len(prefix) + 1, sampling, 0))
        with self.lock:
            generator = og.Generator(self.plain, params)
            generator.append_tokens(np.asarray(prefix, dtype=np.int32))
            logits = np.array(generator.get_logits(), dtype=np.float32)
        if logits.shape[-1] != self.vocab_size:
            raise RuntimeError(f"get_logits() has shape {logits.shape}, V = {self.vocab_size}")
        row = logits.reshape(-1, self.vocab_size)[-1]
        return {"probs": processed_law(row, *sampling).tolist()}


def _sampling(value: Any) -> tuple[float | None, int | None, float | None]:
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
    if min_p is not None:
        raise RequestError("sampling.min_p: ONNX Runtime GenAI has no min-p filter; must be null")
    return (
        None if temperature is None else float(temperature),
        top_k,
        None if top_p is None else float(top_p),
    )


# --------------------------------------------------------------------------- HTTP


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, load the models, serve until terminated (SIGTERM ends it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True, help="the target's model-builder directory")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--speculative", help="the directory of target + model.draft")
    mode.add_argument("--ngram-size", type=int, help="n-gram speculation's N (2-16)")
    parser.add_argument("--max-draft-tokens", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args(argv)
    if options.ngram_size is not None and not 2 <= options.ngram_size <= 16:
        parser.error("--ngram-size must be in [2, 16]")
    if not 1 <= options.max_draft_tokens <= 16 or options.threads < 1:
        parser.error("--max-draft-tokens must be in [1, 16] and --threads >= 1")
    began = time.perf_counter()
    engine = Engine(options.target, options.speculative, options.ngram_size or 0,
                    options.max_draft_tokens, options.threads)
    drafter = (
        f"n-gram speculation (ngram_size {options.ngram_size})" if options.ngram_size
        else f"draft model ({options.speculative})"
    )
    description = (
        f"ONNX Runtime GenAI {engine.versions['onnxruntime_genai']} Generator on CPU (fp32, "
        f"{options.threads} thread(s)), {drafter}, max_draft_tokens {options.max_draft_tokens}"
    )
    serve(
        options.port, {"/generate": engine.generate, "/law": engine.law},
        lambda: {"description": description, "vocab_size": engine.vocab_size,
                 "pid": os.getpid(), **engine.versions},
        description, began,
    )


if __name__ == "__main__":
    main()
