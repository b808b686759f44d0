"""fedur re-enters open_clip's towers: with empty prompts they must give exactly what open_clip gives."""

import json

import pytest
import torch
import torch.nn.functional as F

from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import ModelUnavailableError, check_model, encode_image_prompted, encode_text_embeddings

CLASSES = ["cat", "dog", "pickup_truck"]


def test_vision_path_without_prompts_is_open_clip(tiny_clip):
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(encode_image_prompted(tiny_clip.model.visual, images, None), tiny_clip.model.encode_image(images))


def test_text_path_on_embeddings_is_open_clip(tiny_clip):
    model = tiny_clip.model
    tokens = tiny_clip.tokenizer(["a photo of a cat.", "a dog"])
    with torch.no_grad():
        full = encode_text_embeddings(model, model.token_embedding(tokens), tokens)
        assert torch.equal(full, model.encode_text(tokens))
        cut = int(tokens.argmax(dim=-1).max()) + 1  # causal mask: truncating after the last EOT changes nothing
        short = encode_text_embeddings(model, model.token_embedding(tokens[:, :cut]), tokens[:, :cut])
        assert torch.allclose(short, full, atol=1e-5)


def test_text_prompt_layout(tiny_clip):
    model = PromptedCLIP(tiny_clip, CLASSES, n_ctx=4, visual_tokens=0, visual_depth=None, init_std=0.02, seed=1)
    tokens = model.text_prompt.tokens
    expected = tiny_clip.tokenizer(["X X X X pickup truck."])[0, : tokens.shape[1]]
    assert torch.equal(tokens[2], expected)  # [SOS] X X X X pickup truck . [EOS], '_' read as a space
    prompt = model.text_prompt()
    assert prompt.shape == (3, tokens.shape[1], 64)
    assert torch.equal(prompt[:, 1:5], model.text_prompt.ctx.detach().expand(3, -1, -1))
    assert model.text_prompt.ctx.shape == (4, 64)
    assert "prefix" not in model.state_dict() and "text_prompt.ctx" in model.state_dict()


def test_deep_visual_prompts_reach_every_prompted_block(tiny_clip):
    from fedur.methods import FedUR
    from fedur.methods.pieces import initial_values

    model = PromptedCLIP(tiny_clip, CLASSES, n_ctx=4, visual_tokens=5, visual_depth=None, init_std=0.02, seed=1)
    pieces = {n: t.requires_grad_() for n, t in initial_values(FedUR().pieces(), model, 1).items()}
    assert pieces["visual"].shape == model.visual_prompt_shape == (2, 5, 64)  # 3 blocks: all but the last are prompted
    images = torch.randn(2, 3, 32, 32)
    logits = model.logits(model.image_features(images, visual=pieces["visual"]), model.text_features(pieces["text_ctx"]))
    assert logits.shape == (2, 3)
    logits.sum().backward()
    assert all(pieces["visual"].grad[i].abs().sum() > 0 for i in range(2))
    assert pieces["text_ctx"].grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny_clip.model.parameters())


def test_prompts_are_replaced_block_by_block(tiny_clip):
    """Block i sees only prompts[i]: recompute by hand with explicit per-block appends and drops."""
    visual = tiny_clip.model.visual
    prompts = torch.randn(2, 5, 64)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        x = visual._embeds(images)
        for i, block in enumerate(visual.transformer.resblocks):
            if i < 2:
                x = block(torch.cat([x, prompts[i].expand(2, 5, 64)], dim=1))[:, :-5]
            else:
                x = block(x)
        expected = visual._pool(x)[0] @ visual.proj
        assert torch.allclose(encode_image_prompted(visual, images, prompts), expected, atol=1e-6)


def test_each_image_its_own_prompts_and_classes(tiny_clip):
    """Several clients in one batch: per-image visual prompts and per-image class features give what each
    client's own pass gives (up to rounding), and the gradient of one client's loss reaches only its prompts."""
    model = PromptedCLIP(tiny_clip, CLASSES, n_ctx=4, visual_tokens=5, visual_depth=None, init_std=0.02, seed=1)
    visual = [torch.randn(2, 5, 64, requires_grad=True) for _ in range(2)]
    ctx = [torch.randn(4, 64, requires_grad=True) for _ in range(2)]
    images, owners = torch.randn(5, 3, 32, 32), torch.tensor([0, 0, 0, 1, 1])
    text = torch.stack([model.text_features(c) for c in ctx])  # (2, C, D)
    together = model.logits(model.image_features(images, visual=torch.stack(visual)[owners]), text, owners)
    with torch.no_grad():
        for k, rows in ((0, slice(0, 3)), (1, slice(3, 5))):
            alone = model.logits(model.image_features(images[rows], visual=visual[k]), model.text_features(ctx[k]))
            assert torch.allclose(together[rows], alone, atol=1e-5)
    together[3:].sum().backward()  # client 1's images only
    assert visual[0].grad is None or visual[0].grad.abs().sum() == 0
    assert ctx[0].grad is None or ctx[0].grad.abs().sum() == 0
    assert visual[1].grad.abs().sum() > 0 and ctx[1].grad.abs().sum() > 0


