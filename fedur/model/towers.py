"""What an open_clip model's towers can do, and the towers other than open_clip's own ViT re-entered with prompts.

open_clip 3.3 builds CLIP's vision tower as its own `VisionTransformer` (OpenAI's, LAION's, DFN's, MetaCLIP's ViTs:
`fedur/model/clip.py` re-enters it), as a `ModifiedResNet` (the RN50 family), or through timm (`TimmModel`, the
`timm_model_name` of its configs): a timm `VisionTransformer` (SigLIP, SigLIP 2, ViTamin), a timm `Eva` (EVA02-CLIP,
PE-Core; rotary position embeddings) or a convolutional net (ConvNeXt, MobileCLIP's FastViT). Its text tower is CLIP's
own (causal; OpenAI, LAION, DFN, MetaCLIP), a `TextTransformer` of a `CustomTextCLIP` (SigLIP's is not causal and
pools its last token; EVA's and PE's are causal), or a Hugging Face model (`HFTextEncoder`).

`features` says which of fedur's prompt insertions a model takes (FEATURES); a method's needs are checked against
them before any compute (fedur/methods/backbones.py). The timm towers are re-entered as timm's own `forward_features`
and `forward_head` run them, block by block, with the deep visual prompts appended after every token of a prompted
block and dropped after it (VPT-deep, as on open_clip's ViT): with no prompts the result is timm's forward bit for bit
(tests/model/test_towers.py). On an `Eva` the prompt tokens take no rotary position (their rows of the rotary
embedding rotate by zero), like its class token. SigLIP's attention-pooling head ("map") is run as the model has it,
after the prompts are dropped. ResNets take no visual prompt (no tokens); their patch features are the attention
pool's outputs with every position as a query (open_clip's `AttentionPool2d` computes them all and keeps the first,
the pooled feature; PLOT's and FedOTP's RN50 keep them all).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from fedur.errors import ConfigError

VISUAL_PROMPTS = "visual prompts"
PATCH_TOKENS = "patch tokens"
TEXT_PROMPTS = "text prompts"
DEEP_TEXT = "deep text prompts"
FEATURES = (TEXT_PROMPTS, DEEP_TEXT, VISUAL_PROMPTS, PATCH_TOKENS)
"""What a method may need of a backbone: a text context in the class prompts (every prompt-learning method), deep text
prompts before the text blocks (MaPLe, PromptSRC), deep visual prompts in the vision blocks (FedUR, FedCoPL, SCAFFOLD,
MaPLe, PromptSRC), projected patch features (FedOTP)."""


# ---------------------------------------------------------------- text tower


class TextView:
    """A `CustomTextCLIP`'s `TextTransformer` under the attribute names CLIP itself uses for its text tower
    (`token_embedding`, `positional_embedding`, `transformer`, `attn_mask`, `ln_final`, `text_projection`,
    `text_pool_type`, `text_eos_id`), so that one re-entry serves both."""

    def __init__(self, text: nn.Module) -> None:
        self.text = text
        self.token_embedding, self.transformer, self.ln_final = text.token_embedding, text.transformer, text.ln_final
        self.text_pool_type, self.text_eos_id = text.pool_type, getattr(text, "eos_id", None)

    @property
    def positional_embedding(self) -> Tensor:  # read at each call: the module may have moved to a device
        return self.text.positional_embedding

    @property
    def attn_mask(self) -> Tensor | None:
        return self.text.attn_mask

    @property
    def text_projection(self):
        return self.text.text_projection


_VIEWS: weakref.WeakKeyDictionary[nn.Module, TextView] = weakref.WeakKeyDictionary()


def text_tower(model: nn.Module):
    """The module holding the text tower's parts under CLIP's names: CLIP itself, or a view of a CustomTextCLIP's
    TextTransformer (the same view for the same model). A ConfigError for a text tower fedur cannot re-enter."""
    if hasattr(model, "token_embedding") and hasattr(model, "transformer"):
        return model
    text = getattr(model, "text", None)
    reason = text_reason(model)
    if reason is not None:
        raise ConfigError(f"fedur cannot put a text context into this text tower: {reason}")
    if model not in _VIEWS:
        _VIEWS[model] = TextView(text)
    return _VIEWS[model]


def text_reason(model: nn.Module) -> str | None:
    """Why class prompts cannot be re-entered into the model's text tower, or None."""
    if hasattr(model, "token_embedding") and hasattr(model, "transformer"):
        return None
    text = getattr(model, "text", None)
    if text is None or not hasattr(text, "token_embedding") or not hasattr(text, "transformer"):
        return f"its text tower is a {type(text).__name__} (a Hugging Face model), not open_clip's TextTransformer"
    if getattr(text, "cls_emb", None) is not None or getattr(text, "use_pad_mask", False):
        return "its TextTransformer appends a class token or masks padding (CoCa-style)"
    return None


def causal_text(model: nn.Module) -> bool:
    """Whether the text tower attends causally (CLIP's, EVA's, PE's) or both ways (SigLIP's, MobileCLIP's)."""
    return text_tower(model).attn_mask is not None


