"""ONNX Runtime GenAI with speculation on, audited end to end: ``e2e/onnxruntime-genai-draft``
(a draft model) and ``e2e/onnxruntime-genai-ngram`` (n-gram speculation) (issue 22).

**Environment.** ONNX Runtime GenAI 0.18.0 and its model builder get a venv of their own,
built once and cached under ``cache_root()/onnxruntime-genai-0.18.0``
(:func:`ensure_ortgenai_environment`): exactly :data:`ORTGENAI_PACKAGES` and what they pull,
torch held to the repository's ``constraints.txt`` (the CPU build). The builder
(``onnxruntime_genai.models.builder``) imports onnx, onnx-ir, torch and transformers; the venv
also has sentencepiece and protobuf, with which transformers reads the tiny models'
SentencePiece ``tokenizer.model`` and the builder writes the ``tokenizer.json`` ONNX Runtime
GenAI's tokenizer reads. The tiny target and draft
(:func:`~losslessness.adapters.e2e.models.build_tiny_models`) are converted with ``python -m
onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e cpu``
(:func:`convert_tiny_models`), and the converted tokenizer is checked to encode the default
prompts as the SentencePiece model does.

**Speculation** (``src/decoding_strategy.cpp``, ``MakeDecodingStrategy``): a ``model.draft``
decoder in ``genai_config.json`` selects ``BaseSpeculativeStrategy`` (draft model);
``speculative.ngram_size > 0`` (``GeneratorParams.set_speculative_options``) on a plain model
selects ``NGramDecodingStrategy``; ``speculative.max_draft_tokens`` is K. The draft model's
composite directory (``speculative/``) is the target's files with the draft's in ``draft/``
(the config refuses paths with ``..``) and the target's ``genai_config.json`` plus
``model.draft`` (the draft's decoder block, ``filename: draft/model.onnx``) and ``speculative:
{max_draft_tokens: K}``.

**Verification** (``src/speculative_decoding_strategy.cpp``, ``RunRound``;
``src/speculative_sampling.h``): greedy requests accept a draft while it equals the target's
argmax. Sampled requests with a draft model use rejection sampling: the draft samples d_i from
its truncated law q_i (same top-k/top-p/temperature: ``BaseSpeculativeStrategy::Propose``,
``SelectProposalToken``), the target accepts with probability ``min(1, p_i(d_i) / q_i(d_i))``
(``ComputeAcceptProb``), a rejection emits a draw of ``norm(max(0, p - q))``
(``SampleCorrectionToken``), a fully accepted round a bonus draw of the next target row.
n-gram proposals are deterministic: the target samples each row and keeps the proposal while
its sample equals it (``VerifyDeterministicProposal``). Both are exact by design: expected
LOSSLESS.

**The law** is the engine's own: a plain ``og.Generator`` of the target given the prefix,
``get_logits()``, processed as ONNX Runtime GenAI's sampler does
(:func:`losslessness.adapters.e2e.shims.ortgenai_server.processed_law`: temperature, then
top-k, then top-p; ``FindNucleus`` even with top-p off). With that law and an emulation of
``std::mt19937`` and libstdc++'s distributions, the installed engine's tokens were reproduced
token for token: 160 plain sampled requests, 500 draft-model requests and 300 n-gram requests
(the shim's module docstring): the verification rules above are what 0.18.0 runs.

**Cases.** ONNX Runtime GenAI has no min-p filter, so :data:`ORTGENAI_CASES` are
:data:`~losslessness.adapters.e2e.engine.DEFAULT_CASES` with the filtered case's min-p
removed (temperature 0.8, top-k 20, top-p 0.9). n-gram speculation only drafts when the last
``N - 1`` tokens occurred before, so its prompts are followed by the target's own greedy
continuation (:func:`~losslessness.adapters.e2e.models.continued_prompt_ids`).

**Predicted acceptance** (:mod:`losslessness.adapters.e2e.acceptance`):
``e2e/onnxruntime-genai-draft`` states the share of drafts the tiny models predict accepted,
the reference loop run with the engine's drafting (:data:`DRAFTING`); computed by :func:`main`
and cached (an adapter computes a missing one only when ``LOSSLESSNESS_E2E_BUILD=1``).
n-gram speculation gets none: the reference's n-gram proposer takes the earliest match, the
engine the most recent (``NGramLookup``), which changes the drafts.

The engine runs in a server of ours (:mod:`losslessness.adapters.e2e.shims.ortgenai_server`)
under the venv's Python, reached through :class:`OrtGenAIClient`; the adapters build nothing
unless ``LOSSLESSNESS_E2E_BUILD=1``: without the environment they are unavailable, naming
:data:`BUILD_COMMAND`.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from losslessness.adapters.base import Adapter, AdapterUnavailable
from losslessness.adapters.e2e.acceptance import DraftingScheme, case_predictor, prediction_lines
from losslessness.adapters.e2e.engine import (
    DEFAULT_CASES,
    PROMPTS,
    EngineCase,
    Sampling,
    engine_adapter,
)
from losslessness.adapters.e2e.environments import (
    EngineBuildError,
    EngineEnvironment,
    ShimClient,
    ensure_environment,
    locked,
    run_logged,
    size_bytes,
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

__all__ = [
    "BUILD_COMMAND",
    "DRAFTING",
    "ORTGENAI_CASES",
    "ORTGENAI_PACKAGES",
    "ConvertedModels",
    "OrtGenAIClient",
    "OrtGenAIEnvironment",
    "convert_tiny_models",
    "draft_adapter",
    "ensure_ortgenai_environment",
    "ngram_adapter",
    "ortgenai_client",
]

ORTGENAI_VERSION = "0.18.0"
"""The ONNX Runtime GenAI release audited."""

ORTGENAI_PACKAGES = (
    f"onnxruntime-genai=={ORTGENAI_VERSION}",
    "onnxruntime==1.32.0",
    "onnx==1.23.2",
    "onnx-ir==1.1.0",
    "transformers==5.24.0",
    "sentencepiece==0.2.3",
    "protobuf==7.36.2",
    "torch",
)
"""What the environment installs, pinned (the versions that resolved together: onnxruntime-genai
0.18.0 requires onnxruntime >= 1.31.0); torch, which the model builder imports but no package
here requires, at the version of the constraints file (the repository's pins the CPU build)."""

ENVIRONMENT_NAME = f"onnxruntime-genai-{ORTGENAI_VERSION}"
"""The environment's directory under :func:`~losslessness.adapters.e2e.models.cache_root`."""

BUILD_COMMAND = "python -m losslessness.adapters.e2e.onnxruntime_genai"
"""What builds the environment and the converted models (about 2 minutes and 1.3 GB)."""

MAX_DRAFT_TOKENS = 3
"""K: draft tokens (or n-gram proposals) per round."""

DRAFTING = DraftingScheme(MAX_DRAFT_TOKENS, greedy_drafting=False, end_margin=0)
"""The draft model's drafting, for the predicted acceptance (``src/speculative_decoding_strategy
.cpp``, ``RunRound``): the first round drafts right after the prompt (the prefill's logits
verify its first draft); a round with ``g`` of L tokens generated drafts ``min(K, L - g)``
tokens (``K = std::min(K, remaining)``, ``remaining = max_length - seed_length``), sampled from
the draft's law under the request's temperature, top-k and top-p, accepted with ``min(1,
p/q)``; greedy requests draft the argmax. Checked against the engine on the first prompt at
temperature 1: 2000 requests of 4 tokens gave the same per-request (drafted, accepted, rounds)
counts as the reference loop, within sampling error, and 5391 of 8619 drafts accepted (0.626;
an audit: 31517 of 50670, 0.622), the prediction 0.621 +- 0.006; the greedy case 3 of 4, as
predicted."""

NGRAM_SIZE = 2
"""n-gram speculation's N: proposals follow the most recent earlier occurrence of the last
``N - 1`` tokens (``NGramLookup``). N = 2 drafts on about a third of the steps of the n-gram
prompts, N = 3 on about a quarter (60 requests of 4 tokens, measured on the recipe-2 models)."""

SHIM = Path(__file__).with_name("shims") / "ortgenai_server.py"
"""The server script, run by the environment's Python."""

SERVER_STARTUP_TIMEOUT_S = 180.0
"""Seconds the server has to import ONNX Runtime GenAI and load the models (about 1 s alone,
far more on a loaded 2-core machine)."""

SERVER_REQUEST_TIMEOUT_S = 60.0
"""Seconds one request may take (about a millisecond each for the tiny models)."""

ORTGENAI_CASES = tuple(
    EngineCase(case.prompt, Sampling(case.sampling.temperature, case.sampling.top_k,
                                     case.sampling.top_p), case.new_tokens)
    for case in DEFAULT_CASES
)
""":data:`~losslessness.adapters.e2e.engine.DEFAULT_CASES` without min-p (module docstring)."""


OrtGenAIEnvironment = EngineEnvironment
"""The built ONNX Runtime GenAI environment (``cache_root()/onnxruntime-genai-0.18.0``)."""


@dataclass(frozen=True)
class ConvertedModels:
    """The tiny models converted by ONNX Runtime GenAI's model builder.

    Attributes:
        directory: where they are (under the environment, keyed by the models' recipe).
        target, draft: the builder's directories (``genai_config.json``, ``model.onnx``,
            ``model.onnx.data``, ``tokenizer.json``, ``tokenizer_config.json``).
        speculative: the composite directory of target and draft (module docstring).
        info: ``conversion.json``: seconds and bytes per model, the tokenizer check.
    """

    directory: Path
    target: Path
    draft: Path
    speculative: Path
    info: dict[str, Any]


def environment_directory() -> Path:
    """``cache_root()/onnxruntime-genai-0.18.0``."""
    return cache_root() / ENVIRONMENT_NAME


def _unavailable(what: str) -> AdapterUnavailable:
    return unavailable(what, BUILD_COMMAND, "about 2 minutes and 1.3 GB", environment_directory())


_VERSIONS_SCRIPT = """
import json, importlib.metadata as metadata
import onnxruntime_genai, onnxruntime, onnx, onnx_ir, transformers, torch, sentencepiece
import onnxruntime_genai.models.builder  # what the conversion runs
names = ["onnxruntime-genai", "onnxruntime", "onnx", "onnx-ir", "transformers", "tokenizers",
         "sentencepiece", "protobuf", "torch", "numpy"]
versions = {name: metadata.version(name) for name in names}
versions["onnxruntime-genai commit"] = getattr(onnxruntime_genai, "__commit__", "")
print(json.dumps(versions))
"""


def ensure_ortgenai_environment(build: bool = True) -> OrtGenAIEnvironment:
    """The ONNX Runtime GenAI environment, built on first use and cached (module docstring):
    :data:`ORTGENAI_PACKAGES`. See
    :func:`~losslessness.adapters.e2e.environments.ensure_environment`.

    Args:
        build: build what is missing; False: raise instead.

    Raises:
        AdapterUnavailable: it is not built and ``build`` is False (the message names
            :data:`BUILD_COMMAND`).
        EngineBuildError: the build failed.
    """
    return ensure_environment(
        environment_directory(), ORTGENAI_PACKAGES, "ONNX Runtime GenAI", _VERSIONS_SCRIPT, build,
        _unavailable,
    )


_TOKENIZER_CHECK = """
import json, sys
import onnxruntime_genai as og
texts, expected, directory = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
tokenizer = og.Tokenizer(og.Model(directory))
got = [[int(i) for i in tokenizer.encode(text)] for text in texts]
print(json.dumps({"texts": texts, "onnxruntime_genai": got, "sentencepiece": expected,
                  "equal": got == expected}))
"""


def convert_tiny_models(
    environment: OrtGenAIEnvironment,
    models: TinyModels,
    build: bool = True,
    max_draft_tokens: int = MAX_DRAFT_TOKENS,
) -> ConvertedModels:
    """The tiny target and draft converted by ONNX Runtime GenAI's model builder (fp32, CPU),
    and their composite speculative directory, made once and cached.

    Each model: ``python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e cpu
    -c CACHE`` (the cache, for temporary external data, inside the conversion's directory and
    removed after). Then the composite directory (module docstring) and the tokenizer check:
    ``og.Tokenizer`` of the converted target encodes the default prompts as the SentencePiece
    model does (without ``<s>``, which ``prompt_ids`` adds). ``conversion.json`` (seconds and
    bytes per model, the check) is written last.

    Args:
        environment: :func:`ensure_ortgenai_environment`'s.
        models: :func:`~losslessness.adapters.e2e.models.build_tiny_models`'s.
        build: convert what is missing; False: raise instead.
        max_draft_tokens: K written into the composite ``genai_config.json``.

    Returns:
        :class:`ConvertedModels`.

    Raises:
        AdapterUnavailable: not converted and ``build`` is False.
        EngineBuildError: the conversion or the tokenizer check failed.
    """
    directory = environment.directory / "models" / models.directory.name
    info_path = directory / "conversion.json"
    if not info_path.is_file():
        if not build:
            raise _unavailable(f"the tiny models are not converted for ONNX Runtime GenAI "
                               f"({directory})")
        with locked(directory.with_name(directory.name + ".lock")):
            if not info_path.is_file():
                _convert(environment, models, directory, info_path, max_draft_tokens)
    info: dict[str, Any] = json.loads(info_path.read_text())
    return ConvertedModels(directory, directory / "target", directory / "draft",
                           directory / "speculative", info)


def _composite(target: Path, draft: Path, out: Path, max_draft_tokens: int) -> None:
    """The target's files, the draft's in ``draft/``, and a ``genai_config.json`` adding the
    draft's decoder block as ``model.draft`` (the layout ``docs/SpeculativeDecoding.md``
    describes, without ``..``, which the config refuses)."""
    shutil.copytree(target, out)
    shutil.copytree(draft, out / "draft")
    config = json.loads((target / "genai_config.json").read_text())
    draft_decoder = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    config["model"]["draft"] = {**draft_decoder, "filename": "draft/model.onnx"}
    config["speculative"] = {"max_draft_tokens": max_draft_tokens}
    (out / "genai_config.json").write_text(json.dumps(config, indent=1) + "\n")


def _convert(
    environment: OrtGenAIEnvironment,
    models: TinyModels,
    directory: Path,
    info_path: Path,
    max_draft_tokens: int,
) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log = directory / "conversion.log"
    info: dict[str, Any] = {"onnxruntime-genai": environment.versions.get("onnxruntime-genai"),
                            "builder": "-p fp32 -e cpu"}
    for name, hf_dir in (("target", models.target), ("draft", models.draft)):
        began = time.perf_counter()
        building = directory / f"{name}.building"
        cache = directory / f"builder-cache-{name}"
        run_logged([str(environment.python), "-m", "onnxruntime_genai.models.builder", "-i",
              str(hf_dir), "-o", str(building), "-p", "fp32", "-e", "cpu", "-c", str(cache)],
             log, f"the model builder on the {name}", cwd=directory)
        shutil.rmtree(cache, ignore_errors=True)
        missing = [file for file in ("genai_config.json", "model.onnx", "tokenizer.json")
                   if not (building / file).is_file()]
        if missing:
            raise EngineBuildError(f"the model builder wrote no {', '.join(missing)} for the "
                                     f"{name} (log {log})")
        building.rename(directory / name)
        info[name] = {"seconds": round(time.perf_counter() - began, 1),
                      "size_bytes": size_bytes(directory / name)}
    _composite(directory / "target", directory / "draft", directory / "speculative",
               max_draft_tokens)
    info["max_draft_tokens"] = max_draft_tokens
    texts = list(PROMPTS)
    expected = [list(models.prompt_ids(text))[1:] for text in texts]
    check = json.loads(run_logged(
        [str(environment.python), "-c", _TOKENIZER_CHECK, json.dumps(texts),
         json.dumps(expected), str(directory / "target")],
        log, "the ONNX Runtime GenAI tokenizer check",
    ).strip().splitlines()[-1])
    if not check["equal"]:
        raise EngineBuildError(f"ONNX Runtime GenAI's tokenizer encodes differently from the "
                                 f"SentencePiece model: {check}")
    info["tokenizer_check"] = check
    info_path.write_text(json.dumps(info, indent=1) + "\n")


class OrtGenAIClient(ShimClient):
    """ONNX Runtime GenAI with speculation on, in the :class:`~losslessness.adapters.e2e.engine.
    EngineClient` protocol: a :class:`~losslessness.adapters.e2e.process.ServerProcess`
    running :mod:`~losslessness.adapters.e2e.shims.ortgenai_server` under the environment's
    Python (isolated: ``python -I``), started on the first request.

    Args:
        mode: ``"draft"`` (the tiny draft model) or ``"ngram"`` (n-gram speculation).
        environment: the built environment.
        converted: the converted models.
        vocab_size: V.
        max_draft_tokens: K, in [1, 16].
        ngram_size: n-gram speculation's N, in [2, 16].

    The counters of a request are the engine's own (``get_speculative_stats()``'s
    ``draft_tokens_proposed`` and ``draft_tokens_accepted``: the shim's ``Engine.generate``).

    Raises:
        ValueError: an unknown mode, or K or N out of range.
    """

    def __init__(
        self,
        mode: str,
        environment: OrtGenAIEnvironment,
        converted: ConvertedModels,
        vocab_size: int,
        max_draft_tokens: int = MAX_DRAFT_TOKENS,
        ngram_size: int = NGRAM_SIZE,
    ) -> None:
        if mode not in ("draft", "ngram"):
            raise ValueError(f"mode: must be 'draft' or 'ngram', got {mode!r}")
        if not 1 <= max_draft_tokens <= 16 or not 2 <= ngram_size <= 16:
            raise ValueError("max_draft_tokens: must be in [1, 16]; ngram_size: in [2, 16]")
        self.mode = mode
        drafter = ["--ngram-size", str(ngram_size)] if mode == "ngram" \
            else ["--speculative", str(converted.speculative)]
        command = [
            str(environment.python), "-I", str(SHIM), "--port", "{port}",
            "--target", str(converted.target), *drafter,
            "--max-draft-tokens", str(max_draft_tokens), "--threads", "1",
        ]
        versions = environment.versions
        drafter_text = (
            f"n-gram speculation (ngram_size {ngram_size})" if mode == "ngram"
            else "the tiny draft model (model.draft)"
        )
        description = (
            f"ONNX Runtime GenAI {versions.get('onnxruntime-genai')} (onnxruntime "
            f"{versions.get('onnxruntime')}) Generator on CPU, fp32, one thread, "
            f"{drafter_text}, max_draft_tokens {max_draft_tokens}; tiny Llama target, "
            f"V={vocab_size}, converted by its model builder"
        )
        super().__init__(
            f"onnxruntime-genai ({mode})", command, description, vocab_size,
            SERVER_STARTUP_TIMEOUT_S, SERVER_REQUEST_TIMEOUT_S,
        )


def ortgenai_client(mode: str) -> tuple[OrtGenAIClient, TinyModels]:
    """A client of ``mode`` on the built environment and converted models, and the models.

    Raises:
        AdapterUnavailable: the environment or the conversion is missing and
            ``LOSSLESSNESS_E2E_BUILD`` is not 1; transformers or sentencepiece is missing.
        EngineBuildError: a build that was allowed failed.
    """
    build = may_build()
    environment = ensure_ortgenai_environment(build=build)
    models = build_tiny_models()
    converted = convert_tiny_models(environment, models, build=build)
    return OrtGenAIClient(mode, environment, converted, models.vocab_size), models


def _reference(models: TinyModels) -> Callable[[list[int]], torch.Tensor]:
    return partial(transformers_next_token_probs, models.target)


def draft_adapter() -> Adapter:
    """``e2e/onnxruntime-genai-draft``: ONNX Runtime GenAI with the tiny draft model
    (``model.draft``, K = :data:`MAX_DRAFT_TOKENS`), on :data:`ORTGENAI_CASES`, its law
    cross-checked with transformers', the acceptance predicted for :data:`DRAFTING`; expected
    LOSSLESS (rejection sampling).

    Raises:
        AdapterUnavailable: as :func:`ortgenai_client`.
    """
    client, models = ortgenai_client("draft")
    return engine_adapter(
        "e2e/onnxruntime-genai-draft", client, models.prompt_ids, ORTGENAI_CASES,
        reference_law=_reference(models),
        predicted_acceptance=case_predictor(models, DRAFTING, models.prompt_ids,
                                            compute=may_build()),
    )


def ngram_adapter() -> Adapter:
    """``e2e/onnxruntime-genai-ngram``: ONNX Runtime GenAI's n-gram speculation (N =
    :data:`NGRAM_SIZE`, K = :data:`MAX_DRAFT_TOKENS`), on :data:`ORTGENAI_CASES` with the
    prompts of :func:`~losslessness.adapters.e2e.models.continued_prompt_ids`, its law
    cross-checked with transformers'; expected LOSSLESS (sample-and-match). No predicted
    acceptance (module docstring).

    Raises:
        AdapterUnavailable: as :func:`ortgenai_client`.
    """
    client, models = ortgenai_client("ngram")
    return engine_adapter(
        "e2e/onnxruntime-genai-ngram", client, continued_prompt_ids(models), ORTGENAI_CASES,
        reference_law=_reference(models),
    )


def main() -> None:
    """Build the environment and the converted models, compute the draft target's predicted
    acceptance; print versions, times, sizes and the predictions."""
    began = time.perf_counter()
    environment = ensure_ortgenai_environment(build=True)
    print(f"environment {environment.directory} ({time.perf_counter() - began:.1f} s here)")
    info = environment.info
    print(f"  install {info['install_s']} s, venv {info['size_bytes'] / 1e9:.2f} GB, python "
          f"{info['python']}, constraints {info['constraints']}")
    for name, version in info["versions"].items():
        print(f"  {name} {version}")
    began = time.perf_counter()
    models = build_tiny_models()
    print(f"tiny models {models.directory} ({time.perf_counter() - began:.1f} s)")
    began = time.perf_counter()
    converted = convert_tiny_models(environment, models, build=True)
    print(f"converted {converted.directory} ({time.perf_counter() - began:.1f} s here)")
    for name in ("target", "draft"):
        entry = converted.info[name]
        print(f"  {name}: converted in {entry['seconds']} s, {entry['size_bytes'] / 1e6:.2f} MB")
    print(f"  speculative: {converted.speculative} (max_draft_tokens "
          f"{converted.info['max_draft_tokens']})")
    print(f"  tokenizer check: {converted.info['tokenizer_check']['equal']}")
    print("\n".join(prediction_lines("e2e/onnxruntime-genai-draft", models, DRAFTING,
                                      models.prompt_ids, ORTGENAI_CASES)))


if __name__ == "__main__":
    main()
