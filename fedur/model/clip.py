"""Load a frozen open_clip CLIP, and run its towers on prompt-extended inputs.

The two `encode_*` functions re-enter open_clip's own text and vision paths (open_clip 3.3,
`open_clip/model.py::CLIP.encode_text` and `open_clip/transformer.py::VisionTransformer.forward`) so
that prompts can be inserted; tests/model/test_clip.py checks that with empty prompts they give exactly
what open_clip gives.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import open_clip
import torch
import torch.nn.functional as F
from open_clip.transformer import text_global_pool
from torch import Tensor, nn

from fedur.errors import ConfigError, FedurError
from fedur.model import towers
from fedur.model.towers import encode_image_other, is_open_clip_vit, run_block, text_tower, vision_blocks, vision_width
from fedur.network import reachable

PACKAGE_MODEL_CONFIGS = Path(__file__).parent / "configs"
PACKAGE_WEIGHTS = Path(__file__).parent / "weights"  # <model name>.pt: the weights fedur ships (fedur-demo)
SHIPPED = "fedur"  # the model.pretrained tag of shipped weights
_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


class ModelUnavailableError(FedurError, RuntimeError):
    """The requested model or its weights cannot be loaded here; the message says what to do."""


@dataclass
class FrozenCLIP:
    model: nn.Module
    preprocess: Callable
    tokenizer: Callable
    image_size: int


def load_clip(
    name: str,
    pretrained: str | None,
    config_file: str | None = None,
    cache_dir: str | None = None,
) -> FrozenCLIP:
    """Build an open_clip CLIP with every weight frozen (requires_grad False, eval mode).

    With `pretrained=None` the weights are a random init drawn from torch's global RNG: seed it first.
    """
    weights = check_model(name, pretrained, config_file, cache_dir, weights=False)  # fedur.app.settle checked them
    try:
        with _quiet_if(weights is None):  # open_clip warns about the random init we asked for
            model, _, preprocess = open_clip.create_model_and_transforms(
                name, pretrained=weights, cache_dir=cache_dir, force_quick_gelu=needs_quick_gelu(name, pretrained)
            )
    except (RuntimeError, NotImplementedError, ValueError, KeyError) as err:
        if weights is None or not Path(weights).exists():
            raise
        raise ModelUnavailableError(
            f"model.pretrained={weights} cannot be loaded into {name} ({type(err).__name__}: {_first_line(err)}); "
            "check that model.name (and model.config_file) is the architecture these weights were trained with"
        ) from err
    model.requires_grad_(False)
    model.eval()
    image_size = model.visual.image_size
    image_size = image_size[0] if isinstance(image_size, (tuple, list)) else image_size
    return FrozenCLIP(model, preprocess, open_clip.get_tokenizer(name), int(image_size))


@contextlib.contextmanager
def _quiet_if(quiet: bool):
    if quiet:
        logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def check_model(name: str, pretrained: str | None, config_file: str | None, cache_dir: str | None,
                weights: bool = True) -> str | None:
    """Fail at once, before any compute, when the model or its weights cannot be had (with `weights`, a local
    weights file is also read and checked against the architecture); return what open_clip should load as
    `pretrained`."""
    register_model_config(config_file)
    if name not in open_clip.list_models():
        hint = f" It is not a file stem of model.config_file={config_file}." if config_file else ""
        raise ModelUnavailableError(
            f"Unknown open_clip model {name!r}.{hint} Pick one of open_clip.list_models() (e.g. ViT-B-32, "
            "ViT-B-16), or point model.config_file at an open_clip model-config JSON named <model.name>.json."
        )
    resolved = resolve_pretrained(name, pretrained, cache_dir)
    check_tokenizer(name, cache_dir)
    if weights and resolved is not None and Path(resolved).is_file():
        check_weights(name, resolved)
    return resolved


def check_tokenizer(name: str, cache_dir: str | None) -> None:
    """A tokenizer open_clip takes from the Hugging Face Hub (SigLIP's, `text_cfg.hf_tokenizer_name`) can be had:
    transformers is installed, and the tokenizer is a local folder, cached, or the hub is reachable."""
    hub = ((open_clip.get_model_config(name) or {}).get("text_cfg") or {}).get("hf_tokenizer_name")
    if not hub or Path(hub).is_dir():
        return
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ModelUnavailableError(f"{name}'s tokenizer is a Hugging Face one ({hub}): pip install transformers "
                                    "(or pip install 'fedur[hf]')") from None
    if _hub_reachable():
        return
    try:
        with _quiet_if(True):
            AutoTokenizer.from_pretrained(hub, cache_dir=cache_dir, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelUnavailableError(
            f"{name}'s tokenizer comes from the Hugging Face Hub ({hub}), which is unreachable (offline?), and it is not "
            f"cached ({type(err).__name__}). On a machine with internet run: python -c \"from transformers import "
            f"AutoTokenizer; AutoTokenizer.from_pretrained('{hub}').save_pretrained('DIR')\"; copy DIR here and point "
            f"model.config_file at a copy of {name}'s config whose text_cfg.hf_tokenizer_name is DIR (or copy the whole "
            "Hugging Face cache and set model.cache_dir)"
        ) from err


def check_weights(name: str, path: str) -> None:
    """The weights file at `path` can be read and its tensors have the shapes of architecture `name`.

    Reads only the file's index (shapes), and builds `name` on the meta device (no memory, no compute).
    Position embeddings may differ: open_clip resizes them to the model's image and context size.
    """
    shapes = weight_shapes(path)
    with _quiet_if(True), torch.device("meta"):  # built on the meta device: no init of the weights (a second on CPU)
        skeleton = open_clip.create_model(name, pretrained=None, device="meta")
    expected = {key: tuple(t.shape) for key, t in skeleton.state_dict().items()}
    try:  # open_clip's own conversion of third-party layouts, on shape-only (meta) tensors
        from open_clip.factory import convert_state_dict

        shapes = {k: tuple(t.shape) for k, t in convert_state_dict(skeleton, _meta(shapes)).items()}
    except Exception:  # noqa: BLE001  a layout open_clip does not convert: compare as it is
        pass
    hint = (
        f"set model.name (and model.config_file for a custom architecture) to the architecture these weights "
        f"were trained with, or point model.pretrained at weights of {name}"
    )
    common = sorted(expected.keys() & shapes.keys())
    if not common:
        raise ModelUnavailableError(
            f"model.pretrained={path} holds none of the tensors of {name} (it has e.g. "
            f"{', '.join(sorted(shapes)[:3]) or 'nothing'}); {hint}"
        )
    differ = [k for k in common if shapes[k] != expected[k] and not k.endswith("positional_embedding")]
    missing = sorted(expected.keys() - shapes.keys() - {"logit_bias"})
    if differ:
        key = differ[0]
        more = f" (and {len(differ) - 1} more tensors differ)" if len(differ) > 1 else ""
        raise ModelUnavailableError(
            f"model.pretrained={path} does not fit model.name={name}: {key} has shape {shapes[key]} in the file "
            f"but {expected[key]} in {name}{more}; {hint}"
        )
    if missing:
        raise ModelUnavailableError(
            f"model.pretrained={path} lacks {len(missing)} tensors of {name} (e.g. {', '.join(missing[:3])}); {hint}"
        )


def fake_clip(name: str, mode) -> FrozenCLIP:
    """Model `name` (its config registered) built in the FakeTensorMode `mode` (shapes, no memory), frozen, with its
    real tokenizer and real causal masks (small; the shared-prefix check reads them): what fedur/train/memory.py runs a
    step on (the logit scale is real too). The class is open_clip's factory's choice (CLIP, CustomTextCLIP, CoCa),
    built directly (the factory's move to a device cannot swap fake parameters) on the meta device, then made fake."""
    from open_clip.model import CLIP, CustomTextCLIP

    cfg = copy.deepcopy(open_clip.get_model_config(name))
    custom = cfg.pop("custom_text", False) or "hf_model_name" in cfg["text_cfg"]
    cls = (open_clip.CoCa if "multimodal_cfg" in cfg else CustomTextCLIP) if custom else CLIP
    if "timm_model_name" in cfg["vision_cfg"]:
        cfg["vision_cfg"]["timm_model_pretrained"] = False
    with torch.device("meta"), _quiet_if(True):  # (timm's constructors read numbers they compute: not fake ones)
        model = cls(**cfg)
    with mode:
        model.to_empty(device="cpu")  # fake CPU tensors: CPU autocast applies to them
    for holder in (model, getattr(model, "text", None)):
        mask = getattr(holder, "attn_mask", None)
        if mask is not None:  # open_clip's build_causal_mask, as a real tensor
            holder.attn_mask = torch.empty(mask.shape, device="cpu").fill_(float("-inf")).triu_(1)
    model.logit_scale = nn.Parameter(torch.zeros(model.logit_scale.shape, device="cpu"))  # read as a number: real (its value unused)
    model.requires_grad_(False)
    model.eval()
    size = model.visual.image_size
    return FrozenCLIP(model, None, open_clip.get_tokenizer(name), int(size[0] if isinstance(size, (tuple, list)) else size))


def backbone_features(name: str) -> tuple[str, frozenset[str]]:
    """The towers of open_clip model `name` in words and which prompts they take (fedur/model/towers.py), read from
    its skeleton on the meta device (no memory, no weights). A Hugging Face text tower is named from the config
    alone (building it would fetch its config from the hub): it takes no text context."""
    cfg = open_clip.get_model_config(name) or {}
    hf_text = (cfg.get("text_cfg") or {}).get("hf_model_name")
    if hf_text:
        return f"Hugging Face text tower {hf_text}", frozenset()
    with _quiet_if(True), torch.device("meta"):
        skeleton = open_clip.create_model(name, pretrained=None, device="meta")
    return towers.family(skeleton), towers.features(skeleton)


def weight_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """{name: shape} of a state-dict file (.safetensors, or torch.save'd, as open_clip reads it), without
    loading the tensors' data where the format allows; a ModelUnavailableError when it cannot be read."""
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as err:  # noqa: BLE001  torch and safetensors raise several types for broken files
        raise ModelUnavailableError(
            f"model.pretrained={path} cannot be read ({type(err).__name__}: {_first_line(err)}): the file is "
            "truncated, still downloading, or not a checkpoint; download it again"
        ) from err
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelUnavailableError(f"model.pretrained={path} is not a state dict of tensors (found {type(state).__name__})")
    return {key.removeprefix("module."): tuple(t.shape) for key, t in state.items()}


def _meta(shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    return {key: torch.empty(shape, device="meta") for key, shape in shapes.items()}


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def needs_quick_gelu(name: str, pretrained: str | None) -> bool:
    """Weights trained with QuickGELU (OpenAI's) need it switched on: open_clip 3.3 only warns when a
    pretrained tag and the model config disagree. A local file of OpenAI weights needs a `-quickgelu` name."""
    if pretrained is None or pretrained not in open_clip.list_pretrained_tags_by_model(name):
        return False
    return bool(open_clip.get_pretrained_cfg(name, pretrained).get("quick_gelu", False))


def register_model_config(config_file: str | None) -> None:
    """Make the package's model configs (fedur-tiny) and an optional user JSON known to open_clip."""
    open_clip.add_model_config(PACKAGE_MODEL_CONFIGS)
    if config_file is None:
        return
    path = Path(config_file)
    if not path.is_file():
        raise ModelUnavailableError(f"model.config_file={config_file} does not exist.")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ModelUnavailableError(f"model.config_file={config_file} is not valid JSON: {err}") from err
    if not isinstance(cfg, dict) or not {"embed_dim", "vision_cfg", "text_cfg"} <= cfg.keys():
        raise ModelUnavailableError(
            f"model.config_file={config_file} is not an open_clip model config: it needs the keys "
            "embed_dim, vision_cfg and text_cfg (see open_clip/model_configs/ViT-B-32.json)."
        )
    open_clip.add_model_config(path)


def resolve_pretrained(name: str, pretrained: str | None, cache_dir: str | None) -> str | None:
    """Return what open_clip should load, or fail at once with what to download and where to point."""
    if pretrained in (None, "", "none", "random"):
        return None
    if pretrained == SHIPPED:
        path = PACKAGE_WEIGHTS / f"{name}.pt"
        if not path.is_file():
            shipped = ", ".join(sorted(p.stem for p in PACKAGE_WEIGHTS.glob("*.pt"))) or "none"
            raise ModelUnavailableError(
                f"model.pretrained={SHIPPED} means the weights fedur ships for model.name, but fedur ships none for "
                f"{name} (it ships weights for: {shipped}). Use an open_clip tag, a weights file, or null."
            )
        return str(path)
    path = Path(pretrained).expanduser()
    if path.exists():
        return str(path)
    if os.sep in pretrained or pretrained.endswith(_WEIGHT_SUFFIXES):
        raise ModelUnavailableError(f"model.pretrained={pretrained} does not exist.")
    tags = open_clip.list_pretrained_tags_by_model(name)
    if pretrained not in tags:
        raise ModelUnavailableError(
            f"model.pretrained={pretrained!r} is neither a file nor a pretrained tag of {name}. "
            f"Tags of {name}: {', '.join(tags) or 'none'}."
        )
    hub = open_clip.get_pretrained_cfg(name, pretrained).get("hf_hub", "")
    if hub and not _in_hf_cache(hub, cache_dir) and not _hub_reachable():
        repo = hub.rstrip("/")
        local_name = f"{name}-quickgelu" if pretrained == "openai" and "quickgelu" not in name else name
        raise ModelUnavailableError(
            f"Weights {name}/{pretrained} are not cached and the Hugging Face Hub is unreachable (offline?).\n"
            f"  On a machine with internet, download https://huggingface.co/{repo} "
            "(open_clip_model.safetensors or open_clip_pytorch_model.bin) and copy it here; then set\n"
            f"    model.name={local_name}  model.pretrained=/path/to/that/file\n"
            "  (or copy the whole Hugging Face cache and set model.cache_dir). For a custom architecture, "
            "also set model.config_file=/path/to/<model.name>.json."
        )
    return pretrained


def _in_hf_cache(hub: str, cache_dir: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    repo, filename = os.path.split(hub.rstrip("/")) if not hub.endswith("/") else (hub.rstrip("/"), "")
    names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    return any(isinstance(try_to_load_from_cache(repo, n, cache_dir=cache_dir), str) for n in names)


def _hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("0", "", "false"):
        return False
    return reachable("huggingface.co")


def encode_text_embeddings(model: nn.Module, embeddings: Tensor, tokens: Tensor, deep: Tensor | None = None,
                           start: int = 1, checkpointed: bool = False) -> Tensor:
    """`CLIP.encode_text` from token embeddings instead of token ids (unnormalised features); also a
    CustomTextCLIP's `TextTransformer` (SigLIP, EVA, PE: `towers.text_tower`).

    embeddings: (n, L, width) with L <= context_length; tokens: (n, L) ids, used only to find the
    pooled (end-of-text) position. With a causal mask, positions after the EOT token cannot influence
    it, so callers may truncate L to the last EOT position + 1; without one (SigLIP) every position counts, and
    L must be the tower's whole context.

    deep: deep text prompts (J - 1, n_ctx, width), the same for every row, or (n, J - 1, n_ctx, width), each row
    its own: before block i (1 <= i < J) positions start..start + n_ctx - 1 of the residual stream (the context's:
    1.. after CLIP's start token) are replaced by prompt i - 1, without a positional embedding (MaPLe's and
    PromptSRC's text blocks); None: plain CLIP. checkpointed: recompute each block's activations in the backward
    pass instead of keeping them (model.checkpointing; `towers.run_block`).
    """
    text = text_tower(model)
    length = embeddings.shape[1]
    cast_dtype = text.transformer.get_cast_dtype()
    x = embeddings.to(cast_dtype) + text.positional_embedding[:length].to(cast_dtype)  # (n, L, width)
    attn_mask = text.attn_mask[:length, :length] if text.attn_mask is not None else None
    if deep is None and not checkpointed:
        x = text.transformer(x, attn_mask=attn_mask)
    else:
        x = _deep_transformer(text.transformer, x, attn_mask, deep, start, checkpointed)
    x = text.ln_final(x)
    x = text_global_pool(x, tokens, text.text_pool_type, eos_token_id=getattr(text, "text_eos_id", None))
    if text.text_projection is not None:
        x = text.text_projection(x) if isinstance(text.text_projection, nn.Linear) else x @ text.text_projection
    return x  # (n, embed_dim)


def _deep_transformer(transformer: nn.Module, x: Tensor, attn_mask: Tensor | None, deep: Tensor | None, start: int = 1,
                      checkpointed: bool = False) -> Tensor:
    """open_clip's `Transformer.forward` on (n, L, width) with the deep text prompts `deep` (None: none) put in before
    each block (`encode_text_embeddings`), each block checkpointed with `checkpointed`."""
    per_row = deep is not None and deep.dim() == 4
    n_deep, n_ctx = (0, 0) if deep is None else (deep.shape[-3], deep.shape[-2])
    if not transformer.batch_first:
        x = x.transpose(0, 1).contiguous()  # NLD -> LND
    seq_dim = 1 if transformer.batch_first else 0
    for i, block in enumerate(transformer.resblocks):
        if 1 <= i <= n_deep:
            prompt = (deep[:, i - 1] if per_row else deep[i - 1].unsqueeze(0).expand(x.shape[1 - seq_dim], -1, -1)).to(x.dtype)
            prompt = prompt if seq_dim == 1 else prompt.transpose(0, 1)  # (n, n_ctx, width) or (n_ctx, n, width)
            rest = x.shape[seq_dim] - start - n_ctx
            x = torch.cat([x.narrow(seq_dim, 0, start), prompt, x.narrow(seq_dim, start + n_ctx, rest)], dim=seq_dim)
        x = run_block(block, x, checkpointed, attn_mask=attn_mask)
    return x if transformer.batch_first else x.transpose(0, 1)


def encode_image_prompted(
    visual: nn.Module, images: Tensor, prompts: Tensor | None, *, return_tokens: bool = False, persist: bool = False,
    checkpointed: bool = False,
) -> Tensor:
    """`VisionTransformer.forward` with deep visual prompts (VPT-deep), unnormalised features.

    prompts: (depth, n_tok, width), the same for every image; (B, depth, n_tok, width), each image its own
    (several clients' images in one batch); or None for plain CLIP. Block i < depth sees its own n_tok
    tokens appended after the CLS and patch tokens; their outputs are dropped before the next block, so
    each block gets fresh ones.

    Returns the pooled feature (B, embed_dim), or with `return_tokens=True` every output token
    (B, 1 + patches, embed_dim): CLS first, then the patch tokens (prompt tokens excluded), each after
    `ln_post` and the projection, not normalised. When the model pools by its CLS token (open_clip's
    default), token 0 is the pooled feature. Models with an attentional pooler have no per-token
    projection and are refused.

    persist: the last prompted block's prompt outputs go on through every later block (MaPLe's and PromptSRC's
    vision towers: their CLS token attends to them), and are dropped only before the pooling; False (VPT-deep):
    dropped after each prompted block. checkpointed: each block's activations recomputed in the backward pass
    instead of kept (model.checkpointing; `towers.run_block`).
    """
    if not is_open_clip_vit(visual):  # a timm ViT or EVA, a ResNet, ...: fedur/model/towers.py
        return encode_image_other(visual, images, prompts, return_tokens, persist, checkpointed)
    x = visual._embeds(images)  # (B, 1 + patches, width)
    per_image = prompts is not None and prompts.dim() == 4
    depth = 0 if prompts is None else prompts.shape[int(per_image)]
    n_tok = 0 if prompts is None else prompts.shape[1 + int(per_image)]
    transformer = visual.transformer
    if not transformer.batch_first:
        x = x.transpose(0, 1)
    seq_dim = 1 if transformer.batch_first else 0
    for i, block in enumerate(transformer.resblocks):
        if i < depth:
            if per_image:  # (B, n_tok, width): each image's own
                tokens = prompts[:, i].to(x.dtype) if seq_dim == 1 else prompts[:, i].to(x.dtype).transpose(0, 1)
            else:
                tokens = prompts[i].to(x.dtype).unsqueeze(1 - seq_dim).expand(*_expand_shape(x, n_tok, seq_dim))
            x = torch.cat([x, tokens], dim=seq_dim)  # (B, 1 + patches + n_tok, width)
            x = run_block(block, x, checkpointed)
            if not persist or i < depth - 1:
                x = x.narrow(seq_dim, 0, x.shape[seq_dim] - n_tok)  # drop this block's prompt outputs
        else:
            x = run_block(block, x, checkpointed)
    if persist and depth:
        x = x.narrow(seq_dim, 0, x.shape[seq_dim] - n_tok)  # the persisting prompt outputs, before the pooling
    if not transformer.batch_first:
        x = x.transpose(0, 1)
    if return_tokens:
        if getattr(visual, "attn_pool", None) is not None:
            raise ConfigError(
                f"return_tokens needs a ViT whose tokens go through ln_post and proj one by one; "
                f"{type(visual).__name__} has an attentional pooler"
            )
        x = visual.ln_post(x)  # (B, 1 + patches, width)
        return x @ visual.proj if visual.proj is not None else x  # (B, 1 + patches, embed_dim)
    pooled, _ = visual._pool(x)
    if visual.proj is not None:
        pooled = pooled @ visual.proj
    return pooled  # (B, embed_dim)


def _expand_shape(x: Tensor, n_tok: int, seq_dim: int) -> tuple[int, int, int]:
    batch = x.shape[1 - seq_dim]
    return (batch, n_tok, x.shape[-1]) if seq_dim == 1 else (n_tok, batch, x.shape[-1])


def vision_width_and_depth(model: nn.Module) -> tuple[int, int]:
    """The vision transformer's width and blocks (open_clip's ViT, timm's ViT and EVA); a ConfigError for a tower
    without blocks (a ResNet: set model.visual_tokens 0, or a method without visual prompts)."""
    return vision_width(model.visual), len(vision_blocks(model.visual))


@torch.no_grad()
def zero_shot_weights(clip: FrozenCLIP, classnames: list[str], template: str, device: torch.device) -> Tensor:
    """Normalised text features of `template.format(name)` for every class: (C, embed_dim)."""
    tokens = clip.tokenizer([template.format(name) for name in classnames]).to(device)
    return F.normalize(clip.model.encode_text(tokens).float(), dim=-1)
