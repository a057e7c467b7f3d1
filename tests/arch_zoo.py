"""Real architectures from transformers, built from tiny configs with random weights.

Why tiny: the zoo runs in CI on a 2-core machine, so every model has 1-2 layers, hidden 32-64,
16-token sequences and 32x32 images; the code paths (GQA, RoPE, RMSNorm, SwiGLU, MoE routing,
windowed attention, depthwise convs, cross-attention) are the real ones. No hub downloads:
transformers ships the modelling code, the configs are written here.

Each model is wrapped the way a user would: a small ``nn.Module`` that calls it with
``use_cache=False`` and returns a tensor (``last_hidden_state`` / ``logits``), not a
``ModelOutput``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ARCHS", "Arch", "build"]

VOCAB = 256
SEQ = 16
IMAGE = 32


class LastHidden(nn.Module):
    """``model(...).last_hidden_state`` (or ``logits`` for heads) as a plain tensor."""

    def __init__(self, model: nn.Module, field: str = "last_hidden_state",
                 cache: bool = True) -> None:
        super().__init__()
        self.model, self.field, self.cache = model, field, cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs = {"use_cache": False} if self.cache else {}
        return getattr(self.model(x, return_dict=True, **kwargs), self.field)


class Logits(nn.Module):
    """The usual ``forward(ids) -> logits`` wrapper around a causal LM (its FQNs gain ``lm.``)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids).logits


class MaskedEncoder(nn.Module):
    """An encoder called with ``(input_ids, attention_mask)``, as BERT-style models are."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          return_dict=True).last_hidden_state


class EncoderDecoder(nn.Module):
    """Whisper: log-mel features -> encoder; decoder ids -> decoder with cross-attention."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_features=input_features, decoder_input_ids=decoder_input_ids,
                          use_cache=False, return_dict=True).last_hidden_state


@dataclass(frozen=True)
class Arch:
    """One architecture: how to build it, and what its plan must contain."""

    name: str
    make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
    #: kernel classes the h100 plan must contain (at least one node each)
    kernels: tuple[str, ...]


def _ids(batch: int = 2, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))


def _image(batch: int = 2, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(2))


_DECODER = dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128, vocab_size=VOCAB,
                max_position_embeddings=64, use_cache=False)


def _decoder(config_cls: str, model_cls: str, **extra: object
             ) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        import transformers

        config = getattr(transformers, config_cls)(**{**_DECODER, **extra})
        return LastHidden(getattr(transformers, model_cls)(config)), (_ids(),)
    return make


def _gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=64, use_cache=False, bos_token_id=0,
                                     eos_token_id=0)
    return LastHidden(transformers.GPT2LMHeadModel(config), "logits"), (_ids(),)


def _bert_like(config_cls: str, model_cls: str, **extra: object
               ) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        import transformers

        config = getattr(transformers, config_cls)(vocab_size=VOCAB, **extra)
        ids = _ids()
        mask = torch.ones_like(ids)
        mask[1, SEQ - 4:] = 0  # a padded second sequence: the mask is not all ones
        return MaskedEncoder(getattr(transformers, model_cls)(config)), (ids, mask)
    return make


_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)


def _t5() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                                   num_layers=2, feed_forward_proj="gated-gelu")
    return LastHidden(transformers.T5EncoderModel(config), cache=False), (_ids(),)


def _kaiming(model: nn.Module) -> nn.Module:
    """He init (variance-preserving through ReLU): with transformers' N(0, 0.02) conv weights
    the activations of MobileNetV2's 52 convs shrink to ~1e-25 (torch's default init: ~1e-8),
    and a comparison relative to that scale says nothing."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    return model


def _vision(config_cls: str, model_cls: str, field: str = "last_hidden_state",
            init: Callable[[nn.Module], nn.Module] | None = None, **extra: object
            ) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        import transformers

        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**extra))
        model = init(model) if init is not None else model
        return LastHidden(model, field, cache=False), (_image(),)
    return make


_VIT = dict(image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=128)


def _whisper() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_source_positions=16, max_target_positions=32, use_cache=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=1, decoder_start_token_id=2)
    features = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(3))
    return EncoderDecoder(transformers.WhisperModel(config)), (features, _ids(seq=8))


ARCHS: tuple[Arch, ...] = (
    Arch("llama", _decoder("LlamaConfig", "LlamaModel"), ("attention", "gemm", "rmsnorm")),
    Arch("mistral", _decoder("MistralConfig", "MistralModel", sliding_window=8),
         ("attention", "gemm", "rmsnorm")),
    Arch("qwen2", _decoder("Qwen2Config", "Qwen2Model"), ("attention", "gemm", "rmsnorm")),
    Arch("gemma", _decoder("GemmaConfig", "GemmaModel", head_dim=16),
         ("attention", "gemm", "rmsnorm")),
    Arch("phi3", _decoder("Phi3Config", "Phi3Model", pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2),
         ("attention", "gemm", "rmsnorm")),
    Arch("mixtral", _decoder("MixtralConfig", "MixtralModel", num_local_experts=4,
                             num_experts_per_tok=2), ("attention", "gemm", "rmsnorm")),
    Arch("gpt2", _gpt2, ("attention", "gemm", "norm")),
    Arch("bert", _bert_like("BertConfig", "BertModel", **_BERT), ("attention", "gemm", "norm")),
    Arch("roberta", _bert_like("RobertaConfig", "RobertaModel", pad_token_id=1, **_BERT),
         ("attention", "gemm", "norm")),
    Arch("distilbert", _bert_like("DistilBertConfig", "DistilBertModel", n_layers=2, dim=64,
                                  n_heads=4, hidden_dim=128, max_position_embeddings=64),
         ("attention", "gemm", "norm")),
    Arch("t5_encoder", _t5, ("attention", "gemm", "rmsnorm")),
    Arch("vit", _vision("ViTConfig", "ViTModel", **_VIT), ("attention", "gemm", "conv")),
    Arch("swin", _vision("SwinConfig", "SwinModel", image_size=IMAGE, patch_size=4,
                         embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
         ("attention", "gemm", "conv")),
    Arch("clip_vision", _vision("CLIPVisionConfig", "CLIPVisionModel", **_VIT),
         ("attention", "gemm", "conv")),
    Arch("convnext", _vision("ConvNextConfig", "ConvNextModel", "pooler_output",
                             image_size=IMAGE, hidden_sizes=[16, 32], depths=[1, 1],
                             num_stages=2), ("conv", "gemm", "norm")),
    Arch("resnet", _vision("ResNetConfig", "ResNetModel", "pooler_output", embedding_size=16,
                           hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"),
         ("conv",)),
    Arch("mobilenet_v2", _vision("MobileNetV2Config", "MobileNetV2Model", "pooler_output",
                                 _kaiming, image_size=IMAGE, depth_multiplier=0.35), ("conv",)),
    Arch("whisper", _whisper, ("attention", "gemm", "conv")),
)


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The named model in eval mode with seeded random weights, and its example inputs."""
    arch = next(a for a in ARCHS if a.name == name)
    torch.manual_seed(0)
    model, inputs = arch.make()
    return model.eval(), inputs
