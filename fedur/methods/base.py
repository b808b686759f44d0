"""What a federated method is, as the round loop asks it.

A method is one class; its constructor arguments are its settings (`--method PromptProx --method.mu 0.1`;
a class of your own by its import path, `--method mypkg.methods.Mine`). It differs from FedUR in a few
named places, and only there (docs/extending.md walks through two examples):

A client's model
- `prompts`: the prompt slots each client holds and trains ("visual", "text_ctx", "text_local");
- `text_side` / `logits`: how a client's logits are formed from an image batch and its prompts;
- `group_text_side` / `group_logits`: the same for several clients at once (run.clients_per_step). The
  defaults call `text_side` and `logits` once per client, so they are right for every method; a method may
  declare a fused forward (one pass of a tower for the whole group);
- `penalty`: an extra term of the local loss (e.g. FedProx's proximal term);
- `after_refresh`: per-client state built at each pseudo-label refresh, kept in `client.extra`
  (checkpointed with the client);
- `trains`: whether clients train their prompts with SGD on pseudo-labels (zero-shot CLIP and GDA-U do not);
- `default_labeller` / `pair`: the pseudo-labeller it is paired with unless `--labeller` says otherwise.

The server (identical on every rank, from every client's upload in client-id order)
- `init_shared`: the shared pieces and their initial value (default: the prompts in `shared`);
- `upload`: what a client sends after its local update (default: its shared prompts);
- `aggregate`: the new global pieces from the uploads (default: the weighted average), with the method's
  own server state (checkpointed and restored with the run);
- `download`: what a client takes from the global pieces (default: the shared prompts);
- `client_weights`, `participants`, `rounds`: aggregation weights, who takes part, how many rounds.

The loop, collectives, checkpoints, resume, metrics and placement are the same for every method.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from fedur.federated.aggregation import weighted_average
from fedur.federated.client import ClientState
from fedur.federated.streams import participants
from fedur.labels import CoDPL, Labeller
from fedur.model.classifier import PromptedCLIP


class ClientData(Protocol):
    """What a method may read of a client's images beyond a batch (the round loop's rank provides it)."""

    @property
    def model(self) -> PromptedCLIP: ...

    def train_features(self, client: ClientState, positions: np.ndarray | None = None) -> Tensor:
        """(n, D) unit-norm frozen CLIP image features (no prompts), float32 on CPU, of the client's train
        images at `positions` (None: all of them, in order)."""
        ...


class Method:
    """A federated method. The defaults are FedUR's structure: a deep visual prompt averaged by the server
    (weighted by the selected counts) and a text prompt each client keeps, logits = scale x cos(image, text)."""

    key: ClassVar[str] = ""  # the short name runs and tables record ("fedur"); default: the class name, lowercased
    # How the method describes itself to tables, configs and resumes (read by fedur/tables and fedur/train/run_dir.py):
    label: ClassVar[str] = ""  # its name in tables and figures ("pFedPrompt"); default: the class name
    preset: ClassVar[str | None] = None  # configs/presets/<preset>.yaml: its published settings (the 'own' protocol)
    # Constructor arguments added after runs were made, with the value such runs ran with: they resume and stay in
    # their table when the argument now has that value.
    added_settings: ClassVar[dict[str, Any]] = {"weighting": "selected"}
    # Constructor arguments that do not change what a run computes: a resume may change them freely.
    result_neutral: ClassVar[tuple[str, ...]] = ()
    # Keys of fedur before this method was a class, and what replaces them: {"method.prox_mu": "--method PromptProx ..."}.
    old_keys: ClassVar[dict[str, str]] = {}
    prompts: ClassVar[tuple[str, ...]] = ("visual", "text_ctx")
    trains: ClassVar[bool] = True  # local SGD on pseudo-labels; False: training-free (no labeller, no tuner)
    shared: tuple[str, ...] = ("visual",)  # the pieces the server aggregates (instance-level: an ablation may change it)
    # Shared pieces the server needs only summed over the clients that took part (sufficient statistics): they reach
    # `aggregate` as that sum, added in client-id order and exchanged in chunks of clients (bounded memory per rank).
    summed: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "key" not in cls.__dict__ and not cls.__name__.startswith("LazyInstance_"):  # jsonargparse's default wrapper
            cls.key = cls.__name__.lower()
        if "label" not in cls.__dict__:
            cls.label = cls.__name__
        if "rows" not in inspect.signature(cls.logits).parameters:
            raise TypeError(f"{cls.__qualname__}.logits(model, images, prompts, text, client, rows=None) must take `rows`: "
                            "each image's position in the client's train images, or None (fedur/methods/base.py)")
        # A fused grouped forward is written for the `logits` / `text_side` of the class that declares it: a class
        # whose own (or a mixin's) differ falls back to the per-client default, which is always right.
        for hook, reads in (("group_logits", ("logits", "text_side")), ("group_text_side", ("text_side",))):
            owner = next(c for c in cls.__mro__ if hook in c.__dict__)
            if owner is not Method and any(getattr(cls, name) is not getattr(owner, name) for name in reads):
                setattr(cls, hook, getattr(Method, hook))

    def __init__(self, weighting: Literal["selected", "data", "uniform"] = "selected") -> None:
        """
        Args:
            weighting: The server's weight of each client in the average of a shared prompt: its number of
                selected pseudo-labels |D~_k| ('selected', FedUR's and FedCoPL's code), its number of train
                images ('data', FedOTP's re-implementation of the baselines), or the same for every client
                ('uniform', PromptFL's code).
        """
        self.weighting = weighting

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    # ---------------------------------------------------------------- pairing and checks

    def default_labeller(self) -> Labeller | None:
        """The pseudo-labeller this method trains with unless `--labeller` names one (None: it needs none)."""
        return CoDPL() if self.trains else None

    def pair(self, labeller: Labeller | None) -> Labeller | None:
        """The labeller to run with: `labeller`, or this method's own for None. Raises ValueError when the
        two do not fit (here: a training-free method given a labeller)."""
        if labeller is not None and not self.trains:
            raise ValueError(f"{type(self).__name__} trains nothing, so it uses no pseudo-labeller; remove --labeller")
        paired = self.default_labeller() if labeller is None else labeller
        if paired is None and self.trains:
            raise ValueError(f"{type(self).__name__} trains on pseudo-labels but has no labeller of its own: give one "
                             "(--labeller CLASS), or return one from its default_labeller()")
        return paired

    def visual_tokens(self, configured: int) -> int:
        """Visual prompt tokens of the model: `model.visual_tokens`, or 0 for a method without a visual prompt."""
        return configured if "visual" in self.prompts else 0

    @property
    def local_text(self) -> bool:
        """Whether the model needs a second (local) text context."""
        return "text_local" in self.prompts

    def rounds(self, configured: int) -> int:
        """How many rounds to run of `federation.rounds`."""
        return configured

    # ---------------------------------------------------------------- a client's model

    def text_side(self, model: PromptedCLIP, prompts: dict[str, Tensor]) -> Any:
        """What the logits need from the text tower, computed once per pass (and every training step)."""
        return model.text_features(prompts.get("text_ctx"))

    def group_text_side(self, model: PromptedCLIP, prompts: list[dict[str, Tensor]]) -> list[Any]:
        """`text_side` of several clients' prompts (run.clients_per_step). Default: once per client."""
        return [self.text_side(model, p) for p in prompts]

    def logits(self, model: PromptedCLIP, images: Tensor, prompts: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """(B, C) logits of the client's model with `prompts` (the ones being trained, or the client's own).
        `client`: the client with its prompts and `extra` on the images' device; `rows`: (B,) int64, each image's
        position in the client's train images (on the device), or None for test images."""
        return model.logits(model.image_features(images, visual=prompts.get("visual")), text)

    def group_logits(self, model: PromptedCLIP, images: list[Tensor], prompts: list[dict[str, Tensor]],
                     texts: list[Any], clients: list[ClientState], rows: list[Tensor | None] | None = None) -> list[Tensor]:
        """Each client's (B_k, C) logits of its batch `images[k]` with `prompts[k]` (several clients in one
        step, run.clients_per_step); `rows[k]` as `logits`'s (None: no rows for any). Default: `logits` once
        per client."""
        rows = [None] * len(images) if rows is None else rows
        return [self.logits(model, x, p, t, c, r) for x, p, t, c, r in zip(images, prompts, texts, clients, rows)]

    def penalty(self, prompts: dict[str, Tensor], start: dict[str, Tensor]) -> Tensor | None:
        """An extra local loss term of the `prompts` being trained; `start`: those the client began the round with."""
        return None

    def after_refresh(self, client: ClientState, data: ClientData) -> None:
        """Build per-client state from the client's new pseudo-labels (in `client.extra`)."""

    # ---------------------------------------------------------------- the server

    def init_shared(self, model: PromptedCLIP) -> dict[str, Tensor]:
        """The global value of each shared piece before the first round (and the shape every upload has)."""
        return model.prompts(self.shared)

    def upload(self, client: ClientState, data: ClientData) -> dict[str, Tensor]:
        """What a client that took part sends after its local update, one tensor per shared piece."""
        return {name: client.prompts[name] for name in self.shared}

    def aggregate(self, uploads: dict[str, Tensor], weights: Tensor, current: dict[str, Tensor],
                  state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The new global pieces from `uploads` {name: (K, *shape)} (row k: client k's upload; zeros for a
        client with weight 0; for a piece in `summed`, (*shape): the sum over the clients with weight > 0) and
        `weights` (K,), given the `current` ones. `state`: the method's own server
        state, kept between rounds and checkpointed (change it in place). Default: the weighted average in
        client-id order; a piece nobody uploaded keeps its value."""
        out = {}
        for name, stacked in uploads.items():
            average = weighted_average(stacked, weights)
            out[name] = current[name] if average is None else average
        return out

    def download(self, client: ClientState, shared: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        """What every client (also one that sat the round out) takes from the new global pieces `shared` (and
        the method's server `state`)."""
        client.prompts = {**client.prompts, **{name: shared[name] for name in self.shared}}

    def client_weights(self, selected: Tensor | None, train_sizes: Tensor) -> Tensor:
        """(K,) aggregation weight of each client (`weighting`): its selected pseudo-label count |D~_k|
        (`selected`; None without a labeller, then its number of train images), its train images, or 1."""
        weighting = getattr(self, "weighting", "selected")  # a user's subclass may skip Method.__init__
        if weighting == "uniform":
            return torch.ones_like(train_sizes)
        return train_sizes if selected is None or weighting == "data" else selected

    def participants(self, round_idx: int, num_clients: int, join_rate: float, seed: int) -> Tensor:
        """(K,) bool: the clients that take part in the round (default: ceil(join_rate * K), drawn uniformly)."""
        return torch.from_numpy(participants(num_clients, join_rate, seed, round_idx))


def share_names(method: Method, share: str) -> tuple[str, ...]:
    """The prompts an ablation of the aggregation protocol shares ('visual', 'text', 'both', 'none'); a
    ValueError names what the method does not have."""
    wanted = {"visual": ("visual",), "text": ("text_ctx",), "both": ("visual", "text_ctx"), "none": ()}[share]
    missing = [name for name in wanted if name not in method.prompts]
    if missing:
        raise ValueError(f"share={share} averages {', '.join(missing)}, which {type(method).__name__} does not have "
                         f"(its prompts: {', '.join(method.prompts) or 'none'})")
    return wanted
