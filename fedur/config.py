"""Typed settings of a fedur run. One dataclass per group; a docstring under each field is its `--help`.
The method, the pseudo-labeller and the dataset are plugins: classes whose constructor arguments are their
settings (fedur/main.py adds them to the parser).

Config stops here: the entry point and the round loop read these objects and pass plain values on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from jsonargparse.typing import (
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
)

from fedur import channel
from fedur.channel import AdversaryConfig, AggregatorConfig, ClockConfig, ServerConfig, Stages
from fedur.errors import ConfigError

# The annotations are the CLI's validation and show in --help: a value outside its range stops the
# run at parse time with the key and the restriction.
if TYPE_CHECKING:
    from fedur.data.datasets import Dataset
    from fedur.labels.base import Labeller
    from fedur.methods.base import Method

from fedur.evaluation.estimators import DEFAULT as DEFAULT_ESTIMATOR  # noqa: E402
from fedur.evaluation.estimators import Estimator  # noqa: E402
from fedur.ranges import Fraction, LossRate  # noqa: E402  (shared with the plugins' arguments)


@dataclass
class ModelConfig:
    """The frozen CLIP backbone and the learnable prompts."""

    name: str = "ViT-B-32"
    """open_clip model name (ViT-B-32, ViT-B-16, ...), or the file stem of `model.config_file`."""
    pretrained: str | None = "openai"
    """Weights: an open_clip pretrained tag (downloaded from the hub when online), a local checkpoint
    file (.pt/.bin/.safetensors), `fedur` for the weights fedur ships (model.name=fedur-demo), or null
    for a seeded random init."""
    config_file: str | None = None
    """Local open_clip model-config JSON for a custom architecture; its file stem becomes a model name."""
    cache_dir: str | None = None
    """Where downloaded weights are cached (default: the Hugging Face cache)."""
    n_ctx: NonNegativeInt = 16
    """Learnable text context vectors (CoOp: one context for all classes, the class name at the end); whether a
    client's stays its own or is averaged is the method's to say (FedUR: its own). 0 disables the text prompt."""
    ctx_init_std: NonNegativeFloat = 0.02
    """Standard deviation of the N(0, std^2) init of both prompts."""
    ctx_suffix: str = ""
    """Fixed words between the text context and the class name in every class prompt, "[SOS] ctx <words> <class>."
    (MaPLe's published prompts: a 2-vector context from "a photo", then "of a" fixed); empty: none (CoOp's)."""
    visual_tokens: NonNegativeInt = 5
    """Deep visual prompt tokens appended after the patch tokens at each prompted block; whether they are averaged
    is the method's to say (FedUR: averaged). 0 disables the visual prompt."""
    visual_depth: PositiveInt | None = None
    """Prompted blocks, counted from the first; null means all blocks but the last (11 for ViT-B)."""
    shared_prefix_text: bool = True
    """Text tower: encode the start token and the context once for all classes (they are the same for every
    class under the causal mask) and only the class tokens per class. Exact up to float rounding; 3-6x less
    text-tower work for ViT-B/32 at 10-200 classes (docs/performance.md). false: every class in full. A text tower
    without a causal mask (SigLIP's) always computes every class in full."""
    checkpointing: bool = False
    """Activation checkpointing of the prompted towers: in a training step each block's activations are recomputed in
    the backward pass instead of kept (the same values and gradients; a big backbone's step in a fraction of the
    memory, for one more forward of each block: docs/backbones.md)."""


