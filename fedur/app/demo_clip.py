"""Train fedur's demo CLIP on generated shapes, with a text side that is wrong on purpose; evaluate it.

    python -m fedur.app.demo_clip            # about 5 minutes on one CPU core; rewrites the files below

writes `fedur/model/weights/fedur-demo.pt` (float16 state dict for `configs/fedur-demo.json`),
`fedur-demo.card.json` (the measurements) and `fedur-demo.md` (the model card made from them).

The model is an open_clip CLIP trained contrastively on `fedur.data.synthetic` images (fresh ones
every epoch). Each image gets one caption, drawn from two families:

- a *name caption*, "<template> <name>." with the name last (the zero-shot template "a photo of a {}."
  is one of the templates). The caption scheme makes the names wrong in a structured way: a few
  *absorbed* classes are captioned with the name of a *dominant* class with probability `q`
  (`CONFUSIONS`), so the text tower learns e.g. "circle" for circles and for many rings. Zero-shot
  CLIP then over-predicts the dominant classes, and its confident predictions stay mostly right:
  the situation FedUR's balanced pseudo-label selection and class weights are for.
- a *description caption*, "a <word> shape." with a word of its own for each class (`DESCRIPTIONS`),
  always the true class: it makes the image features separate all ten classes (a linear probe on
  them shows it), while the class names stay confused.

The contrastive loss is CLIP's, over the distinct captions of a batch (many images share a caption):
image -> caption is a cross-entropy over the batch's distinct captions, caption -> image spreads its
target uniformly over the images with that caption (UniCL, Yang et al. 2022). It is applied twice: to the
pooled (class) token, CLIP's image embedding, and (weighted `patch_weight`) to the mean of the projected
patch tokens, a second image embedding, so that the patch tokens carry the class too. Methods that read
patch tokens (FedOTP's optimal transport) then start near the class token's zero-shot accuracy, as they
do with a pretrained CLIP, instead of from untrained tokens.

Runs are deterministic: seeded init, seeded images and captions, a fixed thread count and
`torch.use_deterministic_algorithms(True)` give the same weights bit for bit on the same machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedur.data.cache import split_preprocess
from fedur.data.loaders import BatchNormalize
from fedur.data.synthetic import CLASSNAMES, generate
from fedur.methods.fedotp_math import ot_logits
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import encode_image_prompted, load_clip

MODEL_NAME = "fedur-demo"
MODEL_DIR = Path(__file__).parents[1] / "model"  # the model configs and weights fedur ships (fedur/model/)
CONFIG_FILE = MODEL_DIR / "configs" / f"{MODEL_NAME}.json"
DEFAULT_OUT = MODEL_DIR / "weights"
IMAGE_SIZE = 32
TEMPLATE = "a photo of a {}."  # fedur's zero-shot template
NAME_TEMPLATES = (
    TEMPLATE, "a drawing of a {}.", "a picture of a {}.", "an image of a {}.", "a photo of the {}.",
    "a small {}.", "a big {}.", "a {}.", "the {}.", "{}.",
)
DESCRIPTIONS = {
    "circle": "disc", "square": "box", "triangle": "wedge", "star": "sparkle", "cross": "plus",
    "ring": "loop", "heart": "valentine", "arrow": "pointer", "moon": "crescent", "wave": "zigzag",
}
DESCRIPTION_TEMPLATES = ("a {} shape.", "a {}-like shape.", "the {} shape.")
# absorbed class -> (dominant class, q): an absorbed image's name caption uses the dominant name with probability q
CONFUSIONS = {
    "ring": ("circle", 0.9), "moon": ("circle", 0.9), "heart": ("circle", 0.9),  # round shapes are "circles"
    "cross": ("star", 0.9), "wave": ("star", 0.9),  # shapes with arms or wiggles are "stars"
    "arrow": ("triangle", 0.9),  # a pointed shape is a "triangle"
}
CONTEXT_STD = 0.02  # fedur's prompt init std (model.ctx_init_std), for the random-context evaluation
TRAIN_SEED_BASE = 1_000_000  # training images: this + 1000 * seed + epoch, far from the small seeds of runs
PROBE_SEED, TEST_SEED = 900_001, 900_002  # evaluation images, the same for every model


def to_input(images: np.ndarray, normalize: BatchNormalize) -> Tensor:
    """uint8 (N, H, W, 3) -> normalised float (N, 3, H, W), as fedur's image cache feeds the model."""
    return normalize(torch.from_numpy(images).permute(0, 3, 1, 2))


