"""FedMaPLe and FedPromptSRC against transcriptions of the original code's call sequence.

MaPLe: muzairkhattak/multimodal-prompt-learning @ 69bce21ae8eda80ad6187534b2dce09cf6c59e17
- trainers/maple.py: `TextEncoder.forward` L52-66, `MultiModalPromptLearner.__init__` L84-131 (ctx from "a photo of a",
  `proj` L103, `compound_prompts_text` L111-114, `compound_prompt_projections` L116-117, the class prompts L119-131),
  `forward` L159-176, `CustomCLIP.forward` L189-204, `_get_clones` L207-208;
- clip/model.py: `ResidualAttentionBlock_MaPLe.forward` L287-331, `VisionTransformer_MaPLe.forward` L445-476.
PromptSRC: muzairkhattak/PromptSRC @ bb95c77b634d63488f2cad81ff4a72d53bdd06d5
- trainers/promptsrc.py: `TextEncoder.forward` L58-69, `VLPromptLearner.__init__` L88-133 (the teacher L108-128),
  `CustomCLIP.forward` L185-211, the GPA weights L262-270, `forward_backward`'s L_SCL L297-313 and GPA L320-335,
  `state_dict_weighting` / `state_dict_add` L338-356, `get_gauss` L358-360; trainers/imagenet_templates.py L3-64;
- clip/model.py: `ResidualAttentionBlock_IVLP` L191-256, the IVLP `Transformer` L342-348, `VisionTransformer.forward`
  L394-424.

The transcriptions run the frozen open_clip blocks (batch-first, so the original's LND `x[a:b]` is `x[:, a:b]` here)
and leave out the fp16 casts (`.half()`, `.type(dtype)`): fedur is float32 on purpose (docs/reference-parity.md).
The widths are the backbone's (the original hard-codes ViT-B's 512 and 768). Two backbones: the tiny CLIP (text 2
blocks, vision 3, both 64 wide: the text tower is the shallower) and a wider one built here (text 4 blocks 48 wide,
vision 3 blocks 96 wide: the vision tower is the shallower, and a swapped width or a transposed projection has the
wrong shape).
"""

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.methods import FedMaPLe, FedPromptSRC, ServerRound
from fedur.methods.base import GlobalView, LocalBatch
from fedur.methods.maple import COUPLED
from fedur.methods.pieces import initial_values, piece_seed
from fedur.methods.promptsrc import imagenet_templates
from fedur.model.classifier import PromptedCLIP

NAMES = ["cat", "dog", "red_bird", "ship"]  # an underscore: both codes write it as a space
RUN_SEED = 3

# PromptSRC's trainers/imagenet_templates.py L3-64, in its order.
IMAGENET_TEMPLATES = [
    "a photo of a {}.", "a bad photo of a {}.", "a photo of many {}.", "a sculpture of a {}.", "a photo of the hard to see {}.",
    "a low resolution photo of the {}.", "a rendering of a {}.", "graffiti of a {}.", "a bad photo of the {}.",
    "a cropped photo of the {}.", "a tattoo of a {}.", "the embroidered {}.", "a photo of a hard to see {}.",
    "a bright photo of a {}.", "a photo of a clean {}.", "a photo of a dirty {}.", "a dark photo of the {}.",
    "a drawing of a {}.", "a photo of my {}.", "the plastic {}.", "a photo of the cool {}.", "a close-up photo of a {}.",
    "a black and white photo of the {}.", "a painting of the {}.", "a painting of a {}.", "a pixelated photo of the {}.",
    "a sculpture of the {}.", "a bright photo of the {}.", "a cropped photo of a {}.", "a plastic {}.",
    "a photo of the dirty {}.", "a jpeg corrupted photo of a {}.", "a blurry photo of the {}.", "a photo of the {}.",
    "a good photo of the {}.", "a rendering of the {}.", "a {} in a video game.", "a photo of one {}.", "a doodle of a {}.",
    "a close-up photo of the {}.", "the origami {}.", "the {} in a video game.", "a sketch of a {}.", "a doodle of the {}.",
    "a origami {}.", "a low resolution photo of a {}.", "the toy {}.", "a rendition of the {}.", "a photo of the clean {}.",
    "a photo of a large {}.", "a rendition of a {}.", "a photo of a nice {}.", "a photo of a weird {}.",
    "a blurry photo of a {}.", "a cartoon {}.", "art of a {}.", "a sketch of the {}.", "a embroidered {}.",
    "a pixelated photo of a {}.", "itap of the {}.",
]


