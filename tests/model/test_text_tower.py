"""The shared-prefix text tower equals the plain one (features and context gradients), and the vision
path's per-token output (`encode_image_prompted(..., return_tokens=True)`)."""

import copy
import random

import pytest
import torch

from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import encode_image_prompted, encode_text_embeddings, load_clip
from fedur.model.text_tower import encode_text_shared_prefix

WORDS = ["cat", "dog", "pickup_truck", "sweet_pepper", "aquarium_fish", "maple tree", "lawn-mower", "willow",
         "chimpanzee", "black footed albatross", "x", "Chuck will's widow", "rufous hummingbird", "a"]


def class_names(n: int, seed: int = 0) -> list[str]:
    """n names of 1 to 6 tokens (varied lengths, so the classes' own parts are padded differently)."""
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(1, 2))) for _ in range(n)]


@pytest.fixture(scope="module")
def demo_clip():
    torch.manual_seed(1)
    return load_clip("fedur-demo", None)  # the demo architecture, random init (4 vision blocks, width 32 text)


def _features_and_ctx_grad(model: PromptedCLIP, shared: bool, weights: torch.Tensor):
    model.text_prompt.ctx.requires_grad_(True)  # the model's own context (clients hand theirs), as a leaf to test with
    model.text_prompt.ctx.grad = None
    embeddings = model.text_prompt()
    tokens = model.text_prompt.tokens
    if shared:
        features = encode_text_shared_prefix(model.clip, embeddings, tokens, 1 + model.text_prompt.ctx.shape[0])
    else:
        features = encode_text_embeddings(model.clip, embeddings, tokens)
    (features.float() * weights).sum().backward()
    return features.detach().float(), model.text_prompt.ctx.grad.detach().clone()


@pytest.mark.parametrize("n_classes", [5, 200])
@pytest.mark.parametrize("n_ctx", [4, 16])
@pytest.mark.parametrize("which", ["tiny", "demo"])
def test_shared_prefix_equals_plain_path(tiny_clip, demo_clip, which, n_ctx, n_classes):
    clip = tiny_clip if which == "tiny" else demo_clip
    model = PromptedCLIP(clip, class_names(n_classes), n_ctx, 0, None, 0.5, seed=3)  # a large ctx: not near zero
    lengths = model.text_prompt.tokens.argmax(dim=-1)
    assert lengths.unique().numel() > 1  # the classes' own parts differ in length
    weights = torch.randn(n_classes, model.clip.text_projection.shape[1], generator=torch.Generator().manual_seed(0))
    plain, plain_grad = _features_and_ctx_grad(model, False, weights)
    shared, shared_grad = _features_and_ctx_grad(model, True, weights)
    assert shared.shape == plain.shape == (n_classes, model.clip.text_projection.shape[1])
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    assert plain_grad.abs().sum() > 0
    torch.testing.assert_close(shared_grad, plain_grad, rtol=1e-4, atol=1e-5 * float(plain_grad.abs().max()))


def test_shared_prefix_under_bf16_autocast(tiny_clip):
    model = PromptedCLIP(tiny_clip, class_names(50), 16, 0, None, 0.5, seed=3)
    weights = torch.randn(50, 64, generator=torch.Generator().manual_seed(0))
    reference, reference_grad = _features_and_ctx_grad(model, False, weights)  # fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, plain_grad = _features_and_ctx_grad(model, False, weights)
        shared, shared_grad = _features_and_ctx_grad(model, True, weights)
    # Both bf16 paths are as far from fp32 as bf16 makes them, and no further from each other.
    scale = float(reference.abs().max())
    plain_err = float((plain - reference).abs().max())
    assert float((shared - reference).abs().max()) <= max(2 * plain_err, 2e-2 * scale)
    assert float((shared - plain).abs().max()) <= max(2 * plain_err, 2e-2 * scale)
    grad_scale = float(reference_grad.abs().max())
    assert float((shared_grad - reference_grad).abs().max()) <= max(
        2 * float((plain_grad - reference_grad).abs().max()), 5e-2 * grad_scale
    )
    assert model.text_prompt.ctx.grad.dtype == torch.float32


def test_shared_prefix_with_sequence_first_blocks(tiny_clip):
    """open_clip's older (L, N, D) layout: the same weights, the same result."""
    model = PromptedCLIP(tiny_clip, class_names(20), 8, 0, None, 0.5, seed=3)
    seq_first = copy.deepcopy(model)
    seq_first.clip.transformer.batch_first = False
    for block in seq_first.clip.transformer.resblocks:
        block.attn.batch_first = False
    weights = torch.randn(20, 64)
    plain, plain_grad = _features_and_ctx_grad(model, False, weights)
    plain_sf, _ = _features_and_ctx_grad(seq_first, False, weights)
    shared_sf, shared_grad_sf = _features_and_ctx_grad(seq_first, True, weights)
    torch.testing.assert_close(plain_sf, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared_sf, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared_grad_sf, plain_grad, rtol=1e-4, atol=1e-5 * float(plain_grad.abs().max()))