# ---------------------------------------------------------------- vision tower


def _timm_kind(visual: nn.Module) -> str | None:
    """"vit" or "eva" for a TimmModel whose trunk is one of timm's vision transformers fedur re-enters, else None."""
    trunk = getattr(visual, "trunk", None)
    if trunk is None:
        return None
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    if isinstance(trunk, Eva):
        return None if getattr(trunk, "rope_mixed", False) else "eva"
    return "vit" if type(trunk) is VisionTransformer else None


def is_open_clip_vit(visual: nn.Module) -> bool:
    return hasattr(visual, "transformer") and hasattr(visual, "_embeds")


def is_resnet(visual: nn.Module) -> bool:
    return hasattr(visual, "attnpool") and hasattr(visual, "layer4")


def family(model: nn.Module) -> str:
    """The model's towers in words, for messages: "open_clip VisionTransformer + CLIP's causal text tower", ..."""
    visual = model.visual
    if getattr(visual, "trunk", None) is not None:
        vision = f"timm {type(visual.trunk).__name__}"
    else:
        vision = f"open_clip {type(visual).__name__}"
    if text_reason(model) is not None:
        text = type(getattr(model, "text", None)).__name__
    else:
        text = f"{'causal' if causal_text(model) else 'non-causal'} text tower"
    return f"{vision} + {text}"


def features(model: nn.Module) -> frozenset[str]:
    """Which of FEATURES the model takes."""
    found = set()
    if text_reason(model) is None:
        found |= {TEXT_PROMPTS, DEEP_TEXT}
    visual, kind = model.visual, _timm_kind(model.visual)
    if is_open_clip_vit(visual):
        found.add(VISUAL_PROMPTS)
        if getattr(visual, "attn_pool", None) is None:
            found.add(PATCH_TOKENS)
    elif kind is not None:
        found.add(VISUAL_PROMPTS)
        if visual.trunk.attn_pool is None and visual.trunk.global_pool == "token":
            found.add(PATCH_TOKENS)
    elif is_resnet(visual):
        found.add(PATCH_TOKENS)
    return frozenset(found)


def vision_blocks(visual: nn.Module) -> nn.ModuleList | nn.Sequential:
    """The vision tower's transformer blocks (a ConfigError where it has none)."""
    if is_open_clip_vit(visual):
        return visual.transformer.resblocks
    if _timm_kind(visual) is not None:
        return visual.trunk.blocks
    raise ConfigError(f"deep visual prompts need a vision transformer; this vision tower is a {type(visual).__name__}"
                      f"{' (timm ' + type(visual.trunk).__name__ + ')' if hasattr(visual, 'trunk') else ''}")


def vision_width(visual: nn.Module) -> int:
    if is_open_clip_vit(visual):
        return visual.transformer.width
    vision_blocks(visual)  # refuses a tower without blocks
    return int(visual.trunk.embed_dim)


def vision_pre_norm(visual: nn.Module) -> nn.Module:
    """The norm the embedded tokens pass before the first block (open_clip's ln_pre, timm's norm_pre): what MaPLe and
    PromptSRC put their first visual prompt through."""
    if is_open_clip_vit(visual):
        return visual.ln_pre
    vision_blocks(visual)  # refuses a tower without blocks
    return visual.trunk.norm_pre


def image_token_count(visual: nn.Module) -> int:
    """1 + P: how many output tokens `encode_image_prompted(..., return_tokens=True)` gives per image (the class token, or
    a ResNet's pooled feature, and the patches), read off the tower without running it."""
    if is_open_clip_vit(visual):
        return 1 + int(visual.grid_size[0]) * int(visual.grid_size[1])
    if _timm_kind(visual) is not None:
        trunk = visual.trunk
        _check_timm_tokens(trunk)
        grid = trunk.patch_embed.grid_size
        return 1 + int(grid[0]) * int(grid[1])
    if is_resnet(visual):
        return int(visual.attnpool.positional_embedding.shape[0])  # 1 + HW: resnet_tokens' pooled row and positions
    raise _no_patch_tokens(visual)


def _check_timm_tokens(trunk: nn.Module) -> None:
    """Patch tokens of a timm tower come from its class token's path: refused where it pools otherwise."""
    if not (trunk.attn_pool is None and trunk.global_pool == "token"):
        raise ConfigError(f"patch features need a tower that pools its class token; timm {type(trunk).__name__} pools "
                          f"by {'attention' if trunk.attn_pool is not None else trunk.global_pool!r}")


def _no_patch_tokens(visual: nn.Module) -> ConfigError:
    return ConfigError(f"patch features need a ViT or a ResNet's attention pool; this vision tower is a {type(visual).__name__}")


def run_block(block: nn.Module, x: Tensor, checkpointed: bool = False, **kwargs) -> Tensor:
    """`block(x, **kwargs)`; with `checkpointed` (model.checkpointing) and a gradient to compute, its activations are
    not kept but recomputed in the backward pass (torch.utils.checkpoint, non-reentrant): the same values and
    gradients, less memory, a second forward of the block."""
    if checkpointed and torch.is_grad_enabled():
        return checkpoint(block, x, use_reentrant=False, **kwargs)
    return block(x, **kwargs)


