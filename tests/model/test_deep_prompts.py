"""Deep prompts in both towers against transcriptions of the original towers (muzairkhattak/multimodal-prompt-learning
@ 69bce21, clip/model.py: `ResidualAttentionBlock_MaPLe` L259-331, `VisionTransformer_MaPLe` L425-476, the text
encoder of trainers/maple.py L43-66; PromptSRC's IVLP blocks are the same replacements): the text tower's context
positions replaced before each deeper block, with the shared-prefix tower, the plain one and several contexts at
once; the vision tower's first prompt through ln_pre and the last one's outputs kept to the end."""

import pytest
import torch
import torch.nn.functional as F

from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import encode_image_prompted

NAMES = ["cat", "dog", "a red bird", "ship"]


def model_of(tiny_clip, n_ctx=2, suffix=""):
    return PromptedCLIP(tiny_clip, NAMES, n_ctx, 0, None, 0.02, seed=3, ctx_suffix=suffix)


def reference_text(model: PromptedCLIP, ctx, deep):
    """MaPLe's text encoder: prompts + positional embedding, then before block i >= 1 positions 1..n_ctx replaced by
    compound prompt i - 1 (no positional embedding); ln_final, the EOT row, the projection; normalised."""
    clip = model.clip
    prompts = model.text_prompt(ctx)  # (C, L, width)
    tokens = model.text_prompt.tokens
    length, n_ctx = prompts.shape[1], ctx.shape[0]
    x = prompts + clip.positional_embedding[:length]
    mask = clip.attn_mask[:length, :length]
    for i, block in enumerate(clip.transformer.resblocks):
        if 1 <= i <= len(deep):
            x = torch.cat([x[:, :1], deep[i - 1].unsqueeze(0).expand(len(x), -1, -1), x[:, 1 + n_ctx:]], dim=1)
        x = block(x, attn_mask=mask)
    x = clip.ln_final(x)[torch.arange(len(x)), tokens.argmax(dim=-1)] @ clip.text_projection
    return F.normalize(x, dim=-1)


@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("suffix", ["", "of a"])
def test_deep_text_prompts_are_the_originals_with_either_text_tower(tiny_clip, shared_prefix, suffix):
    torch.manual_seed(0)
    model = model_of(tiny_clip, suffix=suffix)
    model.shared_prefix_text = shared_prefix
    ctx = (torch.randn(2, 64) * 0.02).requires_grad_()
    deep = (torch.randn(1, 2, 64) * 0.5).requires_grad_()  # the tiny text tower has 2 blocks: one deeper prompt
    ours = model.text_features(ctx, deep=deep)
    theirs = reference_text(model, ctx, deep)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours, model.text_features(ctx), atol=1e-3)  # the deep prompt changes the features
    g_ours = torch.autograd.grad(ours.square().sum(), [ctx, deep])
    g_theirs = torch.autograd.grad(theirs.square().sum(), [ctx, deep])
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_several_contexts_with_their_deep_prompts_in_one_pass(tiny_clip, shared_prefix):
    torch.manual_seed(1)
    model = model_of(tiny_clip)
    model.shared_prefix_text = shared_prefix
    ctx, deep = torch.randn(3, 2, 64) * 0.02, torch.randn(3, 1, 2, 64) * 0.5
    together = model.text_features(ctx, deep=deep)  # (G, C, D)
    for g in range(3):
        torch.testing.assert_close(together[g], model.text_features(ctx[g], deep=deep[g]), rtol=1e-5, atol=1e-6)


def test_the_fixed_words_after_the_context_are_in_every_class_prompt(tiny_clip):
    model = model_of(tiny_clip, suffix="of a")
    expected = tiny_clip.tokenizer([f"X X of a {n}." for n in NAMES])[:, : model.text_prompt.tokens.shape[1]]
    assert torch.equal(model.text_prompt.tokens, expected)
    other = model.for_classes(["truck", "horse"], "a photo of a {}.")
    expected = tiny_clip.tokenizer(["X X of a truck.", "X X of a horse."])[:, :other.text_prompt.tokens.shape[1]]
    assert torch.equal(other.text_prompt.tokens, expected)
    assert other.classnames == ["truck", "horse"] and model.classnames == NAMES


def test_deep_text_prompts_that_do_not_fit_are_refused(tiny_clip):
    from fedur.errors import ConfigError

    model = model_of(tiny_clip)
    with pytest.raises(ConfigError, match="prompted blocks"):
        model.text_features(torch.zeros(2, 64), deep=torch.zeros(2, 2, 64))  # 2 blocks: one deeper prompt at most


def reference_vision(visual, images, first, deeper):
    """MaPLe's / IVLP's vision tower: [CLS, patches] + positional embedding, the first prompt appended, ln_pre; before
    block i >= 1 the last n tokens replaced by prompt i; the prompts' outputs kept to the end; CLS through ln_post and
    the projection."""
    x = visual.conv1(images).flatten(2).transpose(1, 2)
    x = torch.cat([visual.class_embedding.expand(len(x), 1, -1), x], dim=1) + visual.positional_embedding
    n = first.shape[0]
    x = visual.ln_pre(torch.cat([x, first.expand(len(x), -1, -1)], dim=1))
    for i, block in enumerate(visual.transformer.resblocks):
        if 1 <= i <= len(deeper):
            x = torch.cat([x[:, :-n], deeper[i - 1].expand(len(x), -1, -1)], dim=1)
        x = block(x)
    return visual.ln_post(x[:, 0]) @ visual.proj


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_persisting_visual_prompts_are_the_originals_vision_tower(tiny_clip, depth):
    torch.manual_seed(2)
    visual = tiny_clip.model.visual
    images = torch.randn(3, 3, 32, 32)
    prompts = torch.randn(depth, 2, 64)
    theirs = reference_vision(visual, images, prompts[0], prompts[1:])
    ours_in = torch.cat([visual.ln_pre(prompts[:1]), prompts[1:]])  # the first prompt through ln_pre, as theirs
    torch.testing.assert_close(encode_image_prompted(visual, images, ours_in, persist=True), theirs, rtol=1e-5, atol=1e-5)
    if depth < 3:  # dropped after each block (VPT-deep) is another tower when later blocks follow
        assert not torch.allclose(encode_image_prompted(visual, images, ours_in), theirs, atol=1e-4)
    per_image = ours_in.unsqueeze(0).expand(3, -1, -1, -1)
    torch.testing.assert_close(encode_image_prompted(visual, images, per_image, persist=True), theirs, rtol=1e-5, atol=1e-5)