@pytest.fixture(scope="module")
def wide_clip(tmp_path_factory):
    """A random-init CLIP whose towers differ: text 4 blocks of width 48, vision 3 blocks of width 96."""
    from fedur.model.clip import load_clip

    config = {"embed_dim": 32,
              "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 96, "layers": 3, "head_width": 32, "mlp_ratio": 2.0},
              "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 48, "heads": 2, "layers": 4, "mlp_ratio": 2.0}}
    path = tmp_path_factory.mktemp("configs") / "fedur-test-maple-wide.json"
    path.write_text(json.dumps(config))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return load_clip("fedur-test-maple-wide", None, str(path))


@pytest.fixture(params=["tiny", "wide"])
def clip(request):
    return request.getfixturevalue("tiny_clip" if request.param == "tiny" else "wide_clip")


def widths(clip):
    return clip.model.ln_final.weight.shape[0], clip.model.visual.transformer.width  # the original's 512, 768


def tokenize(clip, texts):
    """`torch.cat([clip.tokenize(p) for p in texts])` with the backbone's tokenizer."""
    return torch.cat([clip.tokenizer([p]) for p in texts])


def perturbed(pieces, scale=0.1, seed=0):
    """Pieces as after some training: every element moved, so that no two prompts or projections are alike."""
    generator = torch.Generator().manual_seed(seed)
    return {n: t + scale * torch.randn(t.shape, generator=generator) for n, t in pieces.items()}


def trainable(pieces):
    return {n: t.detach().clone().requires_grad_() for n, t in pieces.items()}


def client_of(batch):
    return ClientState(0, np.arange(batch), np.arange(0), {})


# --- MaPLe, transcribed ------------------------------------------------------------------------------------------------
def maple_learner_draws(clip, n_ctx, depth, seed, ctx_init="a photo of a"):
    """`MultiModalPromptLearner.__init__` L84-117 under torch.manual_seed(seed), with the backbone's widths: ctx from
    the words (no draw), then `proj`, the compound text prompts, one Linear cloned for the deeper projections."""
    ctx_dim, vision_width = widths(clip)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        prompt = tokenize(clip, [ctx_init.replace("_", " ")])
        with torch.no_grad():
            embedding = clip.model.token_embedding(prompt)
        ctx_vectors = embedding[0, 1: 1 + n_ctx, :]
        proj = nn.Linear(ctx_dim, vision_width)
        compound_prompts_text = nn.ParameterList([nn.Parameter(torch.empty(n_ctx, ctx_dim)) for _ in range(depth - 1)])
        for single_para in compound_prompts_text:
            nn.init.normal_(single_para, std=0.02)
        single_layer = nn.Linear(ctx_dim, vision_width)
        compound_prompt_projections = nn.ModuleList([copy.deepcopy(single_layer) for i in range(depth - 1)])  # _get_clones
    return ctx_vectors, proj, compound_prompts_text, compound_prompt_projections


def maple_block(block, inputs, n_ctx, text_layer, first_layer, attn_mask=None):
    """`ResidualAttentionBlock_MaPLe.forward` (clip/model.py L287-331) around an open_clip block."""
    x, compound_prompts_deeper, counter = inputs
    if not first_layer:
        if len(compound_prompts_deeper) > 0:
            if not text_layer:
                if not (counter > len(compound_prompts_deeper) - 1):
                    prefix = x[:, 0:x.shape[1] - n_ctx]  # the previous layer's prompt outputs removed
                    visual_context = compound_prompts_deeper[counter].expand(x.shape[0], -1, -1)
                    x = torch.cat([prefix, visual_context], dim=1)
                    counter += 1
            else:
                if not (counter > len(compound_prompts_deeper) - 1):
                    prefix = x[:, :1]
                    suffix = x[:, 1 + n_ctx:]
                    textual_context = compound_prompts_deeper[counter].expand(x.shape[0], -1, -1)
                    x = torch.cat([prefix, textual_context, suffix], dim=1)
                    counter += 1
    x = block(x, attn_mask=attn_mask)  # x + attention(ln_1(x)), then x + mlp(ln_2(x))
    return [x, compound_prompts_deeper, counter]


class ReferenceMaPLe:
    """MaPLe's `CustomCLIP` (eval: the logits) with the learnable values taken from fedur's pieces."""

    def __init__(self, clip, classnames, n_ctx, ctx_init):
        self.clip, self.n_ctx = clip, n_ctx
        prompt_prefix = ctx_init if ctx_init else " ".join(["X"] * n_ctx)  # L92 / L97
        classnames = [name.replace("_", " ") for name in classnames]
        prompts = [prompt_prefix + " " + name + "." for name in classnames]
        self.tokenized_prompts = tokenize(clip, prompts)
        with torch.no_grad():
            embedding = clip.model.token_embedding(self.tokenized_prompts)
        self.token_prefix = embedding[:, :1, :]  # SOS
        self.token_suffix = embedding[:, 1 + n_ctx:, :]  # ("of a"), CLS, EOS

    def prompt_learner(self, p):
        """`MultiModalPromptLearner.forward` L159-176."""
        ctx = p["text_ctx"].unsqueeze(0).expand(len(self.token_prefix), -1, -1)
        prompts = torch.cat([self.token_prefix, ctx, self.token_suffix], dim=1)
        compound_prompts_text = list(p["deep_text"])
        visual_deep_prompts = [F.linear(compound_prompts_text[i], w, b) for i, (w, b) in enumerate(zip(p["deep_proj_w"], p["deep_proj_b"]))]
        return prompts, F.linear(p["text_ctx"], p["proj_w"], p["proj_b"]), compound_prompts_text, visual_deep_prompts

    def text_encoder(self, prompts, tokenized_prompts, compound_prompts_deeper_text):
        """`TextEncoder.forward` L52-66."""
        model = self.clip.model
        x = prompts + model.positional_embedding
        combined = [x, compound_prompts_deeper_text, 0]
        for i, block in enumerate(model.transformer.resblocks):
            combined = maple_block(block, combined, self.n_ctx, True, i == 0, model.attn_mask)
        x = model.ln_final(combined[0])
        return x[torch.arange(x.shape[0]), tokenized_prompts.argmax(dim=-1)] @ model.text_projection

    def image_encoder(self, x, shared_ctx, compound_deeper_prompts):
        """`VisionTransformer_MaPLe.forward` L445-476."""
        visual = self.clip.model.visual
        x = visual.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        x = torch.cat([visual.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1]), x], dim=1)
        x = x + visual.positional_embedding
        x = torch.cat([x, shared_ctx.expand(x.shape[0], -1, -1)], dim=1)  # after the positional embedding, before ln_pre
        x = visual.ln_pre(x)
        outputs = [x, compound_deeper_prompts, 0]
        for i, block in enumerate(visual.transformer.resblocks):
            outputs = maple_block(block, outputs, self.n_ctx, False, i == 0)
        x = visual.ln_post(outputs[0][:, 0, :])
        return x @ visual.proj

    def __call__(self, image, p):
        """`CustomCLIP.forward` L189-204 (eval: the logits)."""
        logit_scale = self.clip.model.logit_scale.exp()
        prompts, shared_ctx, deep_compound_prompts_text, deep_compound_prompts_vision = self.prompt_learner(p)
        text_features = self.text_encoder(prompts, self.tokenized_prompts, deep_compound_prompts_text)
        image_features = self.image_encoder(image, shared_ctx, deep_compound_prompts_vision)
        image_features = image_features / image_features.norm(dim=-1, keepdim=True)
        text_features = text_features / text_features.norm(dim=-1, keepdim=True)
        return logit_scale * image_features @ text_features.t()


