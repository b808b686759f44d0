"""What a federated method is, as the round loop asks it: a client side and a server side.

A method is one class; its constructor arguments are its settings (`--method PromptProx --method.mu 0.1`;
a class of your own by its import path, `--method mypkg.methods.Mine`). Every hook has FedUR's behaviour
as its default, so a method overrides only where it differs (docs/extending.md walks through examples).

The client side (`ClientSide`: what a client trains, its logits, its loss, what it sends)
- `pieces`: what each client holds and trains, each shared or personal (fedur/methods/pieces.py);
- `text_side` / `logits`: how a client's logits are formed from an image batch and its pieces (several clients
  at once, run.clients_per_step, go through one pass of a tower where the class keeps the base's:
  fedur/methods/forward.py; nothing to declare);
- `penalty`: an extra term of a client's local loss (FedProx's proximal term), seeing the step's batch and logits
  (`LocalBatch`: PromptSRC's agreement with the frozen model, FedPHA's loss on its global prompt's logits);
- `before_step` / `after_step`: around each optimizer step, seeing the client, the step, its learning rate
  and the gradients of the pieces (a gradient correction, SCAFFOLD's);
- `after_refresh`: per-client state built at each pseudo-label refresh, kept in `client.extra`;
- `upload` / `messages`: what a client that took part sends: its shared pieces, and messages that are not
  pieces (statistics, control-variate deltas), each declared with its shape;
- `download`: what every client takes from the new global pieces and the server's state.

The server side (`ServerSide`: identical on every rank, from every client's upload in client-id order)
- `aggregate`: the new global pieces from a round's uploads (`ServerRound`: the round number, who took
  part, the weights, the current pieces and the method's server state), with the new state and metrics
  (`Aggregated`; the metrics reach metrics.jsonl, TensorBoard and fedur-report);
- `client_weights`, `participants`, `rounds`: aggregation weights, who takes part, how many rounds;
- `global_model`: what the server's own model is (`GlobalView` -> `GlobalModel`), the one the global
  protocols test (docs/protocols.md): by default the shared pieces with the personal ones at their initial
  values, what a client that joins now would hold.

Pairing (`default_labeller`, `pair`) says which pseudo-labeller a method trains with. The loop,
collectives, checkpoints, resume, metrics and placement are the same for every method.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from fedur.errors import ConfigError, PluginError
from fedur.federated.aggregation import weighted_average
from fedur.federated.client import ClientState
from fedur.federated.streams import participants
from fedur.labels import Labeller
from fedur.methods.pieces import Piece, text_context, visual_prompt

if TYPE_CHECKING:  # annotations only: the methods import without open_clip (fedur-tables reads their attributes)
    from fedur.model.classifier import PromptedCLIP


@dataclass(frozen=True)
class ClientData:
    """What a method's hooks may read of a client beyond a batch (`after_refresh`, `upload`): the frozen model, and
    the frozen CLIP features of the client's train images."""

    model: PromptedCLIP
    features: Callable[[ClientState, np.ndarray | None], Tensor]  # the process's pass over a client's images
    secret_seed: int | None = None  # the run's secret seed (privacy's noise, a method's own secret draws:
    # ClientSide.draws_secret_noise); None where the run draws no secret noise

    def train_features(self, client: ClientState, positions: np.ndarray | None = None) -> Tensor:
        """(n, D) unit-norm frozen CLIP image features (no prompts), float32 on CPU, of the client's train
        images at `positions` (None: all of them, in order)."""
        return self.features(client, positions)


@dataclass
class LocalStep:
    """One optimizer step of one client, as `before_step` / `after_step` see it."""

    client: ClientState  # the client, its pieces those it began the round with and its `extra`, on the device
    pieces: dict[str, Tensor]  # the pieces being trained; after backward, a trained one's `.grad` is this step's
    trained: tuple[str, ...]  # the names of the pieces the optimizer steps
    step: int  # the client's optimizer steps before this one in the round (from 0)
    epoch: int  # the local epoch (from 0)
    lr: float  # this step's learning rate (the schedule's, as the optimizer applies it; of its first piece, where the
    # pieces train at rates of their own: Piece.lr_scale)
    optimizer: torch.optim.Optimizer
    round_idx: int = 0  # the round (from 0; a new client's adaptation: one past the last)


