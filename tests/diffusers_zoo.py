"""Diffusion models from diffusers, built from tiny configs with random weights.

Why tiny: the zoo runs in CI on a 2-core machine, so every model has one block per stage,
32 channels and 16x16 images or 8x8 latents; the code paths (ResNet blocks with GroupNorm and
timestep embeddings, cross-attention to text states, adaptive layer norms, joint attention,
Flux's rotary embedding, the ControlNet's zero convs) are the real ones. No hub downloads:
diffusers ships the modelling code, the configs are written here.

Each model is wrapped the way a user calls it in a denoising step: a small ``nn.Module`` that
takes tensors only (the timestep a float tensor) and returns the ``sample`` tensor, not an
output dataclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["DIFFUSERS", "DiffusersArch", "build"]

BATCH = 2
CHANNELS = 4  # latent channels
LATENT = 8  # latent side: 8x8
IMAGE = 16  # pixel side for the VAE: 16x16
TEXT = 8  # text tokens
TEXT_DIM = 32  # text-encoder width


class Denoiser(nn.Module):
    """``model(sample, timestep, encoder_hidden_states).sample``: a UNet step."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                text: torch.Tensor) -> torch.Tensor:
        return self.model(sample, timestep=timestep, encoder_hidden_states=text,
                          return_dict=False)[0]


class ClassConditioned(nn.Module):
    """DiT on ImageNet classes: ``model(sample, timestep, class_labels).sample``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                class_labels: torch.Tensor) -> torch.Tensor:
        return self.model(sample, timestep=timestep, class_labels=class_labels,
                          return_dict=False)[0]


class SD3(nn.Module):
    """SD3's MMDiT: latents, timestep, text tokens and the pooled text vector."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                pooled: torch.Tensor) -> torch.Tensor:
        return self.model(hidden_states=sample, timestep=timestep, encoder_hidden_states=text,
                          pooled_projections=pooled, return_dict=False)[0]


class Flux(nn.Module):
    """Flux: packed latent tokens, text tokens, pooled text, timestep, and the position ids
    its rotary embedding reads (image ids from the latent grid, text ids zero)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                pooled: torch.Tensor, img_ids: torch.Tensor, txt_ids: torch.Tensor
                ) -> torch.Tensor:
        return self.model(hidden_states=tokens, timestep=timestep, encoder_hidden_states=text,
                          pooled_projections=pooled, img_ids=img_ids, txt_ids=txt_ids,
                          return_dict=False)[0]


class VAE(nn.Module):
    """AutoencoderKL round trip: encode to the posterior's mode, decode back to pixels."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        latent = self.model.encode(image).latent_dist.mode()
        return self.model.decode(latent).sample


class ControlNet(nn.Module):
    """A ControlNet step: the residuals it adds to the UNet, summed into one tensor so the
    plan has one output that depends on every down block and the mid block."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                cond: torch.Tensor) -> torch.Tensor:
        down, mid = self.model(sample, timestep, encoder_hidden_states=text,
                               controlnet_cond=cond, return_dict=False)
        return mid + sum(d.mean() for d in down)


@dataclass(frozen=True)
class DiffusersArch:
    """One diffusers model: how to build it, and what its plan must contain."""

    name: str
    make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
    #: kernel classes the plan must contain (at least one node each)
    kernels: tuple[str, ...]


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _latents() -> torch.Tensor:
    return _randn(BATCH, CHANNELS, LATENT, LATENT, seed=1)


def _timestep() -> torch.Tensor:
    return torch.tensor([10.0, 500.0])


def _text(dim: int = TEXT_DIM) -> torch.Tensor:
    return _randn(BATCH, TEXT, dim, seed=2)


_UNET = dict(sample_size=LATENT, in_channels=CHANNELS, out_channels=CHANNELS,
             layers_per_block=1, block_out_channels=(32, 32), norm_num_groups=8,
             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
             cross_attention_dim=TEXT_DIM, attention_head_dim=8)


def _unet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import diffusers

    model = diffusers.UNet2DConditionModel(**_UNET)
    return Denoiser(model), (_latents(), _timestep(), _text())


def _controlnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import diffusers

    keys = ("in_channels", "block_out_channels", "norm_num_groups", "cross_attention_dim",
            "attention_head_dim", "layers_per_block")
    model = diffusers.ControlNetModel(
        **{k: _UNET[k] for k in keys}, down_block_types=_UNET["down_block_types"],
        conditioning_embedding_out_channels=(8, 16))
    # a trained ControlNet's zero convs are not zero any more; left at zero the output is 0 and
    # the conditioning image changes nothing, so a comparison would check nothing
    for zero in (model.controlnet_down_blocks, model.controlnet_mid_block,
                 model.controlnet_cond_embedding.conv_out):
        for p in zero.parameters():
            nn.init.normal_(p, std=0.1)
    # the conditioning image is at pixel size: the embedder has one stride-2 conv per entry of
    # conditioning_embedding_out_channels after the first, so here twice the latent side
    cond = _randn(BATCH, 3, LATENT * 2, LATENT * 2, seed=3)
    return ControlNet(model), (_latents(), _timestep(), _text(), cond)


def _vae() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import diffusers

    model = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=CHANNELS, layers_per_block=1,
        block_out_channels=(32, 32), norm_num_groups=8, sample_size=IMAGE,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
    return VAE(model), (_randn(BATCH, 3, IMAGE, IMAGE, seed=4),)


def _dit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import diffusers

    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=CHANNELS,
        out_channels=CHANNELS, num_layers=1, sample_size=LATENT, patch_size=2,
        num_embeds_ada_norm=10, norm_num_groups=8)
    labels = torch.tensor([1, 7])
    return ClassConditioned(model), (_latents(), _timestep(), labels)


def _sd3() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import diffusers

    model = diffusers.SD3Transformer2DModel(
        sample_size=LATENT, patch_size=2, in_channels=CHANNELS, out_channels=CHANNELS,
        num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=TEXT_DIM, caption_projection_dim=32,
        pooled_projection_dim=TEXT_DIM, pos_embed_max_size=16)
    return SD3(model), (_latents(), _timestep(), _text(), _randn(BATCH, TEXT_DIM, seed=5))


def _flux() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import diffusers

    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=TEXT_DIM, pooled_projection_dim=TEXT_DIM,
        axes_dims_rope=(4, 6, 6))
    side = LATENT // 2  # 2x2 patches of 4 channels packed into 16-channel tokens
    tokens = _randn(BATCH, side * side, 16, seed=6)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float()
    txt_ids = torch.zeros(TEXT, 3)
    return Flux(model), (tokens, _timestep() / 1000, _text(), _randn(BATCH, TEXT_DIM, seed=7),
                         img_ids, txt_ids)


DIFFUSERS: tuple[DiffusersArch, ...] = (
    DiffusersArch("unet", _unet, ("conv", "attention", "gemm", "norm")),
    DiffusersArch("vae", _vae, ("conv", "attention", "norm")),
    DiffusersArch("dit", _dit, ("conv", "attention", "gemm", "norm")),
    DiffusersArch("sd3", _sd3, ("conv", "attention", "gemm", "norm")),
    DiffusersArch("flux", _flux, ("attention", "gemm", "norm")),
    DiffusersArch("controlnet", _controlnet, ("conv", "attention", "gemm", "norm")),
)


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The named model in eval mode with seeded random weights, and its example inputs."""
    arch = next(a for a in DIFFUSERS if a.name == name)
    torch.manual_seed(0)
    model, inputs = arch.make()
    return model.eval(), inputs
