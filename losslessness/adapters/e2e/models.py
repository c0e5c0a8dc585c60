"""The tiny target and draft every engine target serves, built offline and cached.

Nothing is downloaded: a SentencePiece unigram tokenizer (V = 256, ``<unk>`` 0, ``<s>`` 1,
``</s>`` 2, no byte fallback) is trained in code on a fixed pseudo-word corpus, and two 2-layer
Llama models (hidden 64, 2 heads of dimension 32: vLLM's CPU build takes head dimensions 32 and
64) share it: a randomly initialised target and a draft made from it with 10% relative noise on
every weight matrix (drafts accepted about two times in three). The target's weights are redrawn
from seeded generators so that the next-token law is peaked enough for an audit (mean entropy
about 1.3 nats at temperature 1; the law of 4 new tokens has about 150 sequences above 1e-3) and
so that ``<unk>``, ``<s>`` and ``</s>`` are never emitted: residual dimension 0 is held at 1
(the embeddings' column 0 is 1, the projections that write the residual stream have row 0 at 0)
and the three tokens' ``lm_head`` rows are -60 there, so their logits are about -60 and no
generation stops early. The models are saved with ``save_pretrained`` in float32 beside the
tokenizer's ``tokenizer.model``, which each engine's own converter reads (llama.cpp's
``convert_hf_to_gguf.py`` takes it through ``_set_vocab_sentencepiece``, with no pre-tokenizer
hash check).

The cache (``$LOSSLESSNESS_E2E_CACHE``, default ``~/.cache/losslessness/e2e``) is keyed by
:data:`RECIPE`; a change of recipe builds again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from losslessness.adapters.base import AdapterUnavailable, import_optional

__all__ = [
    "BUILD_VARIABLE",
    "RECIPE",
    "TinyModels",
    "build_tiny_models",
    "cache_root",
    "continued_prompt_ids",
    "greedy_continuation",
    "load_model",
    "may_build",
    "transformers_next_token_probs",
]

VOCAB_SIZE = 256
PROMPT_CONTINUATION = 20
"""Tokens of the target's own greedy continuation after each n-gram case's prompt
(:func:`continued_prompt_ids`)."""
SUPPRESSED_TOKENS = (0, 1, 2)
"""``<unk>``, ``<s>``, ``</s>``: never emitted by the tiny models."""

RECIPE = {
    "version": 2,
    "config": {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "tokenizer": {"kind": "sentencepiece-unigram", "corpus_seed": 1234, "corpus_lines": 4000},
    "target": {"seed": 42, "lm_scale": 5.0},
    "draft": {"seed": 4242, "relative_noise": 0.1},
}
"""Everything the models depend on; its hash names the cache directory."""


BUILD_VARIABLE = "LOSSLESSNESS_E2E_BUILD"
"""Set to 1, an engine target builds what it is missing on first use; otherwise it is
unavailable, naming the command that builds it."""


def may_build() -> bool:
    """Whether ``$LOSSLESSNESS_E2E_BUILD`` is 1 (:data:`BUILD_VARIABLE`)."""
    return os.environ.get(BUILD_VARIABLE) == "1"


def cache_root() -> Path:
    """Where engine-target artefacts are cached (``$LOSSLESSNESS_E2E_CACHE`` or
    ``~/.cache/losslessness/e2e``)."""
    configured = os.environ.get("LOSSLESSNESS_E2E_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "losslessness" / "e2e"


@dataclass(frozen=True)
class TinyModels:
    """The built models.

    Attributes:
        directory: the cache directory of this recipe.
        target: the target's Hugging Face directory (``config.json``, ``model.safetensors``,
            ``tokenizer.model``, ``tokenizer_config.json``).
        draft: the draft's, same tokenizer, other weights.
        tokenizer: the SentencePiece model file.
        vocab_size: V.
    """

    directory: Path
    target: Path
    draft: Path
    tokenizer: Path
    vocab_size: int = VOCAB_SIZE

    def prompt_ids(self, text: str) -> tuple[int, ...]:
        """``<s>`` followed by the tokenizer's ids of ``text`` (what a user's prompt becomes)."""
        spm = import_optional("sentencepiece", "sentencepiece")
        processor = spm.SentencePieceProcessor(model_file=str(self.tokenizer))
        return (1, *(int(token) for token in processor.encode(text)))


def _recipe_hash() -> str:
    text = json.dumps(RECIPE, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def _corpus(seed: int, lines: int) -> list[str]:
    """Deterministic pseudo-English (Zipf-distributed pseudo-words) for the tokenizer."""
    generator = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    syllables += [v + c for v in "aeiou" for c in "nrst"]
    lengths = [1, 1, 2, 2, 2, 3, 3, 4]
    words = [
        "".join(generator.choice(syllables) for _ in range(generator.choice(lengths)))
        for _ in range(600)
    ]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    text = []
    for _ in range(lines):
        sentence = " ".join(generator.choices(words, weights=weights, k=generator.randint(4, 14)))
        ending = generator.choice([".", ".", "!", "?", ","])
        text.append(sentence[0].upper() + sentence[1:] + ending)
    return text


def _train_tokenizer(directory: Path) -> Path:
    spm = import_optional("sentencepiece", "sentencepiece")
    recipe = RECIPE["tokenizer"]
    assert isinstance(recipe, dict)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(_corpus(recipe["corpus_seed"], recipe["corpus_lines"])) + "\n")
    prefix = directory / "tokenizer"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=VOCAB_SIZE,
        model_type="unigram", character_coverage=1.0, byte_fallback=False, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, hard_vocab_limit=True, num_threads=1, minloglevel=2,
    )
    return prefix.with_suffix(".model")


def _model(seed: int, lm_scale: float) -> Any:
    """A Llama of :data:`RECIPE`'s config with seeded weights (see the module docstring)."""
    transformers = import_optional("transformers", "transformers")
    config = transformers.LlamaConfig(**RECIPE["config"])  # type: ignore[arg-type]
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    hidden = config.hidden_size
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.randn(VOCAB_SIZE, hidden, generator=generator))
        for layer in model.model.layers:
            linears = (
                layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                layer.mlp.down_proj,
            )
            for linear in linears:
                fan_in = linear.weight.shape[1]
                linear.weight.copy_(
                    torch.randn(linear.weight.shape, generator=generator) / math.sqrt(fan_in)
                )
        head = torch.randn(VOCAB_SIZE, hidden, generator=generator) * (lm_scale / math.sqrt(hidden))
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        head[:, 0] = 0.0
        head[list(SUPPRESSED_TOKENS), :] = 0.0
        head[list(SUPPRESSED_TOKENS), 0] = -60.0
        model.lm_head.weight.copy_(head)
    return model