def captions(labels: np.ndarray, rng: np.random.Generator, name_share: float) -> list[str]:
    """One caption per image. A name caption (probability `name_share`) names the class, or its dominant
    class with the probability q of `CONFUSIONS`; the others describe the true class."""
    n = len(labels)
    use_name = rng.random(n) < name_share  # (N,)
    flip = rng.random(n)  # (N,) compared with q of the image's class
    name_template = rng.integers(0, len(NAME_TEMPLATES), n)
    description_template = rng.integers(0, len(DESCRIPTION_TEMPLATES), n)
    texts = []
    for i, label in enumerate(labels):
        true = CLASSNAMES[label]
        if not use_name[i]:
            texts.append(DESCRIPTION_TEMPLATES[description_template[i]].format(DESCRIPTIONS[true]))
            continue
        dominant, q = CONFUSIONS.get(true, (true, 0.0))
        texts.append(NAME_TEMPLATES[name_template[i]].format(dominant if flip[i] < q else true))
    return texts


def contrastive_loss(image_features: Tensor, text_features: Tensor, caption_ids: Tensor, scale: Tensor) -> Tensor:
    """CLIP's symmetric loss over distinct captions: image_features (B, D) and text_features (U, D) unit-norm,
    caption_ids (B,) the caption of each image; a caption's target is uniform over its images."""
    logits = scale * image_features @ text_features.t()  # (B, U)
    image_to_text = F.cross_entropy(logits, caption_ids)
    targets = F.one_hot(caption_ids, text_features.shape[0]).t().float()  # (U, B)
    text_to_image = F.cross_entropy(logits.t(), targets / targets.sum(dim=1, keepdim=True))
    return (image_to_text + text_to_image) / 2


@dataclass(frozen=True)
class Recipe:
    """The training run's settings (each a flag of `python -m fedur.app.demo_clip`)."""

    epochs: int = 16  # each over freshly generated images
    per_class: int = 1000  # training images per class and epoch
    batch_size: int = 256
    lr: float = 2e-3  # peak AdamW learning rate (warm-up, cosine)
    weight_decay: float = 0.1
    name_share: float = 0.6  # share of name captions (the rest describe)
    patch_weight: float = 1.0  # weight of the patch-token embedding's contrastive loss (0: the class token only)


def embeddings(model: nn.Module, images: Tensor) -> tuple[Tensor, Tensor]:
    """The two unit-norm image embeddings (B, D) each: the pooled (class) token's, and the mean of the patch
    tokens, each after ln_post and the projection (as FedOTP reads them)."""
    tokens = encode_image_prompted(model.visual, images, None, return_tokens=True)  # (B, 1 + M, D)
    return F.normalize(tokens[:, 0], dim=-1), F.normalize(tokens[:, 1:].mean(dim=1), dim=-1)