# --- PromptSRC (IVLP), transcribed -------------------------------------------------------------------------------------
def ivlp_block(block, x, vpt_shallow, n_ctx, text_layer, attn_mask=None):
    """`ResidualAttentionBlock_IVLP.forward` (clip/model.py L229-256); `vpt_shallow` None: add_prompt False."""
    if vpt_shallow is not None:
        if not text_layer:
            prefix = x[:, 0:x.shape[1] - n_ctx]
            x = torch.cat([prefix, vpt_shallow.expand(x.shape[0], -1, -1)], dim=1)
        else:
            prefix, suffix = x[:, :1], x[:, 1 + n_ctx:]
            x = torch.cat([prefix, vpt_shallow.expand(x.shape[0], -1, -1), suffix], dim=1)
    return block(x, attn_mask=attn_mask)


def ivlp_prompts(per_layer, prompts_needed, layers):
    """The IVLP `Transformer` (L342-348): block i has its own VPT_shallow where i != 0 and prompts_needed > i."""
    return [per_layer[i - 1] if i != 0 and prompts_needed > i else None for i in range(layers)]


class ReferencePromptSRC:
    """PromptSRC's `CustomCLIP` with `VLPromptLearner`, the IVLP towers and `forward_backward`'s L_SCL; the learnable
    values (ctx, each text block's VPT_shallow, the image encoder's VPT and VPT_shallow) taken from fedur's pieces."""

    def __init__(self, clip, classnames, n_ctx, ctx_init, text_depth, vision_depth):
        self.clip, self.n_ctx, self.text_depth, self.vision_depth = clip, n_ctx, text_depth, vision_depth
        prompt_prefix = ctx_init if ctx_init else " ".join(["X"] * n_ctx)
        classnames = [name.replace("_", " ") for name in classnames]  # L108
        prompts = [prompt_prefix + " " + name + "." for name in classnames]
        self.tokenized_prompts = tokenize(clip, prompts)
        with torch.no_grad():
            embedding = clip.model.token_embedding(self.tokenized_prompts)
            all_teacher_features = []  # L119-128: the raw features of every template, averaged
            for single_template in IMAGENET_TEMPLATES:
                x = [single_template.replace("{}", name) for name in classnames]
                x_tokenized = tokenize(clip, x)
                text_features = clip.model.encode_text(x_tokenized)
                all_teacher_features.append(text_features.unsqueeze(1))
        self.fixed_embeddings = torch.cat(all_teacher_features, dim=1).mean(dim=1)
        self.token_prefix, self.token_suffix = embedding[:, :1, :], embedding[:, 1 + n_ctx:, :]

    def text_encoder(self, prompts, deep_text):
        """`TextEncoder.forward` L58-69 through the IVLP text blocks (prompts_needed = PROMPT_DEPTH_TEXT)."""
        model = self.clip.model
        x = prompts + model.positional_embedding
        blocks = model.transformer.resblocks
        for block, vpt in zip(blocks, ivlp_prompts(list(deep_text), self.text_depth, len(blocks))):
            x = ivlp_block(block, x, vpt, self.n_ctx, True, model.attn_mask)
        x = model.ln_final(x)
        return x[torch.arange(x.shape[0]), self.tokenized_prompts.argmax(dim=-1)] @ model.text_projection

    def image_encoder(self, x, visual_prompts):
        """`VisionTransformer.forward` L394-424 (VPT = the first visual prompt, the blocks' VPT_shallow the others)."""
        visual = self.clip.model.visual
        vpt, vpt_shallow = visual_prompts[0], list(visual_prompts[1:])
        x = visual.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        x = torch.cat([visual.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1]), x], dim=1)
        x = x + visual.positional_embedding
        x = torch.cat([x, vpt.expand(x.shape[0], -1, -1)], dim=1)
        x = visual.ln_pre(x)
        blocks = visual.transformer.resblocks
        for block, prompt in zip(blocks, ivlp_prompts(vpt_shallow, self.vision_depth, len(blocks))):
            x = ivlp_block(block, x, prompt, visual_prompts.shape[1], False)
        x = visual.ln_post(x[:, 0, :])
        return x @ visual.proj

    def zs_image_encoder(self, image):
        return self.clip.model.visual(image)  # load_clip_to_cpu(cfg, True).visual: every depth 0, no prompt

    def __call__(self, image, p, training):
        """`CustomCLIP.forward` L185-211 (the cross-entropy left out of the training tuple)."""
        logit_scale = self.clip.model.logit_scale.exp()
        ctx = p["text_ctx"].unsqueeze(0).expand(len(self.token_prefix), -1, -1)
        prompts = torch.cat([self.token_prefix, ctx, self.token_suffix], dim=1)  # VLPromptLearner.forward L161-170
        text_features = self.text_encoder(prompts, p["deep_text"])
        image_features = self.image_encoder(image, p["visual"])
        image_features = image_features / image_features.norm(dim=-1, keepdim=True)
        text_features = text_features / text_features.norm(dim=-1, keepdim=True)
        logits = logit_scale * image_features @ text_features.t()
        if not training:
            return logits
        fixed_embeddings = self.fixed_embeddings / self.fixed_embeddings.norm(dim=-1, keepdim=True)
        with torch.no_grad():
            zero_shot_features = self.zs_image_encoder(image)
            zero_shot_features = zero_shot_features / zero_shot_features.norm(dim=-1, keepdim=True)
            zero_shot_logits = logit_scale * zero_shot_features @ fixed_embeddings.t()
        return text_features, fixed_embeddings, zero_shot_features, image_features, zero_shot_logits, logits