def test_logits_are_scaled_cosines(tiny_clip):
    model = PromptedCLIP(tiny_clip, CLASSES, n_ctx=2, visual_tokens=0, visual_depth=None, init_std=0.02, seed=1)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        image = F.normalize(tiny_clip.model.encode_image(images), dim=-1)
        logits = model(images)
        cos = logits / tiny_clip.model.logit_scale.exp()
        assert torch.allclose(cos, image @ model.text_features().t(), atol=1e-5)
        assert cos.abs().max() <= 1 + 1e-5


def test_same_seed_same_prompts(tiny_clip):
    from fedur.methods import FedUR
    from fedur.methods.pieces import initial_values

    model = PromptedCLIP(tiny_clip, CLASSES, 4, 5, None, 0.02, seed=1)
    a, b, c = (initial_values(FedUR().pieces(), model, seed) for seed in (1, 1, 2))
    assert torch.equal(a["visual"], b["visual"]) and torch.equal(a["text_ctx"], b["text_ctx"])
    assert not torch.equal(a["visual"], c["visual"])
    assert abs(float(a["visual"].std()) - 0.02) < 0.005
    assert torch.equal(a["text_ctx"], model.text_prompt.ctx)  # the context text_features() uses without one


def test_model_errors_say_what_to_do(tmp_path):
    with pytest.raises(ModelUnavailableError, match="Unknown open_clip model"):
        check_model("ViT-Nope", None, None, None)
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ModelUnavailableError, match="not valid JSON"):
        check_model("broken", None, str(bad), None)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"embed_dim": 8}))
    with pytest.raises(ModelUnavailableError, match="vision_cfg"):
        check_model("partial", None, str(partial), None)
    with pytest.raises(ModelUnavailableError, match="does not exist"):
        check_model("ViT-B-32", str(tmp_path / "weights.pt"), None, None)
    with pytest.raises(ModelUnavailableError, match="Tags of ViT-B-32"):
        check_model("ViT-B-32", "no_such_tag", None, None)


def test_offline_hub_weights_fail_at_once_with_the_local_keys(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("fedur.model.clip._in_hf_cache", lambda hub, cache_dir: False)
    with pytest.raises(ModelUnavailableError) as err:
        check_model("ViT-B-32", "openai", None, None)
    message = str(err.value)
    assert "model.pretrained=/path/to/that/file" in message and "ViT-B-32-quickgelu" in message
    assert "huggingface.co/timm/vit_base_patch32_clip_224.openai" in message
    assert "model.config_file" in message


def test_local_config_file_registers_a_model(tmp_path, tiny_clip):
    from fedur.model.clip import PACKAGE_MODEL_CONFIGS, load_clip

    cfg = json.loads((PACKAGE_MODEL_CONFIGS / "fedur-tiny.json").read_text())
    cfg["vision_cfg"]["layers"] = 2
    path = tmp_path / "my-tiny.json"
    path.write_text(json.dumps(cfg))
    model = load_clip("my-tiny", None, str(path))
    assert len(model.model.visual.transformer.resblocks) == 2
    assert not any(p.requires_grad for p in model.model.parameters())


def test_openai_tags_get_quick_gelu():
    from fedur.model.clip import needs_quick_gelu

    assert needs_quick_gelu("ViT-B-32", "openai") and needs_quick_gelu("ViT-B-16", "openai")
    assert not needs_quick_gelu("ViT-B-32", "laion2b_s34b_b79k")
    assert not needs_quick_gelu("ViT-B-32", None) and not needs_quick_gelu("ViT-B-32", "/weights.pt")


def test_logits_stay_fp32_under_bf16_autocast(tiny_clip):
    model = PromptedCLIP(tiny_clip, CLASSES, n_ctx=2, visual_tokens=0, visual_depth=None, init_std=0.02, seed=1)
    image, text = F.normalize(torch.randn(4, 64), dim=-1), F.normalize(torch.randn(3, 64), dim=-1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model.logits(image, text)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, model.logits(image, text))
