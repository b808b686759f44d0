"""Every open_clip backbone family, on tiny random-init stand-ins (tests/model/families.py): with empty prompts the
re-entered towers are the model's own forward bit for bit; a prompt fills the context's positions of the family's
tokenizer; SigLIP's logit bias is in the logits; every method runs on every family that takes what it needs, and the
others are refused in one line naming the methods that run."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from fedur import plugins
from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.methods.backbones import check_backbone, method_needs, runs_on
from fedur.methods.pieces import initial_values
from fedur.model import towers
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import backbone_features, encode_image_prompted, encode_text_embeddings, load_clip
from tests.model.families import FAMILIES, config_file

HAS_HF = importlib.util.find_spec("transformers") is not None
NO_HF = pytest.mark.skipif(not HAS_HF, reason="SigLIP's tokenizer is a Hugging Face one: pip install transformers (fedur[hf])")
BUILT = [family for family in FAMILIES if HAS_HF or family != "siglip"]
FAMILY = [pytest.param(family, marks=NO_HF if family == "siglip" else ()) for family in FAMILIES]

# what each family's towers take (fedur/model/towers.py FEATURES)
TAKES = {
    "vit": {"text prompts", "deep text prompts", "visual prompts", "patch tokens"},
    "resnet": {"text prompts", "deep text prompts", "patch tokens"},
    "siglip": {"text prompts", "deep text prompts", "visual prompts"},
    "eva02": {"text prompts", "deep text prompts", "visual prompts", "patch tokens"},
    "pe": {"text prompts", "deep text prompts", "visual prompts"},
    "convnext": {"text prompts", "deep text prompts"},
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """{family: (model name, FrozenCLIP)}, each seeded; CONFIGS[family]: its model.config_file."""
    folder = tmp_path_factory.mktemp("families")
    built = {}
    for family in BUILT:
        path = CONFIGS[family] = config_file(family, folder)
        torch.manual_seed(0)
        built[family] = (path.stem, load_clip(path.stem, None, str(path)))
    return built


CONFIGS = {}


def images(clip, n=2, seed=0):
    return torch.randn(n, 3, clip.image_size, clip.image_size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILY)
def test_empty_prompts_are_the_models_own_forward(families, family):
    name, clip = families[family]
    model, x = clip.model, images(clip)
    assert towers.features(model) == TAKES[family] and backbone_features(name)[1] == TAKES[family]
    own = model.encode_image(x)
    assert torch.equal(encode_image_prompted(model.visual, x, None), own)
    if "visual prompts" in TAKES[family]:
        width, depth = towers.vision_width(model.visual), len(towers.vision_blocks(model.visual))
        assert torch.equal(encode_image_prompted(model.visual, x, torch.zeros(depth - 1, 0, width)), own)
        prompted = encode_image_prompted(model.visual, x, torch.randn(depth - 1, 3, width))
        assert prompted.shape == own.shape and not torch.equal(prompted, own)
    if "patch tokens" in TAKES[family]:  # token 0 is the pooled feature
        tokens = encode_image_prompted(model.visual, x, None, return_tokens=True)
        assert tokens.shape[1] > 1 and torch.equal(tokens[:, 0], own)
    else:
        with pytest.raises(ConfigError, match="patch features need"):
            encode_image_prompted(model.visual, x, None, return_tokens=True)
    ids = clip.tokenizer(["a photo of a circle.", "x x x square"])
    text = towers.text_tower(model)
    assert torch.equal(encode_text_embeddings(model, text.token_embedding(ids), ids), model.encode_text(ids))


@pytest.mark.parametrize("family", FAMILY)
def test_the_placeholder_context_gives_the_models_own_class_features(families, family):
    """A context of the word embeddings of 'X' gives CLIP's own features of "X X ... X <class>." : the context sits at
    the family's positions (after CLIP's start token; first for SigLIP's tokenizer, which has none), the prompts are
    whole where the text tower is not causal, and no shared prefix is used there."""
    name, clip = families[family]
    classes = ["circle", "square", "wave"]
    model = PromptedCLIP(clip, classes, 3, 0, None, 0.02, seed=1)
    placeholder = model.token_embedding(model.text_prompt.tokens[0, model.ctx_start:model.ctx_start + 3])
    ids = clip.tokenizer([f"X X X {c}." for c in classes])
    own = torch.nn.functional.normalize(clip.model.encode_text(ids), dim=-1)
    torch.testing.assert_close(model.text_features(placeholder), own, atol=2e-6, rtol=0)
    causal = family != "siglip"
    assert model.causal_text == causal and model.ctx_start == (1 if causal else 0)
    assert (model.prefix_reason is None) == causal
    assert model.text_prompt.tokens.shape[1] == (int(ids.argmax(dim=-1).max()) + 1 if causal else 16)  # SigLIP: whole


@NO_HF
def test_siglip_logits_keep_the_logit_bias(families):
    _, clip = families["siglip"]
    model = PromptedCLIP(clip, ["circle", "square"], 2, 0, None, 0.02, seed=1)
    features, text = model.image_features(images(clip)), model.text_features()
    cos = features @ text.t()
    assert float(clip.model.logit_bias) == -10.0
    torch.testing.assert_close(model.logits(features, text), clip.model.logit_scale.exp() * cos - 10.0)


METHODS = [cls for cls in plugins.builtin("method")]


@pytest.mark.slow  # 19 methods on 6 families: 10 s
@pytest.mark.parametrize("family", FAMILY)
def test_every_method_runs_where_its_needs_are_met_and_is_refused_elsewhere(families, family):
    """Each method a step's forward and backward on the family (its logits of a batch against its own pieces), or the
    settings' refusal naming the methods that do run: one line."""
    name, clip = families[family]
    model = PromptedCLIP(clip, ["circle", "square", "a red wave"], 2, 2, None, 0.02, seed=1)
    model.zero_shot_text = model.text_features().detach()
    ran, refused = [], []
    for cls in METHODS:
        method = cls()
        if not method_needs(method, 2) <= TAKES[family]:
            with pytest.raises(ConfigError) as err:
                check_backbone(method, name, 2)
            line = str(err.value)
            assert "\n" not in line and f"{cls.__name__} cannot run on {name}" in line
            assert f"Methods that run on {name}: {', '.join(runs_on(frozenset(TAKES[family]), 2))}" in line
            refused.append(cls.__name__)
            continue
        check_backbone(method, name, 2)
        pieces = {k: v.clone().requires_grad_(True) for k, v in initial_values(method.pieces(), model, 1).items()}
        client = ClientState(0, np.arange(3), np.arange(2), {k: v.detach() for k, v in pieces.items()})
        model.train(method.trains)
        logits = method.logits(model, images(clip, 3), pieces, method.text_side(model, pieces), client)
        model.eval()
        assert logits.shape == (3, 3) and torch.isfinite(logits).all(), cls.__name__
        trained = [v for v in pieces.values() if v.numel()]
        if method.trains and trained:
            logits.logsumexp(dim=1).sum().backward()
            assert any(v.grad is not None and bool(v.grad.abs().sum() > 0) for v in trained), cls.__name__
        ran.append(cls.__name__)
    assert "PromptFL" in ran and "ZeroShot" in ran
    takes_visual = "visual prompts" in TAKES[family]
    assert ("FedUR" in ran) == takes_visual and ("FedMaPLe" in ran) == takes_visual
    assert ("FedOTP" in ran) == ("patch tokens" in TAKES[family])


