"""FedPromptSRC: PromptSRC (Khattak et al., ICCV 2023, "Self-regulating prompts: foundational model adaptation without
forgetting") federated as FLiP federates it, with its deep prompts. Independent vision-language prompts (IVLP): a text
context and deep text prompts replacing the context's positions before text blocks 1..J_t-1, a visual prompt per
vision block appended before ln_pre at the first and replacing the last tokens at the deeper ones, their outputs kept
to the end. Self-regulation in the local loss, against the frozen CLIP:

    L = CE + 25 mean|T - T0| + 10 mean|f - f0| + (1 / (B C)) sum_b KL(softmax(s f0_b T0^T) || softmax(s f_b T^T))

T the class features, T0 CLIP's mean over 60 ImageNet templates of the raw features, normalised after the mean; f the
image features, f0 the frozen tower's; s CLIP's logit scale. And Gaussian-weighted prompt aggregation (GPA): the
evaluated model is a Gaussian-weighted average of the prompts along training, never trained from.

Read from muzairkhattak/PromptSRC @ bb95c77b634d63488f2cad81ff4a72d53bdd06d5: trainers/promptsrc.py, `VLPromptLearner`
L72-170 (ctx from "a photo of a"; the teacher's 60 templates, trainers/imagenet_templates.py, averaged raw, L114-128),
`CustomCLIP.forward` L185-211, `forward_backward` L281-336 (the losses L297-313; GPA at each epoch's end, L320-335,
weights pdf(e; mean, std) normalised over the epochs, L262-270), clip/model.py `ResidualAttentionBlock_IVLP`
L191-256 and `VisionTransformer` L363-424; configs/trainers/PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx.yaml (the preset).
The federated form from 0-ml/flip @ ec3a848b46f3c7d0030052f0c8a4401767d8c09f: flcore/models/clip/PromptSRC.py
L14-111 (the same losses, weights 25 and 10; GPA run by the server over rounds after FedAvg), the prompts averaged by
local data size (flcore/servers/server_base.py L202-237). docs/sources/maple-promptsrc.md is the reading.

Where fedur differs, deliberately: FLiP's port has neither deep nor visual prompts (its `Transformer` builds none) and
feeds its GPA's unnormalised partial sum back to the clients as the global prompt; here the prompts are PromptSRC's
own, every one averaged [guess: FLiP shares its whole prompt learner], and GPA is the server's: after each round's
average it adds the global prompts with weight pdf(r; gpa_mean R, gpa_std R) and the server's model (the global
protocols) is that running average normalised by its weights, never fed back, PromptSRC's epochs read as rounds
[guess: 15 and 1 of its 20 epochs: 0.75 and 0.05 of the rounds]; the clients' own models (the personal protocol) are
the averaged prompts. The frozen image features f0 are of the same batch, as the original's (fedur's training images
are not augmented). float32 pieces and SGD, the towers bf16-mixed on GPUs with bf16 units under fabric.precision auto
(the original's CLIP and context are fp16); the teacher's templates are open_clip's first 60 of OpenAI's 80,
PromptSRC's list. docs/reference-parity.md lists every difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from fedur.errors import ConfigError
from fedur.federated.client import ClientState
from fedur.labels import FPL, Labeller
from fedur.methods.base import Aggregated, GlobalModel, GlobalView, LocalBatch, Method, ServerRound
from fedur.methods.pieces import Piece, deep_text_prompts, text_context
from fedur.model.precision import full_precision
from fedur.model.prompts import init_prompt

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP

GPA, MASS = "gpa.", "gpa_mass"  # the server state: each piece's weighted sum, and the sum of the weights


@dataclass
class StepText:
    """PromptSRC's text side: the class features, and (in a training step) the step's image features that `logits`
    formed, which `penalty` reads."""

    features: Tensor  # (C, D) unit-norm
    image: Tensor | None = None  # (B, D) the step's prompted image features


class FedPromptSRC(Method):
    """FedPromptSRC: deep text and visual prompts, all averaged, trained with PromptSRC's agreement with the frozen
    CLIP; the server's model a Gaussian-weighted average over the rounds; FPL pseudo-labels."""

    label = "FedPromptSRC"
    preset = "fedpromptsrc"
    stale_inputs = ("the mean of a step's staleness-weighted arrivals, as every averaged method; GPA's Gaussian weights "
                    "run over the server's steps (ServerRound.number of .rounds) in place of its rounds")

    def __init__(self, text_depth: PositiveInt | None = None, vision_depth: PositiveInt | None = None, ctx_init: str | None = None,
                 text_weight: NonNegativeFloat = 25.0, image_weight: NonNegativeFloat = 10.0, gpa: Literal["rounds", "off"] = "rounds",
                 gpa_mean: PositiveFloat = 0.75, gpa_std: PositiveFloat = 0.05, **kwargs) -> None:
        """
        Args:
            text_depth: J_t, the prompted text blocks (PromptSRC's 9; its cross-dataset config 3); null: 9, or the
                text tower's blocks where it has fewer.
            vision_depth: J_v, the prompted vision blocks, each with model.visual_tokens prompts (PromptSRC's 9 and 4);
                null: 9, or the vision tower's blocks where it has fewer.
            ctx_init: Words whose CLIP embeddings start the context (its first model.n_ctx tokens: PromptSRC's "a
                photo of a" with model.n_ctx 4); null: N(0, model.ctx_init_std^2), FLiP's.
            text_weight: Weight of mean|T - T0| (25).
            image_weight: Weight of mean|f - f0| (10).
            gpa: The server's model: the Gaussian-weighted average of the global prompts over the rounds ('rounds')
                [guess], or the last round's ('off').
            gpa_mean: The Gaussian's mean as a fraction of the rounds (PromptSRC's 15 of 20 epochs: 0.75) [guess].
            gpa_std: Its standard deviation as a fraction of the rounds (1 of 20: 0.05) [guess].
        """
        super().__init__(**kwargs)
        self.text_depth, self.vision_depth, self.ctx_init = text_depth, vision_depth, ctx_init
        self.text_weight, self.image_weight = float(text_weight), float(image_weight)
        self.gpa, self.gpa_mean, self.gpa_std = gpa, float(gpa_mean), float(gpa_std)

    def pieces(self) -> dict[str, Piece]:
        text_depth, vision_depth = self.text_depth, self.vision_depth
        deep = Piece(lambda model, seed: deep_text_prompts(prompt_depth(model, text_depth, "text")).init(model, seed), shared=True)
        visual = Piece(lambda model, seed: init_prompt((prompt_depth(model, vision_depth, "vision"), model.visual_tokens,
                                                        model.vision_width), model.init_std, seed), shared=True, salt=2)
        return {"text_ctx": text_context(shared=True, words=self.ctx_init), "deep_text": deep, "visual": visual}

    def default_labeller(self) -> Labeller | None:
        return FPL()

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        return StepText(model.text_features(pieces["text_ctx"], deep=pieces["deep_text"]))

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """CLIP's logits of the images with the IVLP visual prompts against the class features; in a training step the
        image features stay on `text` for the penalty."""
        visual = pieces.get("visual")
        if visual is not None and visual.numel():
            visual = torch.cat([model.vision_pre_norm(visual[:1]), visual[1:]])  # the first through ln_pre, as theirs
        features = model.image_features(images, visual=visual, persist=True)
        if model.training:
            text.image = features
        return model.logits(features, text.features)

    def penalty(self, model: PromptedCLIP, pieces: dict[str, Tensor], start: dict[str, Tensor], client: ClientState,
                text: Any, batch: LocalBatch | None = None) -> Tensor | None:
        """PromptSRC's self-regulating terms (L_SCL) of this step: the class features against the 60-template teacher,
        the image features against the frozen tower's of the same batch, and the logits' KL to the frozen model's."""
        device = text.features.device
        teacher = model.template_features(imagenet_templates(), device, average="raw")  # (C, D) T0
        with torch.no_grad():
            frozen = model.image_features(batch.images, prompted=False).float()  # (B, D) f0
        with full_precision(device):
            loss = self.text_weight * F.l1_loss(text.features.float(), teacher)
            loss = loss + self.image_weight * F.l1_loss(text.image.float(), frozen)
            zero_shot = model.biased(model.logit_scale.float() * frozen @ teacher.t())  # (B, C)
            kl = F.kl_div(F.log_softmax(batch.logits.float(), dim=1), F.log_softmax(zero_shot, dim=1), reduction="sum",
                          log_target=True)
            return loss + kl / batch.logits.numel()  # the KL's weight: the code's 1

    def aggregate(self, round: ServerRound) -> Aggregated:
        """FedAvg of every piece; with GPA, the global prompts added to the server's running sums with this round's
        Gaussian weight."""
        result = super().aggregate(round)
        if self.gpa == "off":
            return result
        weight = gaussian(round.number, self.gpa_mean * round.rounds, self.gpa_std * round.rounds)
        state = dict(round.state)
        for name, value in result.shared.items():
            state[GPA + name] = state.get(GPA + name, torch.zeros_like(value, dtype=torch.float64)) + weight * value.double()
        state[MASS] = state.get(MASS, torch.zeros((), dtype=torch.float64, device="cpu")) + weight
        return Aggregated(result.shared, state, {"gpa_mass": float(state[MASS])})

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The GPA of the global prompts so far (normalised by its weights); before any round, or with gpa 'off', the
        global prompts."""
        if self.gpa == "off" or MASS not in view.state or float(view.state[MASS]) == 0.0:
            return GlobalModel({**view.start, **view.shared})
        mass = view.state[MASS]
        return GlobalModel({**view.start, **{name: (view.state[GPA + name] / mass).to(value.dtype) for name, value in view.shared.items()}})


def gaussian(x: float, mean: float, std: float) -> float:
    """The normal density at x: PromptSRC's `get_gauss` (its weights are normalised, so only their ratios matter)."""
    return math.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))


def prompt_depth(model: PromptedCLIP, depth: int | None, tower: str) -> int:
    """J_t or J_v: `depth`, checked against the `tower` ("text" or "vision"); None: 9 capped at its blocks."""
    blocks = model.text_depth if tower == "text" else model.vision_depth
    if depth is None:
        return min(9, blocks)
    if depth > blocks:
        raise ConfigError(f"FedPromptSRC: --method.{tower}_depth {depth} is deeper than this {tower} tower ({blocks} blocks)")
    return depth


def imagenet_templates() -> tuple[str, ...]:  # noqa: N802  a constant, read when first used (open_clip is not imported by the methods)
    """PromptSRC's 60 templates (trainers/imagenet_templates.py): OpenAI's ImageNet prompt templates, open_clip's
    first 60 of 80 with its 40th first, as PromptSRC lists them."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    first = [t("{}") for t in OPENAI_IMAGENET_TEMPLATES[:60]]
    return (first[39], *first[:39], *first[40:])