@dataclass(frozen=True)
class LocalBatch:
    """A client's batch in a training step, as `penalty` sees it (on the device)."""

    images: Tensor  # (B, 3, H, W); the frozen-feature cache's rows (FrozenImages) where the tower carries no prompt
    labels: Tensor  # (B,) the pseudo-labels
    mask: Tensor  # (B, C) bool, the labeller's class mask (negatives, CPL's candidates)
    rows: Tensor  # (B,) int64, each image's position in the client's train images
    logits: Tensor  # (B, C) the step's logits (the method's `logits`), with their graph
    loss: Callable[[Tensor], Tensor]  # the labeller's loss of other (B, C) logits on this batch (its labels, mask and
    # the round's class weights): what a method adds for a second head (FedPHA's global prompt)


@dataclass
class LocalRound:
    """A client's local training in one round, as `upload` sees it."""

    start: dict[str, Tensor]  # the pieces it began the round with (on the CPU)
    steps: int  # optimizer steps taken
    lr_sum: float  # the sum of the steps' learning rates


@dataclass(frozen=True)
class ServerRound:
    """What the server knows when it aggregates a round (every rank the same): what the channel released of the
    clients' uploads (fedur/channel/: the clock's accepted clients, the reducer's rows), read through `mean`, `total`
    and `rows`."""

    number: int  # the round, from 1
    rounds: int  # how many the run has
    released: dict[str, Tensor]  # {name: (K, *shape)} each accepted client's row as the reducer left it (zeros for the
    # others); a name in Method.summed: its (*shape) sum over the accepted clients
    weights: Tensor  # (K,) the aggregation weight of each client, 0 for those whose upload was not taken
    current: dict[str, Tensor]  # the global value of each shared piece before this round's aggregation
    state: dict[str, Tensor]  # the method's own server state from the round before ({} at first)
    training: Tensor | None = None  # (K,) bool: the federation's clients (False: a new client held out of every round,
    # evaluation.new_clients: it never uploads); None: every client
    own_rows: bool = True  # each accepted row is its client's own (False: the reducer released one value, a median,
    # a trimmed mean or central privacy's noised mean, and every accepted row holds it)
    rows_readable: bool = True  # whether `rows` may be read (Method.reads_rows, fedur/channel/__init__.py)
    reducer: str = "mean"  # what released the rows, for the refusal's message
    summed: tuple[str, ...] = ()  # the names exchanged as their sum (Method.summed)

    @property
    def participants(self) -> Tensor:
        """(K,) bool: the clients whose uploads this round holds."""
        return self.weights > 0

    @property
    def federation(self) -> int:
        """N: how many clients the federation has (the new clients held out of every round not counted)."""
        return len(self.weights) if self.training is None else int(self.training.sum())

    def mean(self, name: str) -> Tensor | None:
        """The weighted average of the accepted rows of `name` in client-id order (the reducer's value under a robust
        rule or central privacy); None when no upload was taken."""
        return weighted_average(self.released[name], self.weights)

    def total(self, name: str) -> Tensor:
        """The sum of the accepted rows of `name` in client-id order (a name in Method.summed: its sum as exchanged)."""
        return self.released[name] if name in self.summed else self.released[name].sum(dim=0)

    def rows(self, name: str) -> Tensor:
        """(K, *shape) the accepted rows of `name`, zeros for the others: each client's own where the reducer keeps
        them; where it released one value every accepted row holds it, and reading them is refused unless the method
        declares that it can live with that (Method.reads_rows = "released")."""
        if not self.rows_readable:
            raise PluginError(f"ServerRound.rows({name!r}): under {self.reducer} every accepted row is the one released "
                              "value, not the client's own; a method that can live with that declares reads_rows = "
                              "\"released\" (fedur/methods/base.py), one that needs the clients' own declares \"own\" and "
                              "is refused with that reducer before the run starts")
        return self.released[name]

    @property
    def uploads(self) -> dict[str, Tensor]:
        """{name: `rows(name)`} (and a summed name's sum): the rows under their name before fedur 0.5."""
        return {name: self.released[name] if name in self.summed else self.rows(name) for name in self.released}