def promptsrc_l_scl(outputs, text_weight=25.0, image_weight=10.0):
    """`forward_backward` L297-312: L_SCL (the cross-entropy is the labeller's in fedur)."""
    normalized_text_features, zs_clip_text_embeddings, zs_image_embedd, image_ft, zero_shot_logits, logits = outputs
    loss_scl_text = F.l1_loss(normalized_text_features, zs_clip_text_embeddings, reduction="mean") * text_weight
    loss_scl_image = F.l1_loss(image_ft, zs_image_embedd, reduction="mean") * image_weight
    L_SCL_logits = F.kl_div(F.log_softmax(logits / 1, dim=1), F.log_softmax(zero_shot_logits / 1, dim=1), reduction="sum",  # noqa: N806
                            log_target=True) * (1 * 1) / logits.numel()
    return L_SCL_logits, loss_scl_text, loss_scl_image


def assert_same_gradients(ours, theirs, pieces):
    """Both losses reach every piece, with the same gradient."""
    g_ours = torch.autograd.grad(ours, list(pieces.values()))
    g_theirs = torch.autograd.grad(theirs, list(pieces.values()))
    for name, a, b in zip(pieces, g_ours, g_theirs):
        assert float(a.abs().sum()) > 0, f"no gradient reaches {name}"
        # float32 rounding in another order (the shared-prefix tower sums the classes' gradients once): relative to
        # the gradient's scale
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()), msg=lambda m, name=name: f"{name}: {m}")


