"""vLLM's CPU build, its offline ``LLM`` with speculative decoding on, behind a loopback HTTP
API (issue 22).

Run by the vLLM environment's Python (:mod:`losslessness.adapters.e2e.vllm_cpu` builds it),
never by the audit's: it imports the standard library and ``vllm`` only, so that nothing of the
audit's environment is in the engine's processes::

    python -I vllm_server.py --port PORT --target DIR --method METHOD [--draft DIR]
        [--num-speculative-tokens K] [--draft-sample-method greedy|probabilistic]
        [--prompt-lookup-min N] [--prompt-lookup-max N] [--max-num-seqs B]

``METHOD`` is vLLM's ``speculative_config["method"]``: ``draft_model`` (``--draft``, a
Hugging Face directory of a draft model of the same vocabulary), ``ngram`` (prompt lookup of
``--prompt-lookup-min`` to ``--prompt-lookup-max`` tokens) or ``eagle`` (``--draft``, an
EAGLE head's directory).

Two engines are started in this process: the *speculative* one, with vLLM's defaults but for
the settings a user changes for a deterministic CPU run (``dtype="float32"``,
``enforce_eager=True``, no prefix caching, one seed for the engine), and a *plain* one,
identical without speculation, whose sampler gives the law: ``logprobs_mode=
"processed_logprobs"`` returns the log-probabilities the sampler draws from, after the
request's temperature, min-p, top-k and top-p (``vllm/v1/sample/sampler.py``,
``Sampler.sample``), and ``logprobs=-1`` returns all V of them. The speculative engine keeps the
default ``raw_logprobs`` mode: it is what users run.

Endpoints (JSON in and out; 400 for a malformed request, 500 for an engine failure, the body
``{"error": ...}`` naming what failed):

- ``GET /health``: 200 once both engines are up, with the versions, V and the server's pid.
- ``POST /generate_batch`` ``{prompt_ids, max_new_tokens, seeds, sampling}`` -> ``{sequences,
  drafted, accepted, per_position}``: one ``LLM.generate`` call on as many requests as seeds,
  request ``j`` seeded with ``seeds[j]`` (``SamplingParams.seed``: its own
  ``torch.Generator``), each generating exactly ``max_new_tokens`` tokens (``ignore_eos``).
  ``sampling`` is ``{temperature (null: greedy, temperature 0), top_k, top_p, min_p}`` (null:
  off). ``drafted`` and ``accepted`` are the engine's own counters
  (``vllm:spec_decode_num_draft_tokens`` and ``vllm:spec_decode_num_accepted_tokens`` of
  ``LLM.get_metrics()``), their increase over the call; ``per_position`` the increase of
  ``vllm:spec_decode_num_accepted_tokens_per_pos``.
- ``POST /generate`` ``{prompt_ids, max_new_tokens, seed, sampling}`` -> ``{tokens, drafted,
  accepted}``: the same, one request.
- ``POST /law`` ``{prefix_ids, sampling}`` -> ``{probs: [V floats]}``: the plain engine's
  sampler's law of the next token after the whole prefix (greedy: the unprocessed softmax,
  whose argmax greedy decoding takes).

Requests are served one at a time (a lock): the counters' increase over a call is that call's.
When an engine core dies (``EngineDeadError``) the server ends before it answers, so that the
request fails and the next one restarts it.

Sources: vllm-cpu 0.32.0 as installed (``vllm/entrypoints/llm.py``, ``vllm/v1/sample/
sampler.py``, ``vllm/v1/sample/rejection_sampler.py``, ``vllm/v1/spec_decode/``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

if __package__:
    from .json_server import RequestError, serve
else:  # run as a script by the engine's Python (python -I: its folder is not on sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from json_server import RequestError, serve  # type: ignore[import-not-found,no-redef]

METHODS = ("draft_model", "ngram", "eagle")
"""The speculative methods this server starts (vLLM's ``speculative_config["method"]``)."""

SEED_MODULUS = 2**63
"""``SamplingParams.seed`` seeds a ``torch.Generator`` (64-bit); request seeds are < 2**32."""

DRAFTED = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
"""The speculative engine's counters (``vllm/v1/spec_decode/metrics.py``)."""


def _ids(name: str, value: Any, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not value:
        raise RequestError(f"{name}: expected a non-empty list of token ids")
    if any(isinstance(token, bool) or not isinstance(token, int) for token in value):
        raise RequestError(f"{name}: expected ints")
    if any(not 0 <= token < vocab_size for token in value):
        raise RequestError(f"{name}: ids must be in [0, {vocab_size})")
    return list(value)


def _count(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name}: expected an int in [{low}, {high}], got {value!r}")
    return value


def _sampling(value: Any) -> dict[str, Any]:
    """The request's ``sampling`` as ``SamplingParams`` keywords (vLLM's "off" values for
    null fields: top-k 0, top-p 1, min-p 0; greedy is temperature 0)."""
    if not isinstance(value, dict):
        raise RequestError("sampling: expected an object")
    unknown = set(value) - {"temperature", "top_k", "top_p", "min_p"}
    if unknown:
        raise RequestError(f"sampling: unknown fields {sorted(unknown)}")
    temperature, top_k = value.get("temperature"), value.get("top_k")
    top_p, min_p = value.get("top_p"), value.get("min_p")
    for name, number in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
        if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)
                                   or not math.isfinite(number)):
            raise RequestError(f"sampling.{name}: expected a number or null, got {number!r}")
    if temperature is not None and temperature <= 0:
        raise RequestError(f"sampling.temperature: must be > 0 or null, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise RequestError(f"sampling.top_k: expected an int >= 1 or null, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise RequestError(f"sampling.top_p: must be in (0, 1] or null, got {top_p!r}")
    if min_p is not None and not 0 <= min_p <= 1:
        raise RequestError(f"sampling.min_p: must be in [0, 1] or null, got {min_p!r}")
    return {
        "temperature": 0.0 if temperature is None else float(temperature),
        "top_k": 0 if top_k is None else int(top_k),
        "top_p": 1.0 if top_p is None else float(top_p),
        "min_p": 0.0 if min_p is None else float(min_p),
    }


def _alive(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``; when vLLM's engine core has died (``EngineDeadError``: every
    later request would fail the same way), the error goes to the log and the server ends at
    once, without answering (SIGTERM: its process group with it), so that this request fails
    and the client's next request starts a fresh server."""
    try:
        return call(*args, **kwargs)
    except Exception as error:
        if type(error).__name__ == "EngineDeadError":
            traceback.print_exc()
            print("the engine core died: the server ends", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        raise


class Engine:
    """The speculative and the plain engine (module docstring).

    Args:
        arguments: the command line's.
    """

    def __init__(self, arguments: argparse.Namespace) -> None:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        self.SamplingParams, self.TokensPrompt = SamplingParams, TokensPrompt
        with open(os.path.join(arguments.target, "config.json")) as handle:
            self.vocab_size = int(json.load(handle)["vocab_size"])
        speculative: dict[str, Any] = {
            "method": arguments.method,
            "num_speculative_tokens": arguments.num_speculative_tokens,
        }
        if arguments.method in ("draft_model", "eagle"):
            if not arguments.draft:
                raise SystemExit(f"--draft: required by --method {arguments.method}")
            speculative["model"] = arguments.draft
        if arguments.method == "draft_model":
            speculative["draft_sample_method"] = arguments.draft_sample_method
        if arguments.method == "ngram":
            speculative["prompt_lookup_min"] = arguments.prompt_lookup_min
            speculative["prompt_lookup_max"] = arguments.prompt_lookup_max
        common: dict[str, Any] = {
            "model": arguments.target, "dtype": "float32", "enforce_eager": True,
            "skip_tokenizer_init": True, "seed": 0, "max_model_len": arguments.max_model_len,
            "enable_prefix_caching": False, "max_num_seqs": arguments.max_num_seqs,
        }
        self.speculative_config = speculative
        self.speculative = LLM(speculative_config=speculative, disable_log_stats=False,
                               **common)
        self.plain = LLM(logprobs_mode="processed_logprobs", max_logprobs=self.vocab_size,
                         **common)
        self.lock = threading.Lock()
        import vllm

        self.version = getattr(vllm, "__version__", "")

    def health(self) -> dict[str, Any]:
        """Versions, V, the speculative configuration and the pid."""
        import torch

        return {"vllm": self.version, "torch": torch.__version__, "vocab_size": self.vocab_size,
                "speculative_config": self.speculative_config, "pid": os.getpid()}

    def _counters(self) -> dict[str, Any]:
        found: dict[str, Any] = {DRAFTED: 0, ACCEPTED: 0, PER_POSITION: []}
        for metric in self.speculative.get_metrics():
            if metric.name in (DRAFTED, ACCEPTED):
                found[metric.name] = int(metric.value)
            elif metric.name == PER_POSITION:
                found[metric.name] = [int(value) for value in metric.values]
        return found

    def _batch(self, prompt: list[int], max_new_tokens: int, seeds: list[int],
               sampling: dict[str, Any]) -> dict[str, Any]:
        params = [
            self.SamplingParams(max_tokens=max_new_tokens, seed=seed % SEED_MODULUS,
                                ignore_eos=True, detokenize=False, **sampling)
            for seed in seeds
        ]
        prompts = [self.TokensPrompt(prompt_token_ids=list(prompt)) for _ in seeds]
        with self.lock:
            before = self._counters()
            outputs = _alive(self.speculative.generate, prompts, params, use_tqdm=False)
            after = self._counters()
        sequences = [[int(token) for token in output.outputs[0].token_ids] for output in outputs]
        short = [len(tokens) for tokens in sequences if len(tokens) != max_new_tokens]
        if short:
            raise RuntimeError(f"vLLM returned {short[0]} tokens where {max_new_tokens} were "
                               "asked (ignore_eos is set)")
        positions = len(after[PER_POSITION])
        previous = before[PER_POSITION] + [0] * (positions - len(before[PER_POSITION]))
        return {
            "sequences": sequences,
            "drafted": after[DRAFTED] - before[DRAFTED],
            "accepted": after[ACCEPTED] - before[ACCEPTED],
            "per_position": [a - b for a, b in zip(after[PER_POSITION], previous, strict=True)],
        }

    def generate_batch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /generate_batch`` (module docstring)."""
        prompt = _ids("prompt_ids", payload.get("prompt_ids"), self.vocab_size)
        max_new_tokens = _count("max_new_tokens", payload.get("max_new_tokens"), 1, 64)
        seeds = payload.get("seeds")
        if not isinstance(seeds, list) or not seeds:
            raise RequestError("seeds: expected a non-empty list of ints")
        seeds = [_count("seeds[]", seed, 0, 2**63 - 1) for seed in seeds]
        return self._batch(prompt, max_new_tokens, seeds, _sampling(payload.get("sampling")))

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /generate`` (module docstring)."""
        prompt = _ids("prompt_ids", payload.get("prompt_ids"), self.vocab_size)
        max_new_tokens = _count("max_new_tokens", payload.get("max_new_tokens"), 1, 64)
        seed = _count("seed", payload.get("seed"), 0, 2**63 - 1)
        answer = self._batch(prompt, max_new_tokens, [seed], _sampling(payload.get("sampling")))
        return {"tokens": answer["sequences"][0], "drafted": answer["drafted"],
                "accepted": answer["accepted"]}

    def law(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /law`` (module docstring)."""
        prefix = _ids("prefix_ids", payload.get("prefix_ids"), self.vocab_size)
        params = self.SamplingParams(max_tokens=1, seed=0, logprobs=-1, detokenize=False,
                                     **_sampling(payload.get("sampling")))
        with self.lock:
            output = _alive(self.plain.generate, [self.TokensPrompt(prompt_token_ids=prefix)],
                            params, use_tqdm=False)[0]
        logprobs = output.outputs[0].logprobs
        if not logprobs or len(logprobs[0]) != self.vocab_size:
            raise RuntimeError(f"vLLM returned {len(logprobs[0]) if logprobs else 0} "
                               f"log-probabilities where {self.vocab_size} were asked")
        row = logprobs[0]
        return {"probs": [math.exp(row[token].logprob) for token in range(self.vocab_size)]}


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, start both engines, serve."""
    began = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--draft")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--draft-sample-method", choices=("greedy", "probabilistic"),
                        default="greedy")
    parser.add_argument("--prompt-lookup-min", type=int, default=1)
    parser.add_argument("--prompt-lookup-max", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=256)
    arguments = parser.parse_args(argv)
    engine = Engine(arguments)
    serve(arguments.port, {"/generate": engine.generate, "/generate_batch":
                           engine.generate_batch, "/law": engine.law}, engine.health,
          f"vLLM {engine.version} ({arguments.method})", began)


if __name__ == "__main__":
    main()