@dataclass
class Aggregated:
    """What `aggregate` returns: the new global pieces, the method's new server state (None: unchanged; it is
    checkpointed with the run) and metrics of the round ({name: number}: metrics.jsonl's "method", TensorBoard's
    method/<name>, fedur-report)."""

    shared: dict[str, Tensor]
    state: dict[str, Tensor] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GlobalView:
    """What the server knows when it is asked for its global model (every rank the same)."""

    shared: dict[str, Tensor]  # the global value of each shared piece (on the CPU)
    state: dict[str, Tensor]  # the method's own server state
    start: dict[str, Tensor]  # every declared piece's initial value (on the CPU)
    client_mean: Callable[[str], Tensor]  # a personal piece's plain mean over the training clients (a collective:
    # every rank asks for the same names in the same order; the hook runs on every rank with the same view)
    other_classes: bool = False  # the images are classified among classes no client trained on (base-to-novel's
    # novel ones): the model's class prompts are those classes', and per-class state of the method does not apply


@dataclass
class GlobalModel:
    """The server's model, as the global protocols test it: a client that holds `pieces` and `extra` (what the
    method's `logits` read) and no data; `text`: what the logits need from the text tower (None: the method's
    `text_side` of `pieces`)."""

    pieces: dict[str, Tensor]
    extra: dict[str, Tensor] = field(default_factory=dict)
    text: Any = None