# --- FedMaPLe ----------------------------------------------------------------------------------------------------------
def test_maple_coupled_pieces_are_the_originals_draws(clip):
    """proj, the compound text prompts and the cloned deeper projections: MaPLe's draws in its order under the pieces'
    one seed, at the backbone's widths; the context is the words' embeddings."""
    model = PromptedCLIP(clip, NAMES, 2, 0, None, 0.02, seed=3, ctx_suffix="of a")
    method = FedMaPLe(ctx_init="a photo of a")
    declared = method.pieces()
    seeds = {piece_seed(RUN_SEED, name, declared[name]) for name in COUPLED}
    assert len(seeds) == 1  # one build: the pieces' draws follow one another as the module's do
    depth = min(model.text_depth, len(clip.model.visual.transformer.resblocks))  # 9 capped at the shallower tower
    ctx, proj, deep, projections = maple_learner_draws(clip, 2, depth, seeds.pop())
    pieces = initial_values(declared, model, RUN_SEED)
    ctx_dim, vision_width = widths(clip)
    assert pieces["proj_w"].shape == (vision_width, ctx_dim) and pieces["deep_text"].shape == (depth - 1, 2, ctx_dim)
    assert torch.equal(pieces["text_ctx"], ctx)  # "a", "photo"
    assert torch.equal(pieces["proj_w"], proj.weight) and torch.equal(pieces["proj_b"], proj.bias)
    assert torch.equal(pieces["deep_text"], torch.stack(list(deep)))
    assert torch.equal(pieces["deep_proj_w"], torch.stack([layer.weight for layer in projections]))
    assert torch.equal(pieces["deep_proj_b"], torch.stack([layer.bias for layer in projections]))
    assert not torch.equal(pieces["deep_proj_w"][0], pieces["proj_w"])  # proj is a Linear of its own


def test_maple_uncloned_projections_are_distinct(wide_clip):
    """clone_projections=False: each deeper projection its own draw; the draws before them are unchanged."""
    model = PromptedCLIP(wide_clip, NAMES, 2, 0, None, 0.02, seed=3)
    cloned = initial_values(FedMaPLe().pieces(), model, RUN_SEED)
    own = initial_values(FedMaPLe(clone_projections=False).pieces(), model, RUN_SEED)
    assert cloned["deep_proj_w"].shape[0] == 2  # J = 3: two deeper projections
    assert torch.equal(cloned["deep_proj_w"][0], cloned["deep_proj_w"][1])  # _get_clones: identical at the start
    assert not torch.allclose(own["deep_proj_w"][0], own["deep_proj_w"][1])
    assert not torch.allclose(own["deep_proj_b"][0], own["deep_proj_b"][1])
    for name in ("proj_w", "proj_b", "deep_text"):
        assert torch.equal(own[name], cloned[name]), name