def encode_image_other(visual: nn.Module, images: Tensor, prompts: Tensor | None, return_tokens: bool, persist: bool,
                       checkpointed: bool = False) -> Tensor:
    """`clip.encode_image_prompted` for a vision tower other than open_clip's ViT (same arguments and outputs)."""
    if _timm_kind(visual) is not None:
        return _timm_prompted(visual, images, prompts, return_tokens, persist, checkpointed)
    if prompts is not None:
        vision_blocks(visual)  # refuses, naming the tower
    if return_tokens:
        if not is_resnet(visual):
            raise _no_patch_tokens(visual)
        return resnet_tokens(visual, images)
    return visual(images)


def _timm_prompted(visual: nn.Module, images: Tensor, prompts: Tensor | None, return_tokens: bool, persist: bool,
                   checkpointed: bool = False) -> Tensor:
    """timm's `forward_features` + `forward_head` (then open_clip's head) with deep visual prompts: see the module
    docstring; the prompt arguments as `clip.encode_image_prompted`'s."""
    trunk = visual.trunk
    eva = _timm_kind(visual) == "eva"
    x = trunk.patch_embed(images)
    if eva:
        x, rope = trunk._pos_embed(x)  # (B, N, width), the patches' rotary embedding (N - prefix, 2 * head_dim) or None
    else:
        x, rope = trunk.patch_drop(trunk._pos_embed(x)), None
    x = trunk.norm_pre(x)  # (B, N, width)
    per_image = prompts is not None and prompts.dim() == 4
    depth = 0 if prompts is None else prompts.shape[int(per_image)]
    n_tok = 0 if prompts is None else prompts.shape[1 + int(per_image)]
    extra = 0  # prompt tokens in x
    for i, block in enumerate(trunk.blocks):
        if i < depth:
            tokens = prompts[:, i] if per_image else prompts[i].unsqueeze(0).expand(x.shape[0], -1, -1)  # (B, n_tok, width)
            x = torch.cat([x, tokens.to(x.dtype)], dim=1)  # (B, N + n_tok, width)
            extra = n_tok
        x = run_block(block, x, checkpointed, rope=_unrotated(rope, extra)) if eva else run_block(block, x, checkpointed)
        if extra and (not persist or i < depth - 1):
            x, extra = x[:, :-extra], 0  # drop this block's prompt outputs
    if extra:
        x = x[:, :-extra]  # the persisting prompt outputs, before the norm and the pooling
    x = trunk.norm(x)
    if return_tokens:
        _check_timm_tokens(trunk)
        x = torch.cat([x[:, :1], x[:, trunk.num_prefix_tokens:]], dim=1)  # (B, 1 + patches, width): class token, patches
        return visual.head(trunk.head(trunk.head_drop(trunk.fc_norm(x))))  # token by token, as the pooled class token
    return visual.head(trunk.forward_head(x))  # (B, embed_dim)


def _unrotated(rope: Tensor | None, extra: int) -> Tensor | None:
    """The rotary embedding with `extra` rows that rotate by zero (sin 0, cos 1: `apply_rot_embed_cat` splits the last
    dimension into sin and cos halves) for the prompt tokens appended after the patches."""
    if rope is None or not extra:
        return rope
    pad = rope.new_zeros(*rope.shape[:-2], extra, rope.shape[-1])
    pad[..., rope.shape[-1] // 2:] = 1
    return torch.cat([rope, pad], dim=-2)


def resnet_tokens(visual: nn.Module, images: Tensor) -> Tensor:
    """(B, 1 + HW, embed_dim): a ModifiedResNet's attention pool with every position as a query (open_clip's
    `AttentionPool2d.forward`, keeping all its outputs): token 0 is the pooled feature (the mean position's query),
    the others the patches'."""
    x = visual.stem(images)
    x = visual.layer4(visual.layer3(visual.layer2(visual.layer1(x))))
    pool = visual.attnpool
    x = x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3]).permute(2, 0, 1)  # NCHW -> (HW)NC
    x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0)  # (HW+1)NC
    x = x + pool.positional_embedding[:, None, :].to(x.dtype)  # (HW+1)NC
    x, _ = F.multi_head_attention_forward(
        query=x, key=x, value=x, embed_dim_to_check=x.shape[-1], num_heads=pool.num_heads,
        q_proj_weight=pool.q_proj.weight, k_proj_weight=pool.k_proj.weight, v_proj_weight=pool.v_proj.weight,
        in_proj_weight=None, in_proj_bias=torch.cat([pool.q_proj.bias, pool.k_proj.bias, pool.v_proj.bias]),
        bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0., out_proj_weight=pool.c_proj.weight,
        out_proj_bias=pool.c_proj.bias, use_separate_proj_weight=True, training=pool.training, need_weights=False,
    )
    return x.permute(1, 0, 2)  # (B, 1 + HW, embed_dim)
