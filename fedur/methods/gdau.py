"""Federated GDA-U (Wang, Liang et al., ICLR 2024, "A hard-to-beat baseline for training-free CLIP-based
adaptation", its unsupervised variant; FedUR implementation spec, sec. 11): training-free. Every class is a Gaussian over the
frozen CLIP image features with one covariance shared by all classes, fitted by EM from zero-shot CLIP;
the classifier is the Gaussian discriminant ensembled with zero-shot CLIP's logits.

Federated through sufficient statistics, one EM iteration per round: each client runs the E-step on its
own features with the classifier it holds (zero-shot CLIP before the first round) and uploads its
statistics (soft class counts, feature sums, second moment); the server SUMS them in client-id order (not
an average of prompts), fits the classifier (the M-step) and every client downloads it. With every client
taking part the sum is the statistics of all clients' data pooled, so the fit is the centralised one; with
federation.join_rate < 1 each round's M-step sees that round's participants only. The math, with the
reference's lines and every [guess], is in fedur/methods/gda_math.py. No prompts, no SGD, no labeller.

Cost: a client recomputes its frozen train features every round (one forward pass over its images), and
the statistics, the (D, D) second moment included, are summed across ranks in float64, in client-id order
(`Method.summed`): K x D^2 x 8 bytes go through the collectives per round (10 clients at D = 512: 21 MB; 1,000
clients at D = 768: 4.7 GB), in chunks of clients of at most 256 MB per rank, so that a rank never holds more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.methods.base import Aggregated, ClientData, GlobalModel, GlobalView, LocalRound, Method, ServerRound
from fedur.methods.gda_math import (
    DEFAULT_ALPHA,
    GDAStats,
    ensemble_logits,
    gda_classifier,
    gda_logits,
    responsibilities,
    sufficient_statistics,
    zero_statistics,
)
from fedur.methods.gda_math import e_step as posterior
from fedur.methods.pieces import Piece

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


class GDAU(Method):
    """GDA-U: Gaussian discriminant analysis fitted by federated EM from zero-shot CLIP, ensembled with it."""

    label = "GDA-U"

    trains = False
    summed = GDAStats._fields  # the statistics (messages): the server needs their sum only, exchanged in chunks of clients

    def __init__(
        self,
        alpha: NonNegativeFloat = DEFAULT_ALPHA,
        precision_scale: Literal["likelihood", "reference"] = "likelihood",
        prior: Literal["uniform", "estimated"] = "uniform",
        e_step: Literal["gda", "ensemble"] = "gda",
        first_step: Literal["soft", "hard"] = "soft",
        temperature: PositiveFloat = 1.0,
        em_rounds: PositiveInt | None = None,
    ) -> None:
        """
        Args:
            alpha: Weight of the GDA log posterior in logits = CLIP's logits + alpha * GDA's [guess: 0.3; the
                reference searches it on labelled validation data, which an unsupervised client has not].
            precision_scale: 'likelihood': the inverse of the reference's shrunk covariance, so that GDA's
                logits are the Gaussian log posterior (EM's E-step) [guess]; 'reference': the reference's
                D * pinv(...) exactly (D / (N - 1) times smaller: near-uniform posteriors when N >> D).
            prior: Class priors: 'uniform' (the reference's) or 'estimated' (EM's N_c / N) [guess].
            e_step: The E-step posterior: 'gda' (textbook EM) or 'ensemble' (with CLIP's logits, anchoring the
                clusters to the class names) [guess].
            first_step: The first M-step's responsibilities: zero-shot CLIP's softmax ('soft') or its argmax
                one-hot ('hard') [guess].
            temperature: Temperature of the E-step softmax (1: EM's posterior); the first round's zero-shot
                responsibilities are CLIP's own softmax.
            em_rounds: EM iterations at most (one per round); null: federation.rounds.
        """
        super().__init__()
        self.alpha, self.precision_scale, self.prior = float(alpha), precision_scale, prior
        self.e_step, self.first_step, self.temperature = e_step, first_step, float(temperature)
        self.em_rounds = None if em_rounds is None else int(em_rounds)

    def rounds(self, configured: int) -> int:
        return configured if self.em_rounds is None else min(configured, self.em_rounds)

    # ---------------------------------------------------------------- a client's model

    def pieces(self) -> dict[str, Piece]:
        return {}  # no prompts: the classifier is fitted, not trained

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        return model.zero_shot_text

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        features = model.image_features(images, prompted=False)  # (B, D) frozen CLIP
        clip = model.logits(features, text)  # (B, C) float32
        if "gda_W" not in client.extra:  # before the first round: zero-shot CLIP
            return clip
        W, b = client.extra["gda_W"].to(features.device), client.extra["gda_b"].to(features.device)
        return ensemble_logits(clip.double(), gda_logits(features, W, b), self.alpha).float()

    # ---------------------------------------------------------------- the server

    def messages(self, model: PromptedCLIP, start: dict[str, Tensor]) -> dict[str, Tensor]:
        num_classes, dim = model.zero_shot_text.shape
        return zero_statistics(num_classes, dim)._asdict()  # counts, sums, second_moment, num_samples

    @torch.no_grad()
    def upload(self, client: ClientState, data: ClientData, local: LocalRound | None) -> dict[str, Tensor]:
        """The E-step on the client's train images with the classifier it holds, and their statistics."""
        model = data.model
        features = data.train_features(client)  # (n, D) float32 on CPU
        clip = model.logits(features.to(model.zero_shot_text.device), model.zero_shot_text).cpu()  # (n, C)
        if "gda_W" not in client.extra:  # the first round: EM starts from zero-shot CLIP
            weights = responsibilities(clip.double(), hard=self.first_step == "hard")
        else:
            weights = posterior(features, client.extra["gda_W"], client.extra["gda_b"], clip.double(), source=self.e_step,
                             alpha=self.alpha, temperature=self.temperature)
        return sufficient_statistics(features, weights)._asdict()

    def aggregate(self, round: ServerRound) -> Aggregated:
        """The classifier fitted (the M-step) from the sum of the statistics of the clients that took part (in
        client-id order), kept in the server state for every client to download."""
        if not bool(round.participants.any()):
            return Aggregated(round.current)
        total = GDAStats(*(round.total(name) for name in GDAStats._fields))  # summed in client-id order (Method.summed)
        W, b = gda_classifier(total, precision_scale=self.precision_scale, prior=self.prior)
        return Aggregated(round.current, {**round.state, "W": W, "b": b})

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The classifier the server fitted (every client holds the same); zero-shot CLIP before the first, and on
        classes the statistics do not cover (novel ones)."""
        fitted = "W" in view.state and not view.other_classes
        return GlobalModel({}, {"gda_W": view.state["W"], "gda_b": view.state["b"]} if fitted else {})

    def download(self, client: ClientState, shared: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        if "W" in state:
            client.extra = {"gda_W": state["W"], "gda_b": state["b"]}