def _perturbed(target: Any, seed: int, relative_noise: float) -> Any:
    """A copy of ``target`` whose weights each get Gaussian noise of ``relative_noise`` times
    their own standard deviation, the control tokens' ``lm_head`` rows and the held residual
    dimension kept: a draft close enough to the target that drafts are accepted about two
    times in three, so both the accept and the reject paths run (an independent random draft
    is accepted about 0.3% of the time)."""
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in draft.named_parameters():
            if weight.dim() < 2:
                continue
            noise = torch.randn(weight.shape, generator=generator) * weight.std()
            kept = weight.clone()
            weight.add_(noise * relative_noise)
            if name == "model.embed_tokens.weight":
                weight[:, 0] = kept[:, 0]
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                weight[0, :] = kept[0, :]
            elif name == "lm_head.weight":
                weight[:, 0] = kept[:, 0]
                weight[list(SUPPRESSED_TOKENS), :] = kept[list(SUPPRESSED_TOKENS), :]
    return draft


def build_tiny_models(cache: Path | None = None) -> TinyModels:
    """The tiny target and draft, built on first use and cached (module docstring).

    Args:
        cache: the cache root (default :func:`cache_root`).

    Returns:
        :class:`TinyModels`.

    Raises:
        AdapterUnavailable: transformers or sentencepiece is not installed.
    """
    directory = (cache or cache_root()) / f"models-{_recipe_hash()}"
    models = TinyModels(
        directory, directory / "hf_target", directory / "hf_draft", directory / "tokenizer.model"
    )
    if (directory / "done").exists():
        return models
    building = directory.with_name(directory.name + f".building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    tokenizer = _train_tokenizer(building)
    target_recipe, draft_recipe = RECIPE["target"], RECIPE["draft"]
    assert isinstance(target_recipe, dict) and isinstance(draft_recipe, dict)
    target = _model(target_recipe["seed"], target_recipe["lm_scale"])
    draft = _perturbed(target, draft_recipe["seed"], draft_recipe["relative_noise"])
    for name, model in (("target", target), ("draft", draft)):
        out = building / f"hf_{name}"
        model.save_pretrained(out, safe_serialization=True)
        shutil.copy(tokenizer, out / "tokenizer.model")
        (out / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                    "eos_token": "</s>", "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer",
                }
            )
        )
    (building / "recipe.json").write_text(json.dumps(RECIPE, indent=1))
    (building / "done").write_text("")
    try:
        building.rename(directory)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
        if not (directory / "done").exists():
            raise
    return models