@dataclass
class DataConfig:
    """How the dataset's images are prepared for the clients (which dataset: `dataset`, with its own options)."""

    classnames_file: str | None = None
    """Optional text file with one class name per line, in label order (for ImageFolder: the sorted class
    folders); replaces the dataset's own class names."""
    template: str | None = None
    """Zero-shot prompt template with one `{}` (default: the dataset's, 'a photo of a {}.')."""
    train_fraction: Fraction = 1.0
    """Keep this stratified, seeded fraction of the train split (for quick experiments)."""
    test_fraction: Fraction = 1.0
    """Keep this stratified, seeded fraction of the test split."""
    cache: bool = True
    """Decode every image once into a memory-mapped uint8 cache at the model's input resolution and
    train from it (no JPEG decoding or resizing per epoch)."""
    cache_dir: str | None = None
    """Where the decoded-image cache lives (null: $FEDUR_CACHE_DIR, else ~/.cache/fedur); shared by later
    runs and every rank."""
    corrupt_images: Literal["stop", "skip"] = "stop"
    """An image that cannot be decoded stops the run with its path ('stop'), or is left out and counted in
    the run's summary ('skip')."""
    num_workers: NonNegativeInt = 2
    """DataLoader worker processes per rank (0 decodes in the main process)."""
    validation_fraction: LossRate = 0.0
    """Set this share of each client's train images aside as its label-free validation split (at least one image per
    client when above 0): never trained on nor pseudo-labelled, drawn from the client's own random stream (the same
    whichever rank hosts it), named in partition.json's validation_ids (a split file may name it instead). Each client's
    accuracy is then estimated on it, and evaluation.select label_free chooses on it (docs/label-free.md). 0: none;
    the estimates read the test images' logits that the evaluation computes anyway."""
    feature_cache: bool = True
    """Compute what the frozen image tower gives every image once, into a memory-mapped float32 cache beside the image
    cache (per split, model and preprocess), and read it wherever the tower runs without a prompt: the zero-shot
    passes, and every pass of a method whose tower carries none (docs/performance.md). The same results within float
    rounding (features computed in other batches); false runs the tower on every pass."""


@dataclass
class FederationConfig:
    """Clients, rounds and how the data is split among the clients."""

    num_clients: PositiveInt = 10
    """Number of clients K (the paper: 10; 5 for CUB and UCF101). With fewer clients than ranks, the
    spare ranks host none and still take part in every exchange."""
    rounds: PositiveInt = 20
    """Communication rounds R."""
    local_epochs: PositiveInt = 10
    """Local epochs per round."""
    refresh_every: PositiveInt = 5
    """Pseudo-labels are recomputed every this many rounds (round 0 with zero-shot CLIP)."""
    partition: Literal["dirichlet", "quantity", "domain", "domain_dirichlet", "iid", "clients", "file"] = "dirichlet"
    """How the data is split across clients: Dirichlet label skew (one draw per class shared by train and
    test), quantity-based label skew (each client holds `class_fraction` of the classes), feature skew (one
    client per domain), domain + Dirichlet (each domain split over `clients_per_domain` clients), IID; or
    not drawn: each client's own folder (`clients`, dataset ClientFolders) or the split in
    `federation.partition_file` (`file`). With clients and file, num_clients is the number of clients the
    folders or the file hold."""
    partition_file: str | None = None
    """federation.partition=file: a JSON or CSV naming each client's images, e.g. an earlier run's
    partition.json (docs/own-data.md gives the format)."""
    beta: PositiveFloat = 0.1
    """Dirichlet concentration; smaller means more skew (the paper: 0.1 and 0.05)."""
    class_fraction: Fraction = 0.2
    """Quantity skew: share of the classes each client holds; each class goes to int(class_fraction * K) clients."""
    clients_per_domain: PositiveInt = 3
    """domain_dirichlet: clients per domain (the paper: 3 or 5); num_clients must equal it times the domains."""
    min_train_per_client: PositiveInt = 10
    """Every client must hold at least this many train images (the Dirichlet split is redrawn until it
    does; the other splits refuse to start)."""
    join_rate: Fraction = 1.0
    """Fraction of clients that train in a round, sampled uniformly per round (1.0: all clients)."""
    partition_seed: int | Literal["reference"] = "reference"
    """Seed of the split across clients. 'reference' replays the reference code's random sequence for the
    dataset (FedCoPL reseeds NumPy with 500 before it partitions, so the paper's three seeds share one
    partition); an integer draws a partition of its own (e.g. the run seed for a per-seed partition)."""