def test_resnets_refuse_the_visual_prompt_methods_in_one_line(families):
    name, _ = families["resnet"]
    from fedur.methods import FedUR

    with pytest.raises(ConfigError, match=r"FedUR cannot run on fedur-tiny-resnet: it needs visual prompts, .*open_clip "
                                          r"ModifiedResNet.*Methods that run on fedur-tiny-resnet: .*FedOTP.*PromptFL, "
                                          r"PromptProx.*; or set model.visual_tokens 0"):
        check_backbone(FedUR(), name, 5)
    check_backbone(FedUR(), name, 0)  # no visual prompt: its text prompts only


@NO_HF
def test_a_hub_tokenizer_offline_says_what_to_do(tmp_path, monkeypatch):
    from fedur.model.clip import ModelUnavailableError, check_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match=r"ViT-B-16-SigLIP's tokenizer comes from the Hugging Face Hub "
                                                    r"\(timm/ViT-B-16-SigLIP\), which is unreachable .*save_pretrained"):
        check_model("ViT-B-16-SigLIP", None, None, str(tmp_path))


TINY_RUN = ["--config", "configs/tiny.yaml", "--federation.rounds", "1", "--federation.local_epochs", "1",
            "--federation.num_clients", "2", "--run.progress", "false"]


@pytest.mark.slow  # the command's parser and settling: 3 s (the refusal itself: the test above)
def test_the_command_refuses_a_method_its_backbone_cannot_take_before_any_compute(families, tmp_path, run_main):
    name, _ = families["resnet"]
    result = run_main(*TINY_RUN, "--model.name", name, "--model.config_file", str(CONFIGS["resnet"]),
                      "--run.output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"FedUR cannot run on {name}: it needs visual prompts" in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow  # whole runs
@pytest.mark.parametrize("family, method", [pytest.param("siglip", "FedUR", marks=NO_HF), ("resnet", "PromptFL"),
                                            ("pe", "FedMaPLe"), ("eva02", "FedOTP")])
def test_a_run_on_each_family(families, tmp_path, run_main, family, method):
    name, _ = families[family]
    run_dir = tmp_path / "run"
    result = run_main(*TINY_RUN, "--model.name", name, "--model.config_file", str(CONFIGS[family]), "--method", method,
                      "--run.output_dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["method"] == method.lower() and 0 <= summary["final_mean_accuracy"] <= 100


@pytest.mark.parametrize("family", [f for f in FAMILY if "patch tokens" in TAKES[f.values[0]]])
def test_the_token_count_read_off_a_tower_is_what_its_tokens_pass_gives(families, family):
    """The frozen-feature cache sizes its token files from towers.image_token_count before any image is run: it must
    be the second dimension of the tokens every family that takes patch tokens returns (and a refusal elsewhere)."""
    name, clip = families[family]
    with torch.no_grad():
        tokens = encode_image_prompted(clip.model.visual, images(clip), None, return_tokens=True)
    model = PromptedCLIP(clip, ["a", "b"], 2, 2, None, 0.02, seed=1)
    assert tokens.shape[1] == towers.image_token_count(clip.model.visual) == model.image_token_count


@pytest.mark.parametrize("family", [f for f in FAMILY if "patch tokens" not in TAKES[f.values[0]]])
def test_a_tower_without_patch_tokens_has_no_token_count(families, family):
    with pytest.raises(ConfigError):
        towers.image_token_count(families[family][1].model.visual)