def test_maple_depth_caps_at_the_shallower_tower_and_refuses_deeper(tiny_clip, wide_clip):
    """null: 9 capped at the shallower tower (the tiny text tower's 2 blocks; the wide vision tower's 3); deeper than
    either tower: a ConfigError; 1: shallow MaPLe, no deeper prompt."""
    for clip, depth in ((tiny_clip, 2), (wide_clip, 3)):
        model = PromptedCLIP(clip, NAMES, 2, 0, None, 0.02, seed=3)
        assert initial_values(FedMaPLe().pieces(), model, RUN_SEED)["deep_text"].shape[0] == depth - 1
        with pytest.raises(ConfigError, match="depth"):
            initial_values(FedMaPLe(depth=depth + 1).pieces(), model, RUN_SEED)
        shallow = initial_values(FedMaPLe(depth=1).pieces(), model, RUN_SEED)
        assert shallow["deep_text"].shape[0] == 0 and shallow["deep_proj_w"].shape[0] == 0


@pytest.mark.parametrize("depth", [None, 1])
@pytest.mark.parametrize("ctx_init", ["a photo of a", None])
def test_maple_logits_are_the_originals_custom_clip(clip, ctx_init, depth):
    """method.text_side + method.logits = MaPLe's CustomCLIP.forward, at the initial pieces and at trained ones; the
    cross-entropy's gradient reaches every piece, as the original's."""
    suffix = "of a" if ctx_init else ""  # "a photo of a {name}." with only "a photo" learnable at n_ctx 2
    model = PromptedCLIP(clip, NAMES, 2, 0, None, 0.02, seed=3, ctx_suffix=suffix)
    method = FedMaPLe(depth=depth, ctx_init=ctx_init)
    reference = ReferenceMaPLe(clip, NAMES, 2, ctx_init)
    # The class prompts' token ids are the original's but for the context's placeholders; fedur cuts the padding
    # after the last end token (causal: nothing after it reaches a pooled position).
    ours, theirs = model.text_prompt.tokens, reference.tokenized_prompts
    assert torch.equal(ours[:, 3:], theirs[:, 3:ours.shape[1]]) and torch.equal(ours[:, 0], theirs[:, 0])
    assert not theirs[:, ours.shape[1]:].any() and torch.equal(ours.argmax(-1), theirs.argmax(-1))
    torch.manual_seed(5)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 2])
    start = initial_values(method.pieces(), model, RUN_SEED)
    for values in (start, perturbed(start)):
        pieces = trainable(values)
        logits = method.logits(model, images, pieces, method.text_side(model, pieces), client_of(3))
        expected = reference(images, pieces)
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        if depth is None:  # every piece has elements
            assert_same_gradients(F.cross_entropy(logits, labels), F.cross_entropy(expected, labels), pieces)


# --- FedPromptSRC ------------------------------------------------------------------------------------------------------
def test_promptsrc_templates_are_promptsrcs_60():
    assert list(imagenet_templates()) == IMAGENET_TEMPLATES and len(IMAGENET_TEMPLATES) == 60


DEPTHS = {"tiny": (None, None, 2, 3), "wide": (3, 2, 3, 2)}  # (text_depth, vision_depth, J_t, J_v): nulls cap at the towers