@dataclass
class EvaluationConfig:
    """What is tested, beside each client's accuracy on its own test set (docs/protocols.md)."""

    global_model: bool = True
    """Also test the server's model (the method's `global_model`) on the union of the training clients' test
    sets every round: metrics.jsonl's global_accuracy, and dual_accuracy, the harmonic mean with the personal
    mean."""
    new_clients: NonNegativeFloat = 0
    """Clients held out of every round (the last ids of the split): a count (an integer >= 1) or a fraction of
    federation.num_clients (below 1, rounded, at least one). They never upload or pseudo-label; every round
    they receive the shared pieces and are tested as they arrive, and after the last round each adapts alone
    on its own train images (its labeller, evaluation.new_client_epochs local epochs, nothing sent back) and
    is tested again."""
    new_client_epochs: PositiveInt | None = None
    """Local epochs of a new client's adaptation (one cosine cycle of optim.lr); null: federation.local_epochs."""
    new_client_labels: Literal["arrival", "zero_shot"] = "arrival"
    """A new client's pseudo-labels for its adaptation: from the model it arrives with (the shared pieces,
    its personal ones at their initial values) or from zero-shot CLIP, as the training clients' first
    refresh [guess]."""
    base_to_novel: bool = False
    """Base-to-novel: the first half of the classes (rounded up) are base; clients train and pseudo-label only
    on base images with the base names (the personal protocol tests base), and the server's model is tested
    every round on the novel images with the novel names (novel_accuracy; base_novel_harmonic, the harmonic
    mean of the two)."""
    membership_attack: bool = False
    """After the last round, attack the run's models and histograms as `fedur-attack RUN` does (RUN/attack/;
    docs/privacy-attacks.md). One rank only: a run on several ranks says to run fedur-attack after it."""
    held_out_domain: str | None = None
    """Leave-one-domain-out: this domain's images are held out of training (a dataset with domains; the clients
    split the others, e.g. federation.partition domain_dirichlet) and the server's model is tested on its test
    images every round (held_out_domain_accuracy)."""
    estimator: Estimator = DEFAULT_ESTIMATOR
    """How each client's accuracy is estimated from the logits of its unlabelled images (docs/label-free.md):
    confidence (the mean top-1 softmax probability), entropy (1 - the mean normalised entropy), agreement_zero_shot or
    agreement_server (the share of images on which the model agrees with zero-shot CLIP or the server's model),
    dispersity (the prediction matrix's normalised nuclear norm) or mano (MaNo's normalised 4-norm). Every estimator is
    recorded every round (metrics.jsonl's estimated_accuracy); this one is shown on the round line and chooses."""
    select: Literal["none", "label_free"] = "none"
    """label_free: each client keeps, among zero-shot CLIP, its personal model and the server's model after every round,
    the one evaluation.estimator rates highest on its validation split (data.validation_fraction > 0); the run keeps its
    pieces (prompts/chosen/) and summary.json's label_free_choice says which, with its true accuracy where labels exist
    beside the final model's and the best choice's. none: the final models only."""


def new_client_count(new_clients: float, num_clients: int) -> int:
    """How many clients evaluation.new_clients holds out of `num_clients`: a count as given, a fraction (< 1) of
    them rounded half up, at least one. Raises a ConfigError when it is not a whole count or leaves none to train."""
    if new_clients >= 1:
        if new_clients != int(new_clients):
            raise ConfigError(f"evaluation.new_clients={new_clients:g}: a count must be a whole number (a fraction is below 1)")
        count = int(new_clients)
    else:
        count = 0 if new_clients == 0 else max(1, int(new_clients * num_clients + 0.5))
    if count >= num_clients:
        raise ConfigError(f"evaluation.new_clients={new_clients:g} holds out {count} of federation.num_clients={num_clients}: "
                         "at least one client must train")
    return count