class ClientSide:
    """What a client trains and sends. Defaults: FedUR's (a deep visual prompt shared, a text context personal,
    logits = scale x cos(image, text))."""

    def pieces(self) -> dict[str, Piece]:
        """The pieces each client holds, by name, in the optimizer's order (fedur/methods/pieces.py)."""
        return {"visual": visual_prompt(shared=True), "text_ctx": text_context(shared=False)}

    def text_side(self, model: PromptedCLIP, pieces: dict[str, Tensor]) -> Any:
        """What the logits need from the text tower, computed once per pass (and every training step): the class
        features of the text context "text_ctx", with the deep text prompts "deep_text" where the method has them."""
        return model.text_features(pieces.get("text_ctx"), deep=pieces.get("deep_text"))

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        """(B, C) logits of the client's model with `pieces` (the ones being trained, or the client's own).
        `client`: the client with its pieces and `extra` on the images' device; `rows`: (B,) int64, each image's
        position in the client's train images (on the device), or None for test images."""
        return model.logits(model.image_features(images, visual=pieces.get("visual")), text)

    def penalty(self, model: PromptedCLIP, pieces: dict[str, Tensor], start: dict[str, Tensor], client: ClientState,
                text: Any, batch: LocalBatch) -> Tensor | None:
        """An extra term of the client's local loss, this step: of the `pieces` being trained (`start`: those it began
        the round with; `text`: what `text_side` gave for `pieces` this step, the object `logits` was handed for the
        step's batch; `batch`: the batch, its logits and the labeller's loss of other logits); None: none."""
        return None

    @property
    def draws_secret_noise(self) -> bool:
        """Whether the method's client side draws noise nobody may replay (DP-FPL's on its local prompt): the run then
        has a secret seed (ClientData.secret_seed), drawn at its start and kept in its checkpoints."""
        return False

    def before_step(self, step: LocalStep) -> None:
        """After backward, before the optimizer steps: may change the trained pieces' `.grad` in place."""

    def after_step(self, step: LocalStep) -> None:
        """After the optimizer stepped (the pieces hold their new values)."""

    def after_refresh(self, client: ClientState, data: ClientData) -> None:
        """Build per-client state from the client's new pseudo-labels (in `client.extra`)."""

    def messages(self, model: PromptedCLIP, start: dict[str, Tensor]) -> dict[str, Tensor]:
        """What a client sends beyond its shared pieces: {name: a tensor of the shape and dtype every client's
        has} (zeros will do; `start`: every piece's initial value, for a message shaped like one). Counted in
        bytes_sent (and upload_bytes) as what they are; never written as pieces."""
        return {}

    def upload(self, client: ClientState, data: ClientData, local: LocalRound | None) -> dict[str, Tensor]:
        """What a client that took part sends after its local update: one tensor per shared piece and per
        message (`messages`). `local`: its training this round (None for a method that trains nothing). May
        update the client's own state (`client.extra`, checkpointed with it)."""
        return {name: client.pieces[name] for name in shared_names(self)}

    def download(self, client: ClientState, shared: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        """What every client (also one that sat the round out) takes from the new global pieces `shared` (and
        the method's server `state`)."""
        client.pieces = {**client.pieces, **{name: shared[name] for name in shared_names(self)}}


class ServerSide:
    """How the server aggregates, whom it asks, for how long. Defaults: FedAvg over the clients that took part."""

    # Uploads the server needs only summed over the clients that took part (sufficient statistics): they reach
    # `aggregate` as that sum, added in client-id order and exchanged in chunks of clients (bounded memory per rank).
    summed: ClassVar[tuple[str, ...]] = ()
    # What `aggregate` reads of the clients' rows beside their mean (`ServerRound.rows`): None, nothing; "own", each
    # client's own row (the run is refused with a reducer that releases one value: a median, a trimmed mean, central
    # privacy's noised mean); "released", rows that may all be that one value.
    reads_rows: ClassVar[Literal["own", "released"] | None] = None
    # Under an asynchronous server (server.mode fedbuff | fedasync, docs/asynchronous.md) a step's rows are its
    # arrivals, each trained from an older version, applied to the current one: a method whose aggregate is ServerSide's
    # (the weighted mean) runs there as it is. One with an aggregate of its own says what it does with such stale
    # arrivals (`stale_inputs`, a sentence for docs/asynchronous.md), or why it cannot (`asynchronous_refusal`, words
    # that follow its name in the one line that refuses it); without either it is refused.
    stale_inputs: ClassVar[str | None] = None
    asynchronous_refusal: ClassVar[str | None] = None
    weighting: str = "selected"  # Method.__init__'s setting

    def aggregate(self, round: ServerRound) -> Aggregated:
        """The new global pieces from the round's uploads: the weighted average in client-id order of each
        shared piece (`ServerRound.mean`); a piece nobody uploaded keeps its value."""
        shared = {}
        for name, current in round.current.items():
            average = round.mean(name)
            shared[name] = current if average is None else average
        return Aggregated(shared)

    def client_weights(self, selected: Tensor | None, train_sizes: Tensor) -> Tensor:
        """(K,) aggregation weight of each client (`weighting`): its selected pseudo-label count |D~_k|
        (`selected`; None without a labeller, then its number of train images), its train images, or 1."""
        if self.weighting == "uniform":
            return torch.ones_like(train_sizes)
        return train_sizes if selected is None or self.weighting == "data" else selected

    def participants(self, round_idx: int, num_clients: int, join_rate: float, seed: int) -> Tensor:
        """(K,) bool: the clients that take part in round `round_idx` (from 0; default: ceil(join_rate * K),
        drawn uniformly)."""
        return torch.from_numpy(participants(num_clients, join_rate, seed, round_idx))

    def rounds(self, configured: int) -> int:
        """How many rounds to run of `federation.rounds`."""
        return configured

    def global_model(self, model: PromptedCLIP, view: GlobalView) -> GlobalModel | None:
        """The server's model (the global protocols: the union of the clients' test sets, held-out domains, other
        datasets). Default: the shared pieces, the personal ones at their initial values (what a client that
        joins now holds before it adapts). None: the method has no global model (no global accuracy)."""
        return GlobalModel({**view.start, **view.shared})

    def personal_means(self) -> tuple[str, ...]:
        """The personal pieces whose plain mean over the clients the server's model reads (`GlobalView.client_mean`):
        values the exchange does not release, so a run with privacy on refuses a method that names any."""
        return ()


class Method(ClientSide, ServerSide):
    """A federated method: a client side and a server side, each FedUR's unless overridden."""

    key: ClassVar[str] = ""  # the short name runs and tables record ("fedur"); default: the class name, lowercased
    trains: ClassVar[bool] = True  # local SGD on pseudo-labels; False: training-free (no labeller, no tuner)
    # What it needs of a backbone beyond what its pieces say (fedur/model/towers.py FEATURES; "patch tokens": FedOTP):
    # fedur/methods/backbones.py checks it against the model before any compute.
    needs: ClassVar[frozenset[str]] = frozenset()
    # How the method describes itself to tables, configs and resumes (read by fedur/app/tables and fedur/train/run_dir.py):
    label: ClassVar[str] = ""  # its name in tables and figures ("pFedPrompt"); default: the class name
    preset: ClassVar[str | None] = None  # configs/presets/<preset>.yaml: its published settings (the 'own' protocol)
    # Constructor arguments added after runs were made, with the value such runs ran with: they resume and stay in
    # their table when the argument now has that value.
    added_settings: ClassVar[dict[str, Any]] = {"weighting": "selected"}
    # Constructor arguments that do not change what a run computes: a resume may change them freely.
    result_neutral: ClassVar[tuple[str, ...]] = ()
    # Keys of fedur before this method was a class, and what replaces them: {"method.prox_mu": "--method PromptProx ..."}.
    old_keys: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__name__.startswith("LazyInstance_"):  # jsonargparse's default wrapper
            return
        if "key" not in cls.__dict__:
            cls.key = cls.__name__.lower()
        if "label" not in cls.__dict__:
            cls.label = cls.__name__
        if "rows" not in inspect.signature(cls.logits).parameters:
            raise PluginError(f"{cls.__qualname__}.logits(model, images, pieces, text, client, rows=None) must take `rows`: "
                            "each image's position in the client's train images, or None (fedur/methods/base.py)")
        if "batch" not in inspect.signature(cls.penalty).parameters:
            raise PluginError(f"{cls.__qualname__}.penalty(model, pieces, start, client, text, batch) must take `batch`: the "
                            "step's LocalBatch, its images, pseudo-labels, logits and the labeller's loss (fedur/methods/base.py)")

    def __init__(self, weighting: Literal["selected", "data", "uniform"] = "selected") -> None:
        """
        Args:
            weighting: The server's weight of each client in the average of a shared piece: its number of
                selected pseudo-labels |D~_k| ('selected', FedUR's and FedCoPL's code), its number of train
                images ('data', FedOTP's re-implementation of the baselines), or the same for every client
                ('uniform', PromptFL's code).
        """
        self.weighting = weighting

    def __repr__(self) -> str:  # its settings, not its bookkeeping
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in settings_of(self).items())})"

    def default_labeller(self) -> Labeller | None:
        """The pseudo-labeller this method trains with unless `--labeller` names one (None: none of its own)."""
        return None

    def pair(self, labeller: Labeller | None) -> Labeller | None:
        """The labeller to run with: `labeller`, or this method's own for None. Raises a ConfigError when the
        two do not fit (here: a training-free method given a labeller)."""
        if labeller is not None and not self.trains:
            raise ConfigError(f"{type(self).__name__} trains nothing, so it uses no pseudo-labeller; remove --labeller")
        paired = self.default_labeller() if labeller is None else labeller
        if paired is None and self.trains:
            raise ConfigError(f"{type(self).__name__} trains on pseudo-labels but has no labeller of its own: give one "
                             "(--labeller CLASS), or return one from its default_labeller()")
        return paired


def declared_means(method: ServerSide, mean: Callable[[str], Tensor]) -> Callable[[str], Tensor]:
    """`GlobalView.client_mean` of `method`: `mean` for the personal pieces its `personal_means` names, a PluginError
    for any other (a server model must say which unreleased values it reads: privacy refuses them)."""
    allowed = method.personal_means()

    def client_mean(name: str) -> Tensor:
        if name not in allowed:
            raise PluginError(f"{type(method).__name__}.global_model asked for the clients' mean of {name!r}, which its "
                              f"personal_means() does not name ({list(allowed)}): declare it (fedur/methods/base.py)")
        return mean(name)

    return client_mean


def shared_names(method: ClientSide) -> tuple[str, ...]:
    """The names of the method's shared pieces, in declaration order."""
    return tuple(name for name, piece in method.pieces().items() if piece.shared)


def settings_of(method: Method) -> dict[str, Any]:
    """{argument: value} of the constructor arguments of the method's classes that it holds as attributes."""
    names = []
    for cls in type(method).__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or cls is object:
            continue
        for name, parameter in inspect.signature(init).parameters.items():
            if name != "self" and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) and name not in names:
                names.append(name)
    return {name: getattr(method, name) for name in names if name in vars(method)}