@pytest.mark.parametrize("pool_type", ["eos", "first", "last"])
def test_shared_prefix_pool_types(tiny_clip, pool_type):
    model = PromptedCLIP(tiny_clip, class_names(12), 4, 0, None, 0.5, seed=3)
    other = copy.deepcopy(model)
    other.clip.text_pool_type = pool_type
    other.clip.text_eos_id = int(model.text_prompt.tokens.max())
    with torch.no_grad():
        embeddings, tokens = other.text_prompt(), other.text_prompt.tokens
        plain = encode_text_embeddings(other.clip, embeddings, tokens)
        shared = encode_text_shared_prefix(other.clip, embeddings, tokens, 5)
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)


def test_shared_prefix_boolean_mask(tiny_clip):
    """A boolean causal mask (True: masked) gives what the float one gives."""
    model = PromptedCLIP(tiny_clip, class_names(12), 4, 0, None, 0.5, seed=3)
    with torch.no_grad():
        embeddings, tokens = model.text_prompt(), model.text_prompt.tokens
        expected = encode_text_embeddings(model.clip, embeddings, tokens)
        other = copy.deepcopy(model)
        other.clip.attn_mask = torch.isneginf(model.clip.attn_mask)
        torch.testing.assert_close(encode_text_shared_prefix(other.clip, embeddings, tokens, 5), expected, rtol=1e-5, atol=1e-5)


def test_falls_back_where_nothing_is_shared_or_the_mask_is_not_causal(tiny_clip):
    model = PromptedCLIP(tiny_clip, class_names(6), 4, 0, None, 0.5, seed=3)
    with torch.no_grad():
        embeddings, tokens = model.text_prompt(), model.text_prompt.tokens
        plain = encode_text_embeddings(model.clip, embeddings, tokens)
        assert torch.equal(encode_text_shared_prefix(model.clip, embeddings, tokens, 0), plain)
        assert torch.equal(encode_text_shared_prefix(model.clip, embeddings, tokens, tokens.shape[1]), plain)
        bidirectional = copy.deepcopy(model)
        bidirectional.clip.attn_mask = torch.zeros_like(model.clip.attn_mask)
        expected = encode_text_embeddings(bidirectional.clip, embeddings, tokens)
        assert torch.equal(encode_text_shared_prefix(bidirectional.clip, embeddings, tokens, 5), expected)


def test_new_tokens_are_not_served_a_stale_layout(tiny_clip):
    """The packing is cached per tokens tensor: other class names (other lengths) must get their own."""
    for seed in range(3):
        model = PromptedCLIP(tiny_clip, class_names(9, seed=seed), 4, 0, None, 0.5, seed=3)
        with torch.no_grad():
            embeddings, tokens = model.text_prompt(), model.text_prompt.tokens
            for _ in range(2):
                torch.testing.assert_close(
                    encode_text_shared_prefix(model.clip, embeddings, tokens, 5),
                    encode_text_embeddings(model.clip, embeddings, tokens), rtol=1e-5, atol=1e-5,
                )
        tokens[:, -1] = 0  # an in-place change also invalidates the cached layout
        with torch.no_grad():
            torch.testing.assert_close(
                encode_text_shared_prefix(model.clip, embeddings, tokens, 5),
                encode_text_embeddings(model.clip, embeddings, tokens), rtol=1e-5, atol=1e-5,
            )


# ---- encode_image_prompted(..., return_tokens=True) ----


@pytest.mark.parametrize("with_prompts", [False, True])
def test_image_tokens_shape_and_cls_is_pooled(tiny_clip, with_prompts):
    visual = tiny_clip.model.visual
    prompts = torch.randn(3, 5, 64) if with_prompts else None  # all 3 blocks prompted
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = encode_image_prompted(visual, images, prompts, return_tokens=True)
        pooled = encode_image_prompted(visual, images, prompts)
    assert tokens.shape == (2, 1 + (32 // 8) ** 2, 64)  # CLS + 16 patches, projected; prompt outputs dropped
    assert visual.pool_type == "tok"
    torch.testing.assert_close(tokens[:, 0], pooled, rtol=0, atol=1e-6)
    assert not torch.allclose(tokens.norm(dim=-1), torch.ones(2, 17))  # not normalised


def test_image_tokens_are_open_clips_projected_tokens(demo_clip):
    """Without prompts, the patch tokens are open_clip's output tokens (after ln_post) times proj."""
    visual = copy.deepcopy(demo_clip.model.visual)
    visual.output_tokens = True
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        pooled, patch_tokens = visual(images)
        tokens = encode_image_prompted(visual, images, None, return_tokens=True)
    torch.testing.assert_close(tokens[:, 1:], patch_tokens @ visual.proj, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tokens[:, 0], pooled, rtol=1e-5, atol=1e-6)


def test_image_tokens_carry_gradients_to_the_prompts(tiny_clip):
    model = PromptedCLIP(tiny_clip, ["a", "b"], n_ctx=2, visual_tokens=4, visual_depth=None, init_std=0.02, seed=1)
    visual = torch.randn(model.visual_prompt_shape).mul(0.02).requires_grad_()
    tokens = encode_image_prompted(model.clip.visual, torch.randn(2, 3, 32, 32), visual, return_tokens=True)
    tokens[:, 1:].pow(2).sum().backward()
    assert all(visual.grad[i].abs().sum() > 0 for i in range(visual.shape[0]))