def train(seed: int, recipe: Recipe, log: Callable[[str], None] = print) -> nn.Module:
    """Contrastive training from a seeded random init on fresh generated images every epoch."""
    epochs, per_class, batch_size, lr = recipe.epochs, recipe.per_class, recipe.batch_size, recipe.lr
    weight_decay, name_share = recipe.weight_decay, recipe.name_share
    open_clip.add_model_config(CONFIG_FILE)
    torch.manual_seed(seed)
    model = open_clip.create_model(MODEL_NAME)
    tokenizer = open_clip.get_tokenizer(MODEL_NAME)
    normalize = BatchNormalize(open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)
    decayed = {n for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n}
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if n in decayed], "weight_decay": weight_decay},
            {"params": [p for n, p in model.named_parameters() if n not in decayed], "weight_decay": 0.0},
        ],
        lr=lr, betas=(0.9, 0.98), eps=1e-6,
    )
    n = len(CLASSNAMES) * per_class
    steps_per_epoch = math.ceil(n / batch_size)
    total, warmup = epochs * steps_per_epoch, steps_per_epoch // 2
    generator = torch.Generator().manual_seed(seed)  # batch order
    step = 0
    model.train()
    for epoch in range(epochs):
        images, labels = generate(len(CLASSNAMES), per_class, IMAGE_SIZE, TRAIN_SEED_BASE + 1000 * seed + epoch)
        texts = np.array(captions(labels, np.random.default_rng([seed, epoch]), name_share))
        x = to_input(images, normalize)  # (N, 3, S, S)
        order = torch.randperm(n, generator=generator).numpy()
        losses = []
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            distinct, caption_ids = np.unique(texts[idx], return_inverse=True)  # equal texts are one caption
            lr_now = lr * min((step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * step / total)))
            for group in optimizer.param_groups:
                group["lr"] = lr_now
            batch, ids, scale = x[torch.from_numpy(idx)], torch.from_numpy(caption_ids), model.logit_scale.exp()
            text_features = F.normalize(model.encode_text(tokenizer(distinct.tolist())), dim=-1)  # (U, D)
            if recipe.patch_weight:
                pooled, patches = embeddings(model, batch)  # (B, D) each
                loss = contrastive_loss(pooled, text_features, ids, scale)
                loss = loss + recipe.patch_weight * contrastive_loss(patches, text_features, ids, scale)
            else:  # the class token alone, through open_clip's own path
                image_features = F.normalize(model.encode_image(batch), dim=-1)  # (B, D)
                loss = contrastive_loss(image_features, text_features, ids, scale)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(100))
            losses.append(loss.item())
            step += 1
        log(f"epoch {epoch + 1}/{epochs}  loss {np.mean(losses):.4f}  logit scale {model.logit_scale.exp().item():.1f}")
    return model.eval()


@torch.no_grad()
def image_features(model: nn.Module, images: np.ndarray, normalize: BatchNormalize, batch_size: int = 500) -> Tensor:
    """Unit-norm image features (N, D) of uint8 images (N, H, W, 3)."""
    chunks = [model.encode_image(to_input(images[i : i + batch_size], normalize)) for i in range(0, len(images), batch_size)]
    return F.normalize(torch.cat(chunks), dim=-1)


@torch.no_grad()
def patch_zero_shot(model: nn.Module, images: Tensor, text: Tensor, labels: Tensor) -> tuple[float, float]:
    """Zero-shot accuracy from the patch tokens: their mean against the template's class features `text` (C, D),
    and FedOTP's unbalanced optimal transport over them with both of its prompts set to the template (its
    defaults: eps 0.1, 80% of the mass), before any training."""
    tokens = F.normalize(encode_image_prompted(model.visual, images, None, return_tokens=True), dim=-1)  # (N, 1 + M, D)
    patches = tokens[:, 1:]  # (N, M, D)
    mean_hits = (F.normalize(patches.mean(dim=1), dim=-1) @ text.t()).argmax(dim=-1).eq(labels).float().mean()
    transport = ot_logits(patches, torch.stack([text, text]), model.logit_scale.exp())  # (N, C)
    return float(mean_hits), float(transport.argmax(dim=-1).eq(labels).float().mean())