def transformers_next_token_probs(model_dir: Path, prefix_ids: list[int]) -> torch.Tensor:
    """transformers' next-token law of the saved model after ``prefix_ids`` at temperature 1.

    Args:
        model_dir: a directory :func:`build_tiny_models` wrote.
        prefix_ids: the whole prefix (``<s>`` included), ids in ``[0, V)``.

    Returns:
        ``[V]`` float64, softmax of the float32 logits.

    Raises:
        AdapterUnavailable: transformers is not installed.
    """
    model = load_model(model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([prefix_ids], dtype=torch.int64)).logits[0, -1]
    return torch.softmax(logits.to(torch.float64), dim=-1)


def greedy_continuation(model_dir: Path, prefix_ids: list[int], tokens: int) -> list[int]:
    """The ``tokens`` ids transformers' greedy decoding of the saved model adds after
    ``prefix_ids`` (what n-gram and prompt-lookup drafters need in a prompt to draft at all:
    the target's greedy chain revisits tokens, so after it the target's next tokens occur
    earlier in the context, followed by what the target is likely to say again).

    Raises:
        AdapterUnavailable: transformers is not installed.
    """
    ids = list(prefix_ids)
    for _ in range(tokens):
        ids.append(int(torch.argmax(transformers_next_token_probs(model_dir, ids))))
    return ids[len(prefix_ids):]


def continued_prompt_ids(
    models: TinyModels, continuation: int = PROMPT_CONTINUATION
) -> Callable[[str], list[int]]:
    """The tokenizer of n-gram (prompt lookup) cases: a prompt's ids followed by the target's
    own greedy continuation of ``continuation`` tokens (:func:`greedy_continuation`).

    Why: n-gram speculation proposes the tokens that followed the most recent earlier
    occurrence of the last few tokens, so it drafts only when the generated tokens already
    occur in the context; on the default prompts it almost never does (ONNX Runtime GenAI: 1
    draft in 120 requests of 4 tokens). The target's greedy chain revisits tokens and short
    cycles, so after it the target's next tokens often occur earlier in the context (ONNX
    Runtime GenAI, N = 2 and K = 3: 30 sampled requests of 4 tokens on each prompt proposed 31
    and 82 drafts and accepted 13 and 32), and greedy requests draft too. The ids are passed
    as they are (no decoding to text and back, which need not give the same ids).

    Returns:
        ``text -> ids`` (``<s>``, the prompt's ids, the continuation).

    Raises:
        AdapterUnavailable: transformers or sentencepiece is not installed.
    """
    cache: dict[str, list[int]] = {}

    def prompt_ids(text: str) -> list[int]:
        if text not in cache:
            ids = list(models.prompt_ids(text))
            cache[text] = ids + greedy_continuation(models.target, ids, continuation)
        return list(cache[text])

    return prompt_ids


_LOADED: dict[str, Any] = {}


def load_model(model_dir: Path) -> Any:
    """The saved Llama in ``model_dir`` as transformers' ``LlamaForCausalLM`` in float32, eval
    mode, loaded once per process (shared by every caller: do not train it).

    Raises:
        AdapterUnavailable: transformers is not installed, or the directory cannot be loaded.
    """
    key = str(model_dir)
    if key not in _LOADED:
        transformers = import_optional("transformers", "transformers")
        try:
            model = transformers.LlamaForCausalLM.from_pretrained(key, dtype=torch.float32)
        except OSError as error:
            raise AdapterUnavailable(f"cannot load {model_dir}: {error}") from error
        _LOADED[key] = model.eval()
    return _LOADED[key]