@pytest.mark.parametrize("ctx_init", ["a photo of a", None])
def test_promptsrc_logits_and_penalty_are_the_originals(clip, request, ctx_init):
    """IVLP logits (independent visual prompts, the first through ln_pre, the last kept to the end) and the penalty
    = forward_backward's L_SCL with the 60-template teacher; the same gradients reach every piece."""
    text_depth, vision_depth, j_t, j_v = DEPTHS[request.node.callspec.params["clip"]]
    model = PromptedCLIP(clip, NAMES, 4, 4, None, 0.02, seed=3)  # PromptSRC's 4 + 4 tokens; "a photo of a" fills the 4
    method = FedPromptSRC(text_depth=text_depth, vision_depth=vision_depth, ctx_init=ctx_init)
    reference = ReferencePromptSRC(clip, NAMES, 4, ctx_init, j_t, j_v)
    start = initial_values(method.pieces(), model, RUN_SEED)
    ctx_dim, vision_width = widths(clip)
    assert start["deep_text"].shape == (j_t - 1, 4, ctx_dim) and start["visual"].shape == (j_v, 4, vision_width)
    if ctx_init:
        assert torch.equal(start["text_ctx"], clip.model.token_embedding.weight[tokenize(clip, [ctx_init])[0, 1:5]])
    torch.manual_seed(6)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([1, 0, 3])
    pieces = trainable(perturbed(start))
    client = client_of(3)
    torch.testing.assert_close(method.logits(model, images, pieces, method.text_side(model, pieces), client),
                               reference(images, pieces, training=False), rtol=1e-5, atol=1e-5)

    model.train()  # a local training step: the logits leave the step's image features for the penalty
    try:
        text = method.text_side(model, pieces)
        logits = method.logits(model, images, pieces, text, client, torch.arange(3))
        batch = LocalBatch(images, labels, torch.zeros(3, len(NAMES), dtype=torch.bool), torch.arange(3), logits,
                           lambda other: F.cross_entropy(other, labels))
        penalty = method.penalty(model, pieces, start, client, text, batch)
    finally:
        model.eval()
    outputs = reference(images, pieces, training=True)
    torch.testing.assert_close(logits, outputs[-1], rtol=1e-5, atol=1e-5)
    expected = sum(promptsrc_l_scl(outputs))
    torch.testing.assert_close(penalty, expected, rtol=1e-5, atol=1e-7)
    assert_same_gradients(F.cross_entropy(logits, labels) + penalty, F.cross_entropy(outputs[-1], labels) + expected, pieces)


def test_promptsrc_penalty_weights_each_term(tiny_clip):
    """text_weight and image_weight scale their own term of L_SCL (the original's 25 and 10), the KL's weight is 1."""
    model = PromptedCLIP(tiny_clip, NAMES, 4, 4, None, 0.02, seed=3)
    reference = ReferencePromptSRC(tiny_clip, NAMES, 4, None, 2, 3)
    torch.manual_seed(7)
    images = torch.randn(2, 3, 32, 32)
    labels = torch.tensor([0, 1])
    pieces = perturbed(initial_values(FedPromptSRC().pieces(), model, RUN_SEED))
    kl, text_l1, image_l1 = promptsrc_l_scl(reference(images, pieces, training=True), 1.0, 1.0)
    assert min(float(kl), float(text_l1), float(image_l1)) > 0
    for weights in ((25.0, 10.0), (3.0, 0.0), (0.0, 0.5)):
        method = FedPromptSRC(text_weight=weights[0], image_weight=weights[1])
        model.train()
        try:
            text = method.text_side(model, pieces)
            logits = method.logits(model, images, pieces, text, client_of(2), torch.arange(2))
            batch = LocalBatch(images, labels, torch.zeros(2, len(NAMES), dtype=torch.bool), torch.arange(2), logits,
                               lambda other: F.cross_entropy(other, labels))
            penalty = method.penalty(model, pieces, pieces, client_of(2), text, batch)
        finally:
            model.eval()
        torch.testing.assert_close(penalty, weights[0] * text_l1 + weights[1] * image_l1 + kl, rtol=1e-5, atol=1e-7)


# --- FedPromptSRC's GPA ------------------------------------------------------------------------------------------------
SHAPES = {"text_ctx": (4, 3), "deep_text": (1, 4, 3), "visual": (2, 4, 5)}


def federated_rounds(method, rounds, model, clients=3, seed=0):
    """`rounds` rounds through aggregate / download / global_model as the round loop calls them: random uploads, some
    clients sitting a round out. Returns each round's FedAvg, the server's model after it, and a client's pieces."""
    generator = torch.Generator().manual_seed(seed)
    start = {n: torch.randn(s, generator=generator) for n, s in SHAPES.items()}
    shared, state = dict(start), {}
    client = ClientState(0, np.arange(2), np.arange(0), dict(start))
    averages, server, downloaded, metrics = [], [], [], []
    for r in range(1, rounds + 1):
        weights = torch.tensor([3.0, 0.0 if r % 3 == 0 else 5.0, 2.0])
        uploads = {n: torch.randn(clients, *s, generator=generator) for n, s in SHAPES.items()}
        for n in uploads:
            uploads[n][weights == 0] = 0  # a client that did not upload: zeros
        result = method.aggregate(ServerRound(r, rounds, uploads, weights, shared, state))
        shared, state = result.shared, state if result.state is None else result.state
        method.download(client, shared, state)
        view = GlobalView(dict(shared), dict(state), start, lambda name: pytest.fail(f"no personal piece: {name}"))
        averages.append({n: sum(w * u for w, u in zip(weights, uploads[n])) / weights.sum() for n in SHAPES})
        server.append(method.global_model(model, view).pieces)
        downloaded.append(dict(client.pieces))
        metrics.append(result.metrics)
    return averages, server, downloaded, metrics


