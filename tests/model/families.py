"""Tiny random-init stand-ins of every open_clip backbone family, built offline: each an open_clip model config (written
to a folder and registered with open_clip, as `model.config_file` does) whose towers are the family's own classes at
tiny widths and depths.

- "vit": fedur-tiny (open_clip's VisionTransformer, CLIP's causal text tower): OpenAI's, LAION's, DFN's, MetaCLIP's.
- "resnet": open_clip's ModifiedResNet (RN50's family).
- "siglip": timm's VisionTransformer with SigLIP's flags (no class token, attention-pool "map" head) and a non-causal
  text tower pooling its last token, a logit bias, and a Hugging Face tokenizer (T5's ids: pad 0, end 1) built here
  from a word list, where the real one comes from the hub (`timm/ViT-B-16-SigLIP`).
- "eva02": timm's Eva with EVA02-CLIP's flags (rotary positions, SwiGLU, sub-LN, class-token pooling + linear head)
  and CLIP's causal text tower in a CustomTextCLIP.
- "pe": timm's Eva with PE-Core's flags (rotary attention, pre-transformer norm, "map" head).
- "convnext": timm's ConvNeXt (a convolutional tower: no tokens), CLIP's text tower.

The timm towers are registered with timm under their `fedur_tiny_*` names (as timm's own `vit_base_patch16_siglip_224`
is), so open_clip's TimmModel builds them by name.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import open_clip

from fedur.model.clip import PACKAGE_MODEL_CONFIGS

FAMILIES = ("vit", "resnet", "siglip", "eva02", "pe", "convnext")
TEXT = {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}
TIMM = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 2}
WORDS = ["x", "a", "photo", "of", "the", "circle", "square", "triangle", "cross", "star", "heart", "ring", "wave",
         "arrow", "moon", "dog", "cat", "texture", "type", "pet"]


def _register_timm() -> None:
    """timm's model names for the tiny towers (once per process)."""
    import timm
    from timm.layers import LayerNorm
    from timm.models import register_model
    from timm.models.convnext import ConvNeXt
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    if "fedur_tiny_siglip" in timm.list_models("fedur_tiny_*"):
        return

    def tower(cls, **fixed):
        def build(pretrained: bool = False, pretrained_cfg=None, pretrained_cfg_overlay=None, cache_dir=None, **kwargs):
            model = cls(**{**fixed, **kwargs})  # the architecture's arguments (TimmModel's num_classes, global_pool)
            model.pretrained_cfg = model.default_cfg = {}  # no pretrained weights: nothing to describe
            return model
        return build

    towers = {
        "fedur_tiny_siglip": tower(VisionTransformer, **TIMM, class_token=False, global_pool="map", act_layer="gelu_tanh"),
        "fedur_tiny_eva02": tower(Eva, **TIMM, qkv_fused=False, mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True,
                                  scale_attn_inner=True, use_rot_pos_emb=True, ref_feat_shape=(4, 4), global_pool="token"),
        "fedur_tiny_pe": tower(Eva, **TIMM, mlp_ratio=4.0, global_pool="map", attn_type="rope", use_pre_transformer_norm=True,
                               use_rot_pos_emb=True, ref_feat_shape=(4, 4), rope_grid_offset=1.0, rope_grid_indexing="xy",
                               attn_pool_num_heads=2, attn_pool_mlp_ratio=4.0, norm_layer=partial(LayerNorm, eps=1e-5)),
        "fedur_tiny_convnext": tower(ConvNeXt, depths=(1, 1, 1, 1), dims=(8, 16, 24, 32)),
    }
    for name, build in towers.items():
        build.__name__ = build.__qualname__ = name
        register_model(build)


def siglip_tokenizer(folder: Path) -> Path:
    """A Hugging Face tokenizer in `folder` with T5's special ids (pad 0, end 1, unknown 2) over WORDS: what
    `transformers.AutoTokenizer.from_pretrained` loads, as it loads SigLIP's from the hub."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return folder


def config(family: str, folder: Path) -> dict:
    if family == "vit":
        return json.loads((PACKAGE_MODEL_CONFIGS / "fedur-tiny.json").read_text())
    if family == "resnet":
        return {"embed_dim": 32, "vision_cfg": {"image_size": 64, "layers": [1, 1, 1, 1], "width": 8, "head_width": 16},
                "text_cfg": TEXT}
    timm_cfg = {"image_size": 32, "timm_model_name": f"fedur_tiny_{family}", "timm_model_pretrained": False}
    if family == "siglip":
        return {"embed_dim": 32, "init_logit_bias": -10, "custom_text": True,
                "vision_cfg": {**timm_cfg, "timm_pool": "map", "timm_proj": "none"},
                "text_cfg": {**TEXT, "vocab_size": len(WORDS) + 3, "hf_tokenizer_name": str(siglip_tokenizer(folder / "tokenizer")),
                             "tokenizer_kwargs": {"clean": "canonicalize"}, "no_causal_mask": True, "proj_bias": True,
                             "pool_type": "last", "norm_kwargs": {"eps": 1e-6}}}
    if family == "eva02":
        return {"embed_dim": 24, "custom_text": True, "vision_cfg": {**timm_cfg, "timm_pool": "token", "timm_proj": None},
                "text_cfg": TEXT}
    if family == "pe":
        return {"embed_dim": 32, "custom_text": True, "vision_cfg": {**timm_cfg, "timm_pool": "map", "timm_proj": None},
                "text_cfg": TEXT}
    if family == "convnext":
        return {"embed_dim": 32, "vision_cfg": {**timm_cfg, "timm_pool": "", "timm_proj": "linear"}, "text_cfg": TEXT}
    raise ValueError(family)


def config_file(family: str, folder: Path) -> Path:
    """The family's tiny model config as `model.config_file` takes it: <folder>/fedur-tiny-<family>.json (its stem
    the model name), registered with open_clip."""
    _register_timm()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"fedur-tiny-{family}.json"
    path.write_text(json.dumps(config(family, folder)))
    open_clip.add_model_config(path)
    return path