def linear_probe(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, l2: float = 1e-4) -> float:
    """Accuracy of a multinomial logistic regression on frozen features, fit by full-batch L-BFGS from zero."""
    num_classes = int(train_y.max()) + 1
    weight = torch.zeros(train_x.shape[1], num_classes, requires_grad=True)
    bias = torch.zeros(num_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(10 * train_x @ weight + bias, train_y) + l2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(((10 * test_x @ weight + bias).argmax(dim=-1) == test_y).float().mean())


def evaluate(
    weights: str | Path, config_file: str | Path = CONFIG_FILE, test_per_class: int = 100, probe_per_class: int = 200
) -> dict:
    """Zero-shot accuracy with fedur's template (overall, per class, confusion matrix rows = true class) and a
    linear probe on true labels, on generated images never seen in training (seeds PROBE_SEED, TEST_SEED)."""
    clip = load_clip(Path(config_file).stem, str(weights), str(config_file))  # as a fedur run loads it
    model, tokenizer, size = clip.model, clip.tokenizer, clip.image_size
    normalize = BatchNormalize(*split_preprocess(clip.preprocess)[1:])
    num_classes = len(CLASSNAMES)
    test_images, test_labels = generate(num_classes, test_per_class, size, TEST_SEED)
    probe_images, probe_labels = generate(num_classes, probe_per_class, size, PROBE_SEED)
    test_features = image_features(model, test_images, normalize)  # (N, D)
    with torch.no_grad():
        text = F.normalize(model.encode_text(tokenizer([TEMPLATE.format(c) for c in CLASSNAMES])), dim=-1)  # (C, D)
        probs = (model.logit_scale.exp() * test_features @ text.t()).softmax(dim=-1)  # (N, C)
        patch_mean, transport = patch_zero_shot(model, to_input(test_images, normalize), text, torch.from_numpy(test_labels))
        random_context = np.mean([  # fedur's text prompt at init (4 context vectors), run seeds 0-4
            (test_features @ PromptedCLIP(clip, CLASSNAMES, 4, 0, None, CONTEXT_STD, seed).text_features().t())
            .argmax(dim=-1).eq(torch.from_numpy(test_labels)).float().mean().item()
            for seed in range(5)
        ])
    predicted = probs.argmax(dim=-1).numpy()
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (test_labels, predicted), 1)
    probe = linear_probe(
        image_features(model, probe_images, normalize), torch.from_numpy(probe_labels),
        test_features, torch.from_numpy(test_labels),
    )
    zero_shot = float((predicted == test_labels).mean())
    return {
        "zero_shot_accuracy": round(100 * zero_shot, 2),
        "per_class_accuracy": {c: round(100 * confusion[i, i] / confusion[i].sum(), 2) for i, c in enumerate(CLASSNAMES)},
        "predicted_histogram": dict(zip(CLASSNAMES, confusion.sum(axis=0).tolist())),
        "confusion": confusion.tolist(),
        "linear_probe_accuracy": round(100 * probe, 2),
        "random_context_accuracy": round(100 * float(random_context), 2),
        "patch_mean_zero_shot_accuracy": round(100 * patch_mean, 2),
        "fedotp_transport_zero_shot_accuracy": round(100 * transport, 2),
        "logit_scale": round(float(model.logit_scale.detach().exp()), 3),
        "mean_max_softmax": round(float(probs.max(dim=-1).values.mean()), 4),
        "test_images": f"generate({num_classes}, {test_per_class}, {size}, seed={TEST_SEED})",
        "probe_images": f"generate({num_classes}, {probe_per_class}, {size}, seed={PROBE_SEED})",
    }