def get_gauss(mu, sigma):
    """PromptSRC's `get_gauss` (L358-360): the normal pdf."""
    gauss = lambda x: (1 / (sigma * np.sqrt(2 * np.pi))) * np.exp(-0.5 * ((x - mu) / sigma) ** 2)  # noqa: E731
    return gauss


@pytest.mark.parametrize(("rounds", "mean", "std"), [(20, 0.75, 0.05), (7, 0.5, 0.3)])  # PromptSRC's 15 and 1 of 20 epochs
def test_gpa_is_the_gaussian_weighted_average_of_the_rounds(tiny_clip, rounds, mean, std):
    """The server's model after round r: sum_r' w_r' theta_r' / sum_r' w_r' over rounds 1..r, w the normal pdf at the
    round with mean gpa_mean R and std gpa_std R, theta each round's FedAvg; at r = R it is PromptSRC's normalised
    Gaussian ensemble over R epochs; the clients download the plain FedAvg."""
    model = PromptedCLIP(tiny_clip, NAMES, 4, 4, None, 0.02, seed=3)
    averages, server, downloaded, metrics = federated_rounds(FedPromptSRC(gpa_mean=mean, gpa_std=std), rounds, model)
    pdf = [float(get_gauss(mean * rounds, std * rounds)(r)) for r in range(1, rounds + 1)]  # unnormalised
    for r in range(rounds):
        mass = sum(pdf[: r + 1])
        assert metrics[r]["gpa_mass"] == pytest.approx(mass, rel=1e-9)
        for name in SHAPES:
            expected = sum(w * theta[name].double() for w, theta in zip(pdf, averages[: r + 1])) / mass
            torch.testing.assert_close(server[r][name], expected.float(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(downloaded[r][name], averages[r][name], rtol=1e-6, atol=1e-6)  # never the GPA
    assert any(not torch.allclose(server[r]["visual"], averages[r]["visual"], atol=1e-3) for r in range(rounds))

    # PromptSRC's own accumulation (L262-270, L320-335), epochs read as rounds: get_gauss, normalised over the N
    # epochs, each epoch's state weighted and added; after the last epoch the model is that sum.
    gauss = get_gauss(mean * rounds, std * rounds)  # GPA_MEAN, GPA_STD in epochs: 15 and 1 of 20
    gauss = np.array([gauss(a) for a in range(1, rounds + 1)])
    gauss = gauss / sum(gauss)
    previous_model_gpa, step_counter = None, 1
    for theta in averages:
        step_counter += 1
        weighted = {k: v.double() * gauss[step_counter - 2] for k, v in theta.items()}  # state_dict_weighting
        previous_model_gpa = weighted if previous_model_gpa is None else {k: previous_model_gpa[k] + weighted[k] for k in weighted}
    assert step_counter == rounds + 1  # "Using GPA model for final inference"
    for name in SHAPES:
        torch.testing.assert_close(server[-1][name], previous_model_gpa[name].float(), rtol=1e-5, atol=1e-6)


def test_gpa_off_is_the_last_average_and_before_any_round_the_start(tiny_clip):
    model = PromptedCLIP(tiny_clip, NAMES, 4, 4, None, 0.02, seed=3)
    averages, server, downloaded, _ = federated_rounds(FedPromptSRC(gpa="off"), 4, model)
    for r in range(4):
        for name in SHAPES:
            torch.testing.assert_close(server[r][name], averages[r][name], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(downloaded[r][name], averages[r][name], rtol=1e-6, atol=1e-6)
    start = {n: torch.full(s, 0.5) for n, s in SHAPES.items()}
    before = FedPromptSRC().global_model(model, GlobalView(dict(start), {}, start, lambda name: None))
    assert all(torch.equal(before.pieces[n], start[n]) for n in SHAPES)
