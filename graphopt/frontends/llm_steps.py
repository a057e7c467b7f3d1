"""The two phases of a decoder LLM as traceable modules, the KV cache passed as inputs.

A served LLM runs two programs: **prefill** reads a prompt of P tokens and writes its keys and
values into the cache; **decode** reads one new token per sequence and the cache of L tokens,
and appends one entry. Tracing each as a module whose cache is an *input* (not hidden state)
gives graphopt graphs where the cache is a tensor it can size, count and cost, and a batch
dimension torch.export can leave dynamic.

Why our own wrapper, not transformers' caches (checked with transformers 5.x, torch 2.13):

- ``DynamicCache`` built from input tensors traces, but copies the whole cache twice per step
  (an initial ``cat`` with an empty tensor, then the append), and its GQA path materializes the
  repeated keys/values: the plan would count 5x the cache traffic a server moves.
- ``StaticCache`` keeps the cache as module buffers: their batch is fixed at construction
  (torch.export with a batch ``Dim`` fails, "Constraints violated (batch)"), and its in-place
  ``index_copy_`` write maps to a scatter that graphopt costs as a copy of the whole cache.

These modules reuse the model's own submodules (embedding, RMSNorm, q/k/v/o projections,
rotary embedding, MLP, lm_head), so the weights and the numerics are the model's. Attention is
one ``scaled_dot_product_attention`` with ``enable_gqa`` (the K/V heads are read once, not
repeated). Decode appends the new entry with one ``torch.cat`` per K and V: a static or paged
cache writes only the new entry in place, so the plan's decode estimate counts one cache copy
more than such a server (the ``llm`` report section shows its time).

Cache layout: ``keys`` and ``values`` are ``[layers, batch, kv_heads, length, head_dim]``.
Supported: Llama-layout models (``model.model.layers[i].self_attn.q_proj`` ...; model types
llama, mistral without a sliding window, qwen2).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphopt.errors import GraphoptError

__all__ = ["SUPPORTED", "DecodeStep", "PrefillStep", "cache_layout"]

#: config.model_type values whose decoder layers these wrappers reproduce exactly
SUPPORTED = ("llama", "mistral", "qwen2")


def cache_layout(model: nn.Module) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of ``model``'s KV cache; a GraphoptError if it is not a
    Llama-layout causal LM."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    base = getattr(model, "model", None)
    if kind not in SUPPORTED or base is None or not hasattr(model, "lm_head") \
            or not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
        raise GraphoptError(
            f"{type(model).__name__} (model_type {kind!r}) is not a Llama-layout causal LM",
            f"pass a transformers *ForCausalLM of type {', '.join(SUPPORTED)} "
            "(e.g. LlamaForCausalLM(LlamaConfig(...)), on the meta device to allocate nothing)")
    if kind == "mistral" and getattr(cfg, "sliding_window", None):
        raise GraphoptError("the Mistral config has a sliding window, which these wrappers do "
                            "not apply", "set config.sliding_window = None to plan full "
                            "attention over the cache")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, cfg.num_key_value_heads or heads, head_dim


class _Steps(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.layers_n, self.kv_heads, self.head_dim = cache_layout(model)
        self.lm = model
        self.heads = model.config.num_attention_heads

    def _run(self, ids: torch.Tensor, start: Any, keys: torch.Tensor | None,
             values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits of the last token and the new tokens' keys/values ``[layers, B, kv, T, d]``."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        base = self.lm.model
        b, t = ids.shape
        x = base.embed_tokens(ids)
        pos = torch.arange(start, start + t, device=ids.device).unsqueeze(0)
        cos, sin = base.rotary_emb(x, pos)
        new_k, new_v = [], []
        for i, layer in enumerate(base.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            new_k.append(k)
            new_v.append(v)
            if keys is not None and values is not None:  # decode: the cache, then the new entry
                k, v = torch.cat([keys[i], k], dim=2), torch.cat([values[i], v], dim=2)
            o = nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=keys is None and t > 1, scale=attn.scaling,
                enable_gqa=self.kv_heads != self.heads)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = self.lm.lm_head(base.norm(x[:, -1:]))
        return logits, torch.stack(new_k), torch.stack(new_v)


class PrefillStep(_Steps):
    """``forward(input_ids [B, P]) -> (logits [B, 1, V], keys, values)``: the prompt's cache,
    ``[layers, B, kv_heads, P, head_dim]``, which a server writes into its cache."""

    def forward(self, input_ids: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._run(input_ids, 0, None, None)


class DecodeStep(_Steps):
    """``forward(input_ids [B, 1], keys, values) -> (logits [B, 1, V], new_keys, new_values)``:
    one token per sequence against a cache of ``keys.shape[3]`` tokens; the new entries are
    ``[layers, B, kv_heads, 1, head_dim]``."""

    def forward(self, input_ids: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._run(input_ids, keys.shape[3], keys, values)