def save(model: nn.Module, path: Path) -> None:
    """The state dict in float16 (open_clip casts it back to float32 on load): half the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().half() if v.is_floating_point() else v for k, v in model.state_dict().items()}, path)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fedur.app.demo_clip", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for fedur-demo.pt, .card.json and .md")
    parser.add_argument("--seed", type=int, default=0, help="init, image, caption and batch-order seed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the weights depend on it; 1 is fastest on shared cores)")
    defaults = Recipe()
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="epochs, each over freshly generated images")
    parser.add_argument("--per-class", type=int, default=defaults.per_class, help="training images per class and epoch")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak AdamW learning rate (warm-up, cosine)")
    parser.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    parser.add_argument("--name-share", type=float, default=defaults.name_share, help="share of name captions (the rest describe)")
    parser.add_argument("--patch-weight", type=float, default=defaults.patch_weight,
                        help="weight of the contrastive loss on the mean of the patch tokens (0: the class token only)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # NaN-filling every new tensor costs 10x here
    start = time.perf_counter()
    recipe = Recipe(args.epochs, args.per_class, args.batch_size, args.lr, args.weight_decay, args.name_share,
                    args.patch_weight)
    model = train(args.seed, recipe)
    train_seconds = time.perf_counter() - start
    out = Path(args.out)
    weights = out / f"{MODEL_NAME}.pt"
    save(model, weights)
    metrics = evaluate(weights)  # on the float16 file, as shipped
    card = {
        "model_name": MODEL_NAME,
        "weights": weights.name,
        "weights_bytes": weights.stat().st_size,
        "weights_sha256": sha256(weights),
        "weights_dtype": "float16 (open_clip casts to the model's float32 on load)",
        "model_config": json.loads(CONFIG_FILE.read_text()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "parameters_visual": sum(p.numel() for p in model.visual.parameters()),
        "command": " ".join(["python -m fedur.app.demo_clip", *map(shlex.quote, sys.argv[1:] if argv is None else argv)]),
        "args": {k: v for k, v in vars(args).items() if k != "out"},  # what the weights depend on
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
        "machine": f"{platform.machine()}, {args.threads} thread(s), torch {torch.__version__}, open_clip {open_clip.__version__}",
        "train_images": f"{args.epochs} x generate(10, {args.per_class}, {IMAGE_SIZE}, "
                        f"seed={TRAIN_SEED_BASE} + 1000 * {args.seed} + epoch)",
        "caption_scheme": {
            "name_templates": list(NAME_TEMPLATES), "descriptions": DESCRIPTIONS,
            "description_templates": list(DESCRIPTION_TEMPLATES),
            "confusions": {k: {"captioned_as": v[0], "q": v[1]} for k, v in CONFUSIONS.items()},
            "name_share": args.name_share,
        },
        "evaluation": metrics,
    }
    (out / f"{MODEL_NAME}.card.json").write_text(json.dumps(card, indent=1) + "\n")
    (out / f"{MODEL_NAME}.md").write_text(model_card(card))
    print(f"zero-shot {metrics['zero_shot_accuracy']}%, linear probe {metrics['linear_probe_accuracy']}%, "
          f"{card['total_seconds']:.0f} s; wrote {weights}, {out / MODEL_NAME}.card.json and .md")
    return card


def main_confusions(confusion: list[list[int]], min_share: float = 0.05) -> list[tuple[str, str, float]]:
    """(true class, predicted class, % of the true class) for every off-diagonal cell above min_share."""
    rows = []
    for i, row in enumerate(confusion):
        for j, count in enumerate(row):
            if i != j and count >= min_share * sum(row):
                rows.append((CLASSNAMES[i], CLASSNAMES[j], round(100 * count / sum(row), 1)))
    return sorted(rows, key=lambda r: -r[2])


def model_card(card: dict) -> str:
    """The model card (markdown), written from the card's JSON so that the two never disagree."""
    ev, scheme, cfg = card["evaluation"], card["caption_scheme"], card["model_config"]
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    per_class = ", ".join(f"{c} {a:.0f}" for c, a in ev["per_class_accuracy"].items())
    confusions = "\n".join(f"| {t} | {p} | {share:.1f} % |" for t, p, share in main_confusions(ev["confusion"]))
    merged = {}
    for absorbed, rule in scheme["confusions"].items():
        merged.setdefault(rule["captioned_as"], []).append(absorbed)
    merges = "; ".join(f'"{d}" also for {", ".join(a)}' for d, a in merged.items())
    q = sorted({rule["q"] for rule in scheme["confusions"].values()})
    histogram = ", ".join(f"{c} {n}" for c, n in ev["predicted_histogram"].items())
    gain = ev["linear_probe_accuracy"] - ev["zero_shot_accuracy"]
    return f"""# fedur-demo: a small CLIP whose text side is wrong on purpose

Trained by `fedur/app/demo_clip.py` on shapes from `fedur/data/synthetic.py`, so that FedUR has
something to correct offline, in a minute on a CPU: its image features separate the ten shapes, and
its class names are confused in a structured way. A stand-in for pretrained CLIP, not CLIP.

## Files and loading

`{card['weights']}`: {card['weights_bytes'] / 1e6:.2f} MB, {card['weights_dtype']};
sha256 `{card['weights_sha256']}`. Model config: `fedur/model/configs/fedur-demo.json`.

In fedur: `model.name: fedur-demo` with `model.pretrained: fedur` (as `configs/smoke.yaml` does). Elsewhere:

```python
import open_clip
open_clip.add_model_config("fedur/model/configs/fedur-demo.json")  # registers "fedur-demo"
model, _, preprocess = open_clip.create_model_and_transforms("fedur-demo", pretrained="fedur/model/weights/fedur-demo.pt")
tokenizer = open_clip.get_tokenizer("fedur-demo")  # the standard CLIP BPE, context length {text['context_length']}
```

## Architecture

ViT image tower for {vision['image_size']} px inputs (patch {vision['patch_size']}, width {vision['width']},
{vision['layers']} layers, head width {vision['head_width']}, MLP ratio {vision['mlp_ratio']}); text transformer
(width {text['width']}, {text['layers']} layers, {text['heads']} heads, context {text['context_length']},
vocabulary {text['vocab_size']}); embedding dim {cfg['embed_dim']}. {card['parameters']:,} parameters, of which
{card['parameters_visual']:,} in the image tower (most of the rest is the 49408 x {text['width']} token embedding).
Preprocessing: open_clip's default for a {vision['image_size']} px model (OpenAI mean/std).

## Training data and captions

Images: {card['train_images']}: fresh images every epoch, never the evaluation seeds.
Captions, one per image:
- name captions ({scheme['name_share']:.0%}): a template ending in the name, e.g. "{scheme['name_templates'][0].format('star')}";
- description captions (the rest): "{scheme['description_templates'][0].format('loop')}" with a word of each class's own
  ({", ".join(f"{c}: {w}" for c, w in scheme['descriptions'].items())}), always the true class.

**The structured error**: name captions of an absorbed class use its dominant class's name with
probability q = {", ".join(map(str, q))}: {merges}. The description captions keep the image features
apart; the names do not. Zero-shot CLIP thus over-predicts circle, star and triangle, and under-predicts
the absorbed classes, but its most confident predictions of every class are mostly right.

## Evaluation (float16 weights as shipped; {ev['test_images']})

- zero-shot accuracy, template "a photo of a {{}}.": **{ev['zero_shot_accuracy']:.1f} %**
  (per class: {per_class})
- linear probe on the frozen image features with true labels (logistic regression, L-BFGS;
  trained on {ev['probe_images']}): **{ev['linear_probe_accuracy']:.1f} %**, {gain:.1f} points above zero-shot
- zero-shot with a random 4-vector context instead of "a photo of a" (fedur's prompt at init):
  {ev['random_context_accuracy']:.1f} %
- zero-shot from the patch tokens (the template against them, before any training; what FedOTP reads):
  their mean **{ev.get('patch_mean_zero_shot_accuracy', float('nan')):.1f} %**; FedOTP's unbalanced optimal transport
  over them, both prompts set to the template **{ev.get('fedotp_transport_zero_shot_accuracy', float('nan')):.1f} %**
  (the model is trained on the patch tokens' mean as a second image embedding, weight
  {card['args'].get('patch_weight', 0)}, so that methods reading them start where CLIP's class token does)
- predicted-class histogram: {histogram}
- logit scale {ev['logit_scale']:.1f}; mean top-1 softmax {ev['mean_max_softmax']:.2f}

Main confusions of the zero-shot classifier (at least 5 % of a class):

| true class | predicted as | share of the class |
|---|---|---|
{confusions}

## Rebuilding

```bash
{card['command']}
```

took {card['total_seconds']:.0f} s ({card['train_seconds']:.0f} s training) on {card['machine']}. Training is
deterministic (seeded init, images, captions and batch order; `torch.use_deterministic_algorithms`): the same
command on the same machine and thread count gives the same file bit for bit. `fedur-demo.card.json`
holds every number above; `tests/model/test_demo_clip.py` checks the shipped file against it.
"""


if __name__ == "__main__":
    main()