@dataclass
class OptimConfig:
    """Local prompt tuning: SGD with a cosine schedule over one pseudo-label period."""

    lr: PositiveFloat = 0.1
    """Peak learning rate; cosine-decayed over refresh_every * local_epochs epochs, restarting at each refresh
    (optim.schedule)."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """The learning rate over a pseudo-label period: cosine decay from optim.lr, restarting at each refresh
    (FedUR's and FedCoPL's), or constant (FedOTP's released scripts: StepLR with gamma 1)."""
    momentum: NonNegativeFloat = 0.9
    """SGD momentum."""
    weight_decay: NonNegativeFloat = 0.05
    """SGD weight decay."""
    batch_size: PositiveInt = 64
    """Local training batch size."""
    eval_batch_size: PositiveInt = 256
    """Batch size for pseudo-labelling and evaluation."""
    optimizer_state: Literal["reset", "client", "shared"] = "reset"
    """SGD momentum: fresh for every client every round ('reset'), kept by each client across rounds
    ('client'), or carried from client to client in id order like the reference code ('shared'; one rank only)."""
    cosine_epochs: PositiveInt | None = None
    """With optim.schedule cosine, its half-period T in local epochs, counted from the run's first round and never
    restarted: torch's CosineAnnealingLR(T_max=T) stepped once per local epoch, which falls to 0 over T epochs and
    rises back over the next T (PromptFolio's released code: T = 5). null: one cosine over each pseudo-label period
    (refresh_every x local_epochs epochs), restarting at each refresh (FedUR's)."""
    warmup_epochs: NonNegativeInt = 0
    """The run's first local epochs (each client's, counted from the first round) at optim.warmup_lr; a schedule
    that is never restarted (optim.cosine_epochs) starts after them (Dassl's constant warm-up: PromptFolio's 1)."""
    warmup_lr: PositiveFloat = 1e-5
    """The learning rate of the warm-up epochs (optim.warmup_epochs; Dassl's WARMUP_CONS_LR)."""


@dataclass
class PrivacyConfig:
    """Client-level differential privacy (docs/privacy.md): each taking-part client's update of its shared pieces
    (the difference from what it downloaded) and its messages clipped together to an L2 norm, Gaussian noise on
    them, and each refresh's pseudo-label histograms released through the Gaussian mechanism; every release is
    composed by an accountant (dp-accounting's RDP), and epsilon at privacy.delta is reported every round."""

    mode: Literal["none", "central", "local"] = "none"
    """none: no clipping, no noise (bitwise the results without privacy). central: the ranks are trusted and what
    they release is private: the noised mean of the clipped updates, std noise_multiplier x clip on the sum
    (DP-FedAvg, McMahan et al. 2018), becomes every taking-part client's upload. local: each upload carries its
    own noise of std noise_multiplier x clip before it leaves the client's rank (each client accounted alone)."""
    noise_multiplier: NonNegativeFloat | Literal["calibrate"] = 1.0
    """z: the std of the Gaussian noise on the clipped updates in units of privacy.clip. calibrate: the smallest z
    (to 0.1%) whose federation.rounds rounds stay within privacy.target_epsilon (the histograms' z_h the same, unless
    privacy.histogram_noise is set)."""
    clip: PositiveFloat = 0.1
    """C: the L2 norm each client's update (its shared pieces' change and its messages, together) is clipped to;
    with privacy.adaptive_clip, the starting value."""
    adaptive_clip: bool = False
    """central: C follows the target quantile of the update norms (Andrew et al. 2021): C <- C exp(-clip_lr (b - q)),
    b the noised fraction of updates within C; the noise is split so that the round still costs one Gaussian
    mechanism of multiplier noise_multiplier."""
    target_quantile: Fraction = 0.5
    """Adaptive clipping's target fraction q of the updates within C."""
    clip_lr: PositiveFloat = 0.2
    """Adaptive clipping's geometric learning rate."""
    clipped_count_stddev: PositiveFloat | None = None
    """Adaptive clipping's noise on the count of updates within C; null: the number taking part / 20 (Andrew et al.'s
    recommendation), or where that is smaller, sqrt(10) z / 2 (the count then costs a tenth of the round's budget)."""
    histogram_noise: NonNegativeFloat | None = None
    """z_h: the noise multiplier of each refresh's pseudo-label histograms (the cooperative estimates and the
    selected counts, each clipped to privacy.histogram_bound); null: privacy.noise_multiplier."""
    histogram_bound: PositiveFloat | None = None
    """The L2 bound of one client's histogram; null: the largest client's number of train images (a client's counts
    sum to at most its images), which takes the clients' sizes as public; required with privacy.sampling poisson (a
    client added or removed could change the largest)."""
    delta: OpenUnitInterval = 1e-5
    """delta of the (epsilon, delta) guarantee the run reports."""
    target_epsilon: PositiveFloat | None = None
    """Stop before a round whose releases would take epsilon past this (null: run every round)."""
    noise_seed: int | None = None
    """The seed of the noise and of who takes part. null: drawn from the operating system's randomness at the run's
    start, broadcast to the ranks and kept in the checkpoint (a resume continues it; nobody can replay the noise).
    A fixed seed makes a private run repeatable, and its noise removable by anyone who knows it: for tests and
    reproductions, not for a guarantee."""
    accountant: Literal["rdp", "pld"] = "rdp"
    """How the releases are composed into epsilon: dp-accounting's RDP accountant (Renyi DP, Mironov 2017), or its PLD
    accountant (privacy loss distributions: tighter, slower; it prices no sampling without replacement, so it takes
    privacy.sampling poisson, or every client in every round)."""
    sampling: Literal["fixed", "poisson"] = "fixed"
    """How taking part is drawn and accounted: a fixed ceil(join_rate x K) clients without replacement (federation
    .join_rate; neighbouring federations differ in one client's data) or each client on its own with probability
    join_rate (Poisson; neighbours add or remove a client; the mean divides by the expected number)."""


@dataclass
class RunConfig:
    """Where results go and what makes the run reproducible."""

    output_dir: str | None = None
    """Run directory; must not exist or be empty unless resuming. Default: runs/<timestamp>."""
    resume: bool | str = False
    """Continue a run from its last committed round: true (the run in run.output_dir), "auto" (resume when
    run.output_dir holds a committed checkpoint, else start there; for requeued jobs), or a run directory."""
    force_resume: bool = False
    """Resume even when settings that change results differ from the checkpoint's (they are listed)."""
    keep_checkpoints: PositiveInt = 2
    """Committed round checkpoints kept in <run>/checkpoints (older ones are deleted)."""
    peer_timeout: PositiveFloat = 300.0
    """Seconds without a heartbeat from a peer rank (a dead process, a lost node) before the other ranks
    stop with an error."""
    wait_timeout: PositiveFloat = 10800.0
    """Seconds a rank waits in one collective for peers that are alive but still working (larger clients,
    building the image cache) before the run fails as stuck."""
    requeue_deadline: PositiveFloat = 60.0
    """After a requeue signal (run.requeue_on), rank 0 requeues the SLURM job at the latest this many
    seconds later, even in the middle of a round (the job is then ended and resumes from the last
    committed round). Keep it below the lead time of `#SBATCH --signal`."""
    requeue_on: list[Literal["SIGUSR1", "SIGTERM"]] = field(default_factory=lambda: ["SIGUSR1"])
    """Stop signals after which rank 0 requeues the SLURM job (SIGTERM is also what `scancel` sends)."""
    seed: int = 1
    """Seed of the prompt init, every client's data order and the train/test fractions (the paper: 1, 2, 3);
    the split across clients has its own `federation.partition_seed`."""
    clients_per_step: PositiveInt = 1
    """Run this many of a rank's clients together: fixed groups of consecutive client ids, placed whole on
    ranks, whose batches go through the method's grouped forward (one forward with each client's own prompts
    where the method has one, else one per client), in training as in pseudo-labelling and evaluation; each
    client keeps its own data order, loss, SGD momentum and schedule. 1: one client after another. The same
    results up to float rounding (and placement-free for a given value); it keeps a large GPU busy where a
    client's batches are small, and saves the fixed cost per client of many small clients."""
    threads: PositiveInt | None = None
    """CPU compute threads per rank; null: CPU cores / ranks on this node. Fix it to compare runs bitwise
    across different placements of clients on ranks."""
    deterministic: bool = True
    """Deterministic kernels only (torch.use_deterministic_algorithms, strictly; on CUDA the math attention
    kernel and a fixed cuBLAS workspace): a rerun and a resume give the same bits, also on a GPU
    (docs/checkpoints.md says what is promised). An operation without a deterministic kernel then stops the
    run naming it; false lets such operations run, and results vary in the last bits."""
    log_every_n_steps: NonNegativeInt = 0
    """Also print the local training loss every n optimizer steps (0: only per round)."""
    progress: bool = True
    """Rank 0 shows progress bars with the time left (rounds, clients, epochs, pseudo-labelling)."""
    loggers: list[Literal["tensorboard", "csv", "wandb", "mlflow"]] = field(default_factory=lambda: ["tensorboard"])
    """Where the scalars, the settings and the figures also go, on rank 0 (docs/outputs.md): TensorBoard (RUN/tensorboard),
    CSV files (RUN/csv), Weights & Biases (offline in RUN/wandb unless WANDB_MODE says otherwise) and MLflow (a file
    store in RUN/mlruns unless MLFLOW_TRACKING_URI names one); [] for the run's own files only."""
    memory_estimate: Literal["auto", "on", "off"] = "auto"
    """Estimate a client's peak memory before any compute (the model, method and batch on fake tensors, a few seconds),
    print it at the start and write it to summary.json's memory: on a GPU (auto), always (on) or never (off)."""
    figures: bool = True
    """Draw the heatmaps: the split per client and class (partition_train.png, partition_test.png), each refresh's
    selected pseudo-labels and the final confusion matrix, as PNG files and TensorBoard images. false: the numbers
    only (partition.json, metrics.jsonl, confusion.json), a few tenths of a second less per figure (sweeps of many
    short runs)."""


@dataclass
class FabricConfig:
    """Lightning Fabric settings. Leave them at "auto" under `fabric run`: its flags win."""

    accelerator: Literal["auto", "cpu", "cuda", "gpu"] = "auto"
    """Hardware accelerator."""
    devices: int | str = "auto"
    """Devices (ranks) per node."""
    num_nodes: PositiveInt = 1
    """Number of nodes."""
    strategy: str = "auto"
    """Fabric strategy (auto: ddp when there is more than one rank)."""
    precision: Literal["auto", "32-true", "bf16-mixed"] = "auto"
    """auto: bf16-mixed on CUDA, 32-true on CPU (bf16 matmuls on CPUs without AMX are 20-45x slower).
    16-mixed is refused: its one GradScaler per process would couple the clients sharing a rank."""


@dataclass
class Config:
    """A run's settings: the groups above, and the three plugins (fedur/app/cli.py adds them to the parser).

    The typed objects are the one source: `settings` (what summary.json, the checkpoints' markers and a resume's
    comparison read) and `yaml` (config.yaml) are derived from them when asked, so a value settled after parsing
    (fedur/app/settle.py: federation.num_clients, fabric.precision) is in both."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    clock: ClockConfig = field(default_factory=ClockConfig)  # how clients answer in time (fedur/channel/clock.py)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)  # clients that misbehave (fedur/channel/adversary.py)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)  # how the server combines (fedur/channel/reducer.py)
    server: ServerConfig = field(default_factory=ServerConfig)  # when the server steps (fedur/channel/server.py)
    optim: OptimConfig = field(default_factory=OptimConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    run: RunConfig = field(default_factory=RunConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    method: Method | None = None  # fedur.methods.Method: the federated method, with its own settings
    labeller: Labeller | None = None  # fedur.labels.Labeller: the pseudo-labeller (None: the method's own)
    dataset: Dataset | None = None  # fedur.data.datasets.Dataset: where the images come from, with its options
    plugins: dict = field(default_factory=dict)  # {"method": {"class_path", "init_args"} or None, ...}: as parsed

    @property
    def stages(self) -> Stages:
        """The settings of the channel's stages (fedur/channel/)."""
        return Stages({name: getattr(self, name) for name in channel.GROUPS}, self.privacy.mode)

    @property
    def settings(self) -> dict:
        """The resolved settings as plain values: each plugin as {"class_path", "init_args"} (None: none), then
        every group's fields as they are now."""
        out = {name: _plain(self.plugins.get(name)) for name in PLUGINS}
        out.update({name: _plain(asdict(getattr(self, name))) for name in GROUPS})
        return out

    def yaml(self) -> str:
        """config.yaml: the settings as YAML, which `--config` reads back as the same settings."""
        import yaml

        return yaml.safe_dump(self.settings, sort_keys=False, allow_unicode=True)


def _plain(value):
    """Plain dicts, lists, numbers and strings: a range type's value (PositiveInt, Fraction, ...) as the plain int or
    float (jsonargparse's range types would change NumPy's float32 promotion), a tuple as a list."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


GROUPS = {
    "model": ModelConfig,
    "data": DataConfig,
    "federation": FederationConfig,
    **channel.GROUPS,  # clock, adversary, server, aggregator: the channel's stages (fedur/channel/), each a field of Config
    "optim": OptimConfig,
    "evaluation": EvaluationConfig,
    "privacy": PrivacyConfig,
    "run": RunConfig,
    "fabric": FabricConfig,
}
PLUGINS = ("method", "labeller", "dataset")

# Keys that moved to a group of their own: the old key still works (on the command line, in a YAML file, in a
# checkpoint's or a summary's recorded settings) and is said once by its new name (fedur/app/cli.py).
RENAMED = {
    **{f"federation.{key}": f"clock.{key}" for key in ("drop_rate", "speeds", "speed_spread", "bandwidth", "deadline",
                                                       "deadline_unit", "late", "over_select", "min_uploads")},
    "federation.attackers": "adversary.attackers", "federation.attack": "adversary.attack",
    "federation.attack_scale": "adversary.scale",
    "federation.aggregator": "aggregator.rule", "federation.trim": "aggregator.trim",
    "federation.krum_malicious": "aggregator.krum_malicious", "federation.krum_keep": "aggregator.krum_keep",
    "federation.clip_norm": "aggregator.norm_bound",
}


def renamed(flat: dict) -> dict:
    """Flat settings {"group.key": value} with every old key (RENAMED) under its new name."""
    return {RENAMED.get(key, key): value for key, value in flat.items()}

# fedur's own settings that do not change what a run computes: a resumed run may change them freely. A plugin's
# (method.*, labeller.*, dataset.*) are its class's to say: its `result_neutral` (`neutral_settings`).
RESULT_NEUTRAL = {
    "model.cache_dir", "model.checkpointing", "run.memory_estimate", "data.num_workers", "data.cache", "data.cache_dir",
    "data.feature_cache",
    "federation.rounds", "server.steps", "server.evaluate_every", "server.evaluate_unit", "optim.eval_batch_size",
    "evaluation.global_model", "evaluation.membership_attack",
    "run.output_dir", "run.resume", "run.force_resume",
    "run.keep_checkpoints", "run.peer_timeout", "run.wait_timeout", "run.requeue_deadline", "run.requeue_on",
    "run.threads", "run.loggers", "run.clients_per_step", "run.log_every_n_steps", "run.progress", "run.figures", "fabric.accelerator",
    "fabric.devices", "fabric.num_nodes", "fabric.strategy",
}


def plugin_described(flat: dict, attribute: str) -> dict[str, object]:
    """{"<group>.<arg>": value} of what the run's plugin classes (named in the flat settings, `flat_settings`) say
    of their settings: `attribute` "added_settings" (the value runs from before an argument ran with) or
    "result_neutral" (value None)."""
    from fedur import plugins

    described = {}
    for group in PLUGINS:
        cls = plugins.by_path(group, flat.get(group))
        said = getattr(cls, attribute, None) or {}
        said = said if isinstance(said, dict) else dict.fromkeys(said)
        described.update({f"{group}.{arg}": value for arg, value in said.items()})
    return described


def flat_settings(settings: dict) -> dict:
    """{"group.key": value} of resolved settings: a plugin is "method": its class path, and "method.<arg>"
    for each of its constructor arguments."""
    flat = {}
    for group, values in settings.items():
        if group in PLUGINS:
            flat[group] = None if values is None else values.get("class_path")
            for key, value in ({} if values is None else values.get("init_args") or {}).items():
                flat[f"{group}.{key}"] = value
        elif isinstance(values, dict):
            flat.update({f"{group}.{key}": value for key, value in values.items()})
    return flat


# Settings that name a file: what changes results is the file's content, not where it lies (a data folder that
# moves with its classnames.txt resumes); a checkpoint records, and a resume compares, the content's digest.
FILE_SETTINGS = ("data.classnames_file", "federation.partition_file", "clock.speeds")
DIGEST = "sha256:"


def result_settings(settings: dict) -> dict:
    """The flat settings (`flat_settings`) that change results: what a checkpoint records and a resume compares;
    a file setting as the digest of the file's content (`file_digest`)."""
    flat = flat_settings(settings)
    neutral = RESULT_NEUTRAL | set(plugin_described(flat, "result_neutral"))
    if flat.get("privacy.mode", "none") == "none":  # privacy off: its other settings change nothing
        neutral |= {key for key in flat if key.startswith("privacy.") and key != "privacy.mode"}
    flat = {key: value for key, value in flat.items() if key not in neutral}
    for key in FILE_SETTINGS:
        if flat.get(key) is not None:
            flat[key] = file_digest(flat[key])
    return flat


def file_digest(path: str) -> str:
    """"sha256:<hex>" of the file's bytes; a file that cannot be read: its path as given (read errors are the
    data layer's to report)."""
    import hashlib
    import os

    try:
        with open(os.path.expanduser(path), "rb") as f:
            return DIGEST + hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return path
