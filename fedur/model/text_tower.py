"""The text tower with the class-independent prompt prefix computed once.

A CoOp prompt is `[SOS] X_1..X_n <class name> . [EOT]`: its first `1 + n_ctx` tokens are the same for
every class. Under the text transformer's causal mask a token only sees the tokens before it, so the
activations of those shared tokens are the same for every class in every layer. `clip.py`'s
`encode_text_embeddings` still computes them C times; `encode_text_shared_prefix` computes them once,
as one sequence of length `n_shared`, and runs each class only on its own tokens (class name, '.',
EOT), which attend to the shared prefix's keys and values plus their own earlier tokens. This is the
same computation, reordered: the output equals `encode_text_embeddings` up to floating-point
rounding, and so do the gradients. The token-wise layers (LNs, QKV and output projections, MLP) see
the classes' own tokens packed, without the padding up to the longest class name; only attention
pads them.

For C classes with prompts of length L (the longest), a layer's token-wise work (~24 W^2 FLOPs per
token forward) drops from C*L tokens to n_shared + (the classes' own tokens up to their EOT); with
n_ctx=16 and CIFAR-like class names (L ~ 20-26) that is 4-6x fewer tokens. On ViT-B/32's text tower
(CPU, fp32, one thread) the forward + backward per optimizer step is x3.2 / x5.1 / x5.3 cheaper at
10 / 100 / 200 classes (benchmarks/round_cost.py, docs/performance.md).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from open_clip.transformer import ResidualAttentionBlock
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from fedur.model.clip import encode_text_embeddings

log = logging.getLogger(__name__)

_CAUSAL_CHECKED: weakref.WeakKeyDictionary[nn.Module, set[tuple[int, int]]] = weakref.WeakKeyDictionary()
_WARNED: set[str] = set()


def encode_text_shared_prefix(clip_model: nn.Module, embeddings: Tensor, tokens: Tensor, n_shared: int,
                              host_tokens: Tensor | None = None, deep: Tensor | None = None, start: int = 1,
                              checkpointed: bool = False) -> Tensor:
    """`encode_text_embeddings(clip_model, embeddings, tokens)` with the first `n_shared` positions
    computed once for all classes: (C, embed_dim), unnormalised; or for G contexts at once, (G, C, embed_dim).

    embeddings: (C, L, width) token embeddings whose rows `[:, :n_shared]` are the same for every
    class (SOS and the shared context; only row 0's are read, so gradients w.r.t. the shared rows
    land on `embeddings[0, :n_shared]`: their sum over classes, which is what a context expanded to
    every class receives, is the same as on the plain path); or (G, C, L, width), G prompts of the same
    classes (several clients' contexts, run.clients_per_step), each with its own prefix. tokens: (C, L)
    ids, used only to find the pooled position, as in `encode_text_embeddings`.

    Each class runs only its own tokens up to its pooled (EOT) position: the token-wise work (LNs,
    QKV and output projections, MLP) runs on those tokens packed, without padding; only attention
    sees them padded to the longest class. Nothing after a class's pooled position can reach it under
    the causal mask, so the padding never matters. The packing is worked out from `tokens` on the
    host once per tokens tensor (one device-to-host copy on an accelerator, then cached), or from
    `host_tokens`, the same ids kept on the CPU (then nothing is read back from the device; with
    `check_shared_prefix` called on the CPU model first, no call reads anything back).

    Falls back to `encode_text_embeddings` (with a one-time warning) where the trick does not apply:
    n_shared outside [1, L), no causal attention mask, or blocks other than open_clip's default
    `ResidualAttentionBlock`.

    deep: deep text prompts (J - 1, n_ctx, width), or (G, J - 1, n_ctx, width) one set per context, put in at
    positions start..start + n_ctx - 1 (the context's) before blocks 1..J - 1 (`encode_text_embeddings`). Those
    positions lie in the shared prefix (start + n_ctx = n_shared), which therefore stays the same for every class at
    every block: they are replaced there,
    once, and each prompt's gradient arrives once, as the sum over the classes that the plain path gives it.

    checkpointed: each block's activations are recomputed in the backward pass instead of kept (model.checkpointing).
    """
    grouped = embeddings.dim() == 4
    n_groups, n_cls, length, width = embeddings.shape if grouped else (1, *embeddings.shape)
    if deep is not None and start + deep.shape[-2] > n_shared:
        # internal: PromptedCLIP.check_deep_text refuses them first
        raise ValueError(f"deep text prompts of {deep.shape[-2]} tokens do not fit a shared prefix of {n_shared}")  # internal: see above
    reason = _unsupported(clip_model, n_shared, length)
    if reason is not None:
        if reason not in _WARNED:
            _WARNED.add(reason)
            log.warning("shared-prefix text tower not used (%s); computing every class in full", reason)
        if not grouped:
            return encode_text_embeddings(clip_model, embeddings, tokens, deep, start, checkpointed)
        rows = None if deep is None else deep.repeat_interleave(n_cls, dim=0)  # (G * C, J - 1, n_ctx, width)
        flat = encode_text_embeddings(clip_model, embeddings.reshape(n_groups * n_cls, length, width), tokens.repeat(n_groups, 1), rows,
                                      start, checkpointed)
        return flat.view(n_groups, n_cls, -1)

    layout = _layout(clip_model, tokens if host_tokens is None else host_tokens, n_shared, embeddings.device)
    cast_dtype = clip_model.transformer.get_cast_dtype()
    pos = clip_model.positional_embedding[:length].to(cast_dtype)
    if not grouped:
        embeddings = embeddings.unsqueeze(0)  # (1, C, L, width)
    shared = embeddings[:, 0, :n_shared].to(cast_dtype) + pos[:n_shared]  # (G, S, width)
    own = (embeddings[:, :, n_shared:].to(cast_dtype) + pos[n_shared:]).reshape(n_groups, n_cls * layout.n_own, -1)  # (G, C*T, width)
    if layout.packed is not None:
        own = own.index_select(1, layout.packed)  # (G, N, width): only the positions up to each class's EOT
    z = torch.cat([shared, own], dim=1)  # (G, S + N, width): each prefix, then its classes' own tokens

    mask = clip_model.attn_mask
    mask_shared = mask[:n_shared, :n_shared]  # (S, S): the prefix's own causal attention
    mask_own = mask[n_shared:length, :length]  # (T, S + T): own tokens see the prefix and earlier own tokens
    if deep is not None and not grouped:
        deep = deep.unsqueeze(0)  # (1, J - 1, n_ctx, width)
    n_deep, n_ctx = (0, 0) if deep is None else deep.shape[1:3]
    for i, block in enumerate(clip_model.transformer.resblocks):
        if 1 <= i <= n_deep:  # the prefix's positions 1..n_ctx: this block's prompts, no positional embedding
            z = torch.cat([z[:, :start], deep[:, i - 1].to(z.dtype), z[:, start + n_ctx:]], dim=1)  # (G, S + N, width)
        if checkpointed and torch.is_grad_enabled():  # recomputed in the backward pass (towers.run_block)
            z = checkpoint(_block, block, z, layout, mask_shared, mask_own, use_reentrant=False)
        else:
            z = _block(block, z, layout, mask_shared, mask_own)

    if not grouped:  # one context: the head on 2-D rows, as encode_text_embeddings (the same matmul kernels)
        z = z[0]  # (S + N, width)
    pooled = z.index_select(-2, layout.pooled)  # (G, C, width) or (C, width): each class's EOT row (or a prefix row)
    x = clip_model.ln_final(pooled)  # per-token LayerNorm: pooling first gives the same vectors
    proj = clip_model.text_projection
    if proj is not None:
        x = proj(x) if isinstance(proj, nn.Linear) else x @ proj
    return x  # (G, C, embed_dim) or (C, embed_dim)


@dataclass(frozen=True)
class _Layout:
    """Where each class's tokens sit in the flat (S + N, width) token matrix."""

    n_shared: int  # S
    n_cls: int  # C
    n_own: int  # T = L - S: own positions per class, padded
    packed: Tensor | None  # (N,) rows of the padded (C*T) own tokens that are kept; None: all are
    pooled: Tensor  # (C,) each class's pooled row in the flat matrix


_LAYOUTS: dict[tuple, tuple[weakref.ref, int, _Layout]] = {}


def _layout(clip_model: nn.Module, tokens: Tensor, n_shared: int, device: torch.device) -> _Layout:
    key = (id(tokens), n_shared, str(device), clip_model.text_pool_type, getattr(clip_model, "text_eos_id", None))
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0]() is tokens and hit[1] == tokens._version:
        return hit[2]
    layout = _make_layout(_pool_index(clip_model, tokens.detach().cpu()), tokens.shape[1], n_shared, device)
    if len(_LAYOUTS) > 64:  # drop entries of tensors that are gone
        for k in [k for k, v in _LAYOUTS.items() if v[0]() is None]:
            del _LAYOUTS[k]
    _LAYOUTS[key] = (weakref.ref(tokens), tokens._version, layout)
    return layout


def _pool_index(clip_model: nn.Module, tokens: Tensor) -> Tensor:
    """open_clip's `text_global_pool` position of every class: (C,)."""
    pool_type = clip_model.text_pool_type
    n_cls, length = tokens.shape
    if pool_type == "argmax":
        return tokens.argmax(dim=-1)
    if pool_type == "eos":
        return (tokens == clip_model.text_eos_id).int().argmax(dim=-1)
    if pool_type == "first":
        return torch.zeros(n_cls, dtype=torch.long, device="cpu")
    if pool_type == "last":
        return torch.full((n_cls,), length - 1, dtype=torch.long, device="cpu")
    raise ValueError(f"text_pool_type={pool_type!r}")  # internal: rejected earlier by _unsupported


def _make_layout(index: Tensor, length: int, n_shared: int, device: torch.device) -> _Layout:
    n_cls, n_own = index.shape[0], length - n_shared
    keep = torch.arange(n_own, device="cpu").unsqueeze(0) <= (index - n_shared).unsqueeze(1)  # (C, T): up to the EOT
    flat = keep.flatten().nonzero().squeeze(1)  # (N,)
    packed_row = torch.full((n_cls * n_own,), -1, dtype=torch.long, device="cpu")
    packed_row[flat] = torch.arange(flat.numel(), device="cpu")
    own_row = packed_row.view(n_cls, n_own)[torch.arange(n_cls, device="cpu"), (index - n_shared).clamp(min=0)]
    pooled = torch.where(index >= n_shared, n_shared + own_row, index.clamp(max=n_shared - 1))
    packed = None if flat.numel() == n_cls * n_own else flat.to(device)
    return _Layout(n_shared, n_cls, n_own, packed, pooled.to(device))


def _block(block: ResidualAttentionBlock, z: Tensor, layout: _Layout, mask_shared: Tensor, mask_own: Tensor) -> Tensor:
    """One `ResidualAttentionBlock` on G flat (S + N, width) token matrices: the token-wise parts (LNs,
    projections, MLP) run on the flat matrices; attention is split into each prefix's own (causal) and its
    classes' (to that prefix's keys, and causally to their own)."""
    attn: nn.MultiheadAttention = block.attn
    heads = attn.num_heads
    n_groups, _, width = z.shape
    head_dim = width // heads
    n_shared, n_cls, n_own = layout.n_shared, layout.n_cls, layout.n_own
    qkv = F.linear(block.ln_1(z), attn.in_proj_weight, attn.in_proj_bias)  # (G, S + N, 3 width)
    qkv_s, qkv_c = qkv.split([n_shared, qkv.shape[1] - n_shared], dim=1)
    # Each prefix: one causal sequence.
    q_s, k_s, v_s = qkv_s.reshape(n_groups, n_shared, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # (G, H, S, hd)
    out_s = F.scaled_dot_product_attention(q_s, k_s, v_s, attn_mask=_float_mask(mask_shared, q_s.dtype))
    out_s = out_s.transpose(1, 2).reshape(n_groups, n_shared, width)
    # The classes, padded to (C, T) for attention only.
    if layout.packed is not None:
        qkv_c = qkv_c.new_zeros(n_groups, n_cls * n_own, 3 * width).index_copy(1, layout.packed, qkv_c)
    q, k, v = qkv_c.reshape(n_groups, n_cls, n_own, 3, heads, head_dim).permute(3, 0, 4, 1, 2, 5).unbind(0)  # (G, H, C, T, hd)
    q = q * head_dim**-0.5
    to_shared = torch.matmul(q.reshape(n_groups, heads, n_cls * n_own, head_dim), k_s.transpose(-1, -2))  # (G, H, C*T, S)
    to_own = torch.matmul(q, k.transpose(-1, -2))  # (G, H, C, T, T)
    scores = torch.cat([to_shared.view(n_groups, heads, n_cls, n_own, n_shared), to_own], dim=-1)  # (G, H, C, T, S + T)
    probs = (scores + _float_mask(mask_own, scores.dtype)).softmax(dim=-1)
    p_shared, p_own = probs.split([n_shared, n_own], dim=-1)
    out_c = torch.matmul(p_shared.reshape(n_groups, heads, n_cls * n_own, n_shared).to(v_s.dtype), v_s)  # (G, H, C*T, hd)
    out_c = out_c.view(n_groups, heads, n_cls, n_own, head_dim) + torch.matmul(p_own.to(v.dtype), v)  # (G, H, C, T, hd)
    out_c = out_c.permute(0, 2, 3, 1, 4).reshape(n_groups, n_cls * n_own, width)
    if layout.packed is not None:
        out_c = out_c.index_select(1, layout.packed)  # (G, N, width)
    z = z + block.ls_1(attn.out_proj(torch.cat([out_s, out_c], dim=1)))
    return z + block.ls_2(block.mlp(block.ln_2(z)))


def _float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    if mask.dtype == torch.bool:  # True: not allowed to attend (nn.MultiheadAttention's convention)
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


def plan_shared_prefix(clip_model: nn.Module, host_tokens: Tensor, n_shared: int, device: torch.device) -> None:
    """Work out (and remember) the packing of the classes' own tokens for `host_tokens` on `device` now: what a pass
    on fake tensors (fedur/train/memory.py) cannot do, since the packing reads the token ids' values."""
    _layout(clip_model, host_tokens, n_shared, device)


def check_shared_prefix(clip_model: nn.Module, n_shared: int, length: int) -> str | None:
    """Why the shared-prefix path cannot run on this model, prefix and prompt length (None: it can). Its one
    read of the attention mask is remembered for the model, so calling this before the model moves to a device
    spares the device a read back."""
    return _unsupported(clip_model, n_shared, length)


def _unsupported(clip_model: nn.Module, n_shared: int, length: int) -> str | None:
    """Why the shared-prefix path cannot run on this model and prompt length, or None."""
    if not 1 <= n_shared < length:
        return f"n_shared={n_shared} is not in [1, {length})"
    if getattr(clip_model, "text_pool_type", None) not in ("argmax", "eos", "first", "last"):
        return f"text_pool_type={getattr(clip_model, 'text_pool_type', None)!r}"
    blocks = clip_model.transformer.resblocks
    if not all(type(b) is ResidualAttentionBlock and not hasattr(b, "ln_1_kv") for b in blocks):
        return f"text blocks of type {type(blocks[0]).__name__}"
    if any(b.attn.in_proj_weight is None or b.attn.dropout > 0 and b.attn.training for b in blocks):
        return "attention with separate q/k/v weights or active dropout"
    mask = getattr(clip_model, "attn_mask", None)
    if mask is None:
        return "the text tower has no attention mask (not causal)"
    if not _prefix_is_causal(clip_model, mask, n_shared, length):
        return "the text attention mask lets the shared prefix see later tokens"
    return None


def _prefix_is_causal(clip_model: nn.Module, mask: Tensor, n_shared: int, length: int) -> bool:
    """The shared positions cannot attend to any later one (checked once per model, prefix and length:
    the check reads the mask on the host)."""
    checked = _CAUSAL_CHECKED.setdefault(clip_model, set())
    if (n_shared, length) in checked:
        return True
    block = mask[:n_shared, n_shared:length]
    ok = bool(block.all()) if mask.dtype == torch.bool else bool(torch.isneginf(block).all())
    if ok:
        checked.add((n_shared, length))
    return ok
