"""The learnable prompts: a CoOp text context and its init (deep visual prompts are initialised the same way); which
are shared is the method's to say (fedur/methods/pieces.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedur.errors import ConfigError


class TextPrompt(nn.Module):
    """`[SOS] X_1..X_n <class name> . [EOS]` with the X's learnable and shared by all classes (CoOp, CSC off); with
`suffix` words, fixed ones between the context and the class name (`[SOS] X_1 X_2 of a <class name> .`: MaPLe's).

    The frozen prefix/suffix embeddings are buffers that are not saved (persistent=False): they are a
    function of the class names and the backbone, so a client's state is only `ctx`.
    """

    def __init__(
        self,
        token_embedding: nn.Embedding,
        tokenizer: Callable,
        classnames: list[str],
        n_ctx: int,
        init: Tensor,
        suffix: str = "",
        whole: bool = False,
    ) -> None:
        """whole: keep every position of the tokenizer's context (a text tower without a causal mask, SigLIP's: the
        padding takes part in attention and the last position is pooled); False: cut after the last end token."""
        super().__init__()
        width = token_embedding.weight.shape[1]
        if not classnames:  # the data layer refuses a dataset with fewer than two classes before this is built
            raise ValueError("a text prompt needs at least one class name, got none")  # internal: see above
        if init.shape != (n_ctx, width):
            raise ValueError(f"text prompt init has shape {tuple(init.shape)}, expected {(n_ctx, width)}")  # internal: built from the shape
        prefix = " ".join(["X"] * n_ctx + ([suffix] if suffix else []))
        texts = [f"{prefix} {name.replace('_', ' ')}.".strip() for name in classnames]
        tokens = tokenizer(texts)  # (C, context_length)
        start, placeholder = context_start(tokenizer)
        if n_ctx and not bool((tokens[:, start : start + n_ctx] == placeholder).all()):
            raise ConfigError("the model's tokenizer does not map 'X' to one token, so fedur cannot place the text context "
                              "in its class prompts; choose another model.name (an open_clip CLIP with its BPE tokenizer)")
        if not whole:  # causal attention: nothing after the last EOT can reach a pooled position, so cut the padding
            length = int(tokens.argmax(dim=-1).max()) + 1
            tokens = tokens[:, :length]  # (C, L)
        with torch.no_grad():
            embedded = token_embedding(tokens)  # (C, L, width)
        self.start = start  # the context's first position: 1 after CLIP's start token, 0 where there is none (SigLIP's)
        self.register_buffer("tokens", tokens, persistent=False)
        self.register_buffer("prefix", embedded[:, :start].clone(), persistent=False)  # (C, start, width): SOS, or nothing
        self.register_buffer("suffix", embedded[:, start + n_ctx :].clone(), persistent=False)  # (C, *, width)
        self.ctx = nn.Parameter(init.clone())  # (n_ctx, width)

    def forward(self, ctx: Tensor | None = None) -> Tensor:
        """The class prompts' token embeddings with the context `ctx` (n_ctx, width) (default: `self.ctx`):
        (C, L, width); or with G contexts (G, n_ctx, width) at once: (G, C, L, width)."""
        n_cls = self.prefix.shape[0]
        ctx = self.ctx if ctx is None else ctx
        if ctx.dim() == 3:  # several clients' contexts
            n_groups = ctx.shape[0]
            ctx = ctx.unsqueeze(1).expand(-1, n_cls, -1, -1)  # (G, C, n_ctx, width)
            fixed = [t.unsqueeze(0).expand(n_groups, -1, -1, -1) for t in (self.prefix, self.suffix)]
            return torch.cat([fixed[0], ctx.to(self.prefix.dtype), fixed[1]], dim=2)  # (G, C, L, width)
        ctx = ctx.unsqueeze(0).expand(n_cls, -1, -1)  # (C, n_ctx, width)
        return torch.cat([self.prefix, ctx.to(self.prefix.dtype), self.suffix], dim=1)  # (C, L, width)


def context_start(tokenizer: Callable) -> tuple[int, int]:
    """(position, token id) of the word 'X' in the tokenizer's ids of "X": where a text context starts in a prompt (1
    after CLIP's start token; 0 for a tokenizer without one, SigLIP's), and the placeholder id that marks it."""
    empty, one = tokenizer([""])[0], tokenizer(["X"])[0]
    start = int((empty != one).nonzero()[0])
    return start, int(one[start])


def init_prompt(shape: tuple[int, ...], std: float, seed: int) -> Tensor:
    """N(0, std^2) init from its own generator, so every rank and every client start from the same values."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, device="cpu") * std
