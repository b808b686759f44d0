"""The named grids of `fedur-tables`: rows (methods) x columns (dataset, setting) x seeds, as data.

A row is a method with its pseudo-labeller (fedur's `--method` / `--labeller` flags); a column is one
config file (plus flags) and the paper cell it reproduces. Every run of a grid is
`python -m fedur.main --config <column config> <column flags> <grid flags> <row flags> <extra> --run.seed k`.
Change a grid here and nowhere else; `tests/test_tables.py` checks that every config file exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from fedur import plugins
from fedur.app.tables.paper import _TABLE1
from fedur.data.datasets import dataset_classes

CONFIGS = plugins.configs_dir()

# Value a cell shows, from summary.json: every row's final mean accuracy over clients (each client on its own
# test set; zero-shot CLIP's too); the paper's zero-shot number is CLIP on the whole test set, so the zero-shot
# row also shows that figure and compares it with the paper's (Row.paper_basis).
FINAL = "final_mean_accuracy"
ZERO_SHOT = "zero_shot_global"

# What each number a cell can show is (summary.json keys; docs/protocols.md, and Column.target's "time_to"): every table
# says which it shows.
ACCURACIES = {
    FINAL: "personal: the mean over the training clients of each one's accuracy on its own test set, with its own model",
    "final_weighted_accuracy": "personal, weighted: the same clients' test images pooled (the mean weighted by test images)",
    "final_global_accuracy": "global: the server's model (the method's global_model) on the training clients' test "
                             "images together",
    "final_dual_accuracy": "dual: the harmonic mean of personal and global",
    "final_new_client_accuracy": "new clients, as they arrive: the clients held out of every round, each with the shared "
                                 "pieces and its personal ones at their initial values, on its own test set (mean)",
    "new_client_adapted_accuracy": "new clients, adapted: the same after adapting alone on their own train images "
                                   "(their labeller, local epochs, nothing sent back)",
    "final_novel_accuracy": "novel: the server's model on the novel classes' test images, classified among the novel "
                            "names (no client saw a novel image or name)",
    "final_base_novel_harmonic": "HM: the harmonic mean of base (personal, on the base classes) and novel",
    "final_held_out_domain_accuracy": "held-out domain: the server's model on the test images of the domain no client "
                                      "holds",
    "final_domain_mean": "feature skew: each domain's accuracy as the mean over its clients, then the mean over domains",
    "attack": "fedur-attack's measurements of each run (RUN/attack/, docs/privacy-attacks.md), as each section's title says",
    "system": "who answered and when (summary.json's system, docs/system.md): the run's virtual seconds, or the uploads "
              "the server took over its rounds, as each section's title says",
    "time_to": "virtual seconds to reach a fraction of another run's final personal accuracy (Column.target): the virtual "
               "clock of the first round (or server step) whose personal accuracy reached it (metrics.jsonl), 0 where "
               "zero-shot CLIP did; a seed that never reached it is left out of the mean and marked n/a",
}


@dataclass(frozen=True)
class Row:
    key: str  # folder name and the paper.py row key
    labels: tuple[str, ...]  # the leading cells of the row in the printed table (Method, PL, ...)
    flags: tuple[str, ...]  # fedur flags of this row
    value: str = FINAL  # the summary.json key the cell shows
    paper_basis: str | None = None  # the summary.json key the paper's number compares with, when not `value`
    preset: str | None = None  # the method whose own settings the 'own' protocol adds (Column.presets/<preset>.yaml)


@dataclass(frozen=True)
class Column:
    key: str  # folder name
    label: str  # column header
    section: str  # columns with the same section form one printed table (the paper's beta = 0.1 half, ...)
    config: str  # relative to fedur's configs/ (`config_path`)
    dataset: str  # paper.py dataset key; also the folder of --data-root DIR/<dataset>
    setting: str  # paper.py setting key
    flags: tuple[str, ...] = ()
    presets: str = "presets"  # configs/<presets>/<method>.yaml: the baselines' own settings for this column
    value: str | None = None  # the summary.json key its cells show (ACCURACIES; a.b reads a nested one); None: the row's
    runs: str | None = None  # the key of the column whose runs its cells read (None: its own runs)
    target: tuple[str, float] | None = None  # (a column's key, a fraction): its cells show the virtual seconds its runs
    # took to reach that fraction of the final personal accuracy of that column's run of the same row and seed
    # (TIME_TO; None: the summary.json key `value`)
    skip_rows: tuple[str, ...] = ()  # rows whose method its backbone cannot take (docs/backbones.md): no run, no cell


@dataclass(frozen=True)
class Grid:
    name: str
    title: str
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    label_headers: tuple[str, ...]  # headers of Row.labels
    paper_tables: tuple[str, ...] = ()  # paper.py tables to look a cell up in, first hit wins
    paper_note: str = ""  # how the paper's numbers relate to these runs (e.g. a proxy)
    average: bool = False  # print an Average column per section (with the paper's own average)
    flags: tuple[str, ...] = ()  # fedur flags of every run
    uses_data_root: bool = True  # the runs read --data-root (not for generated data)
    uses_model_dir: bool = False  # the runs read the tiny-clip folder (--model-dir)
    notes: tuple[str, ...] = field(default_factory=tuple)  # printed under the table
    protocol: str = "fedur"  # "own": every row with a preset runs with it (`with_protocol`)


# fedur's own methods and labellers by key (paper.py's row keys), found from their classes (fedur/plugins.py): each
# class says its table name (`label`) and its published settings (`preset`, configs/presets/<preset>.yaml).
METHODS = plugins.by_key("method")
LABELLERS = plugins.by_key("labeller")
# Row keys -> the class fedur's --method / --labeller take.
METHOD_CLASSES = {key: cls.__name__ for key, cls in METHODS.items()}
LABELLER_CLASSES = {key: cls.__name__ for key, cls in LABELLERS.items()}
LABELLER_LABELS = {key: cls.label for key, cls in LABELLERS.items()}

# The baselines with settings of their own (configs/presets/<method>.yaml, their published ones): what the 'own'
# protocol's grids (table7-own, ...) run them with.
PRESETS = tuple(key for key, cls in METHODS.items() if cls.preset)


def preset_config(row: Row, column: Column) -> str | None:
    """The config the 'own' protocol adds for this row in this column (relative to configs/), or None."""
    return f"{column.presets}/{row.preset}.yaml" if row.preset else None


def method_row(method: str | type, labeller: str | type | None, labels: tuple[str, ...] | None = None) -> Row:
    """The row of a method (fedur's by key, or a class: a user's by its import path) with a labeller (likewise;
    None: the method's own); `labels`: the leading cells (default: the classes' `label`s, "-" for no labeller)."""
    cls = METHODS[method] if isinstance(method, str) else method
    paired = LABELLERS[labeller] if isinstance(labeller, str) else labeller
    flags = ("--method", _flag(cls)) + (("--labeller", _flag(paired)) if paired else ())
    key = cls.key + (f"+{paired.key}" if paired else "")
    return Row(key=key, labels=labels or (cls.label, paired.label if paired else "-"), flags=flags, preset=cls.preset)


def _flag(cls: type) -> str:
    """What --method / --labeller take for a class: fedur's by name, any other by its import path."""
    return cls.__name__ if cls.__module__.startswith("fedur.") else f"{cls.__module__}.{cls.__qualname__}"


ZERO_SHOT_ROW = Row("zeroshot", (METHODS["zeroshot"].label, "-"), ("--method", METHOD_CLASSES["zeroshot"]), paper_basis=ZERO_SHOT)
# The paper's FL baselines, in its row order (its Table 1's rows `<method>+<labeller>`, fedur/app/tables/paper.py).
BASELINES = tuple(dict.fromkeys(row.split("+")[0] for row in _TABLE1 if "+" in row))
BASELINE_LABELS = {key: METHODS[key].label for key in BASELINES}
# Every other method of fedur's that trains, beside the paper's two (FedCoPL, FedUR): the baselines fedur added after
# the paper's (FedPGP, FedTPG, PromptFolio, SCAFFOLD, ...; their published settings in configs/presets/). Not in the
# paper's tables, so only in the demo's and the CPU proxy's grids. A method added to fedur joins them by its class.
NEW_BASELINES = tuple(key for key, cls in METHODS.items() if cls.trains and key not in (*BASELINES, "fedur", "fedcopl"))

# Table 1 and 2's rows, in the paper's order; GDA-U (training-free, cited by the paper but not in its tables)
# is fedur's addition, below zero-shot CLIP.
FEDCOPL_ROW = method_row("fedcopl", None, (METHODS["fedcopl"].label, LABELLER_LABELS["copl"]))  # its own labeller
FEDUR_ROW = method_row("fedur", None, (METHODS["fedur"].label, LABELLER_LABELS["codpl"]))
PAPER_ROWS = (
    ZERO_SHOT_ROW,
    method_row("gdau", None, (METHODS["gdau"].label, "EM")),
    *(method_row(m, pl) for m in BASELINES for pl in ("fpl", "cpl")),
    FEDCOPL_ROW,
    FEDUR_ROW,
)

# Table 7 (the FL baselines with each labeller). The paper prints 8 of these 16 rows: each baseline with
# its better labeller of Table 1 and with CoDPL; FPL and CPL rows take their numbers from Table 1.
LABELLER_ROWS = tuple(method_row(m, pl) for m in BASELINES for pl in ("fpl", "cpl", "copl", "codpl"))

# The demo's and the proxy's Table 1 and Table 7 rows: the paper's, with NEW_BASELINES after its baselines (FPL and
# CPL in Table 1, every labeller in Table 7), as the paper's baselines have them.
EXTENDED_PAPER_ROWS = (
    *PAPER_ROWS[:-2],
    *(method_row(m, pl) for m in NEW_BASELINES for pl in ("fpl", "cpl")),
    *PAPER_ROWS[-2:],
)
ALL_LABELLER_ROWS = (*LABELLER_ROWS,
                     *(method_row(m, pl) for m in NEW_BASELINES for pl in ("fpl", "cpl", "copl", "codpl")))

# Table 6: (key, data selection, confidence filter, entropy filter, class weights, negatives), as the
# paper's check marks print them. Rows 1-4 keep Weighted and Negative on (the paper's ticks); row 5,
# with neither, is FedCoPL.
ABLATION = (
    ("no-selection", False, False, False, True, True),
    ("selection", True, False, False, True, True),
    ("sel+entropy", True, False, True, True, True),
    ("sel+confidence", True, True, False, True, True),
    ("fedcopl", True, True, True, False, False),
    ("fedcopl+neg", True, True, True, False, True),
    ("fedcopl+weight", True, True, True, True, False),
    ("fedur", True, True, True, True, True),
)


def ablation_row(key: str, selection: bool, confidence: bool, entropy: bool, weighted: bool, negative: bool) -> Row:
    tick = {True: "✓", False: "–"}
    flags = (
        "--method", "FedUR", "--labeller", "CoDPL",
        "--labeller.cooperative_selection", str(selection).lower(),
        "--labeller.confidence_filter", str(confidence).lower(),
        "--labeller.entropy_filter", str(entropy).lower(),
        "--labeller.class_weights", "inv" if weighted else "none",
        "--labeller.negatives", "mass" if negative else "none",
    )
    return Row(key, tuple(tick[v] for v in (selection, confidence, entropy, weighted, negative)), flags)


TABLE1_DATASETS = ("dtd", "resisc45", "cub", "ucf101", "cifar10", "cifar100")
DATASET_LABELS = {key: dataset_classes()[key].label for key in TABLE1_DATASETS}  # each dataset class's own


def dirichlet_column(dataset: str, beta: str) -> Column:
    return Column(f"{dataset}-beta{beta}", DATASET_LABELS[dataset], f"Dirichlet β = {beta}",
                  f"paper/table1/{dataset}-beta{beta}.yaml", dataset, f"beta{beta}")


def quantity_column(dataset: str) -> Column:
    return Column(f"{dataset}-quantity", DATASET_LABELS[dataset], "quantity skew (20% of the classes per client)",
                  f"paper/table2/{dataset}-quantity.yaml", dataset, "quantity")


# CoOp's eleven datasets (fedur/data/coop.py, imagenet.py) in Table 1's protocol: each dataset's main config (Dirichlet
# beta 0.1, ViT-B/32; CoOp's split and template), DTD and UCF101 with CoOp's templates (fedur keeps FedCoPL's for them).
COOP_DATASETS = ("imagenet", "caltech101", "oxford_pets", "stanford_cars", "oxford_flowers", "food101", "fgvc_aircraft",
                 "sun397", "dtd", "eurosat", "ucf101")
COOP_TEMPLATES = {"dtd": "{} texture.", "ucf101": "a photo of a person doing {}."}  # CoOp's trainers/zsclip.py
COOP_COLUMNS = tuple(
    Column(f"{d}-coop", dataset_classes()[d].label, "CoOp's datasets, Dirichlet β = 0.1 (ViT-B/32)", f"{d}.yaml", d, "beta0.1",
           flags=("--data.template", COOP_TEMPLATES[d]) if d in COOP_TEMPLATES else ())
    for d in COOP_DATASETS
)
COOP_NOTE = ("CoOp's eleven datasets with CoOp's splits, class names and templates (docs/datasets.md), each dataset's main "
             "config: 10 clients (UCF101's 5), Dirichlet β = 0.1, 20 rounds x 10 local epochs. The paper reports none of "
             "them.")

# Backbone families (docs/backbones.md) in Table 1's protocol on CIFAR10 (β = 0.1): (open_clip model, pretrained tag,
# label, what its towers take: tests/test_tables.py checks each against the model's skeleton). A row whose method needs
# what a backbone does not take (FedUR's visual prompts on RN50, FedOTP's patch tokens on SigLIP) has no cell there.
_ALL = frozenset({"text prompts", "deep text prompts", "visual prompts", "patch tokens"})
BACKBONES = (
    ("ViT-B-32", "openai", "OpenAI ViT-B/32", _ALL),
    ("ViT-B-32", "metaclip_fullcc", "MetaCLIP ViT-B/32", _ALL),
    ("ViT-B-16-quickgelu", "dfn2b", "DFN ViT-B/16", _ALL),
    ("ViT-B-16-SigLIP", "webli", "SigLIP ViT-B/16", _ALL - {"patch tokens"}),
    ("ViT-B-16-SigLIP2", "webli", "SigLIP 2 ViT-B/16", _ALL - {"patch tokens"}),
    ("EVA02-B-16", "merged2b_s8b_b131k", "EVA02 ViT-B/16", _ALL),
    ("PE-Core-B-16", "meta", "PE-Core B/16", _ALL - {"patch tokens"}),
    ("RN50", "openai", "OpenAI RN50", _ALL - {"visual prompts"}),
)


def backbone_column(name: str, tag: str, label: str, takes: frozenset[str], rows: tuple[Row, ...]) -> Column:
    from fedur.methods.backbones import method_needs

    skip = tuple(r.key for r in rows if not method_needs(METHODS[r.key.split("+")[0]](), 5) <= takes)
    return Column(f"cifar10-{name.lower()}-{tag}", label, "backbones: CIFAR10, Dirichlet β = 0.1", "cifar10.yaml", "cifar10",
                  "beta0.1", flags=("--model.name", name, "--model.pretrained", tag), skip_rows=skip)


BACKBONE_NOTE = ("CIFAR10's main config (10 clients, Dirichlet β = 0.1) on each backbone family with its open_clip weights; "
                 "an empty cell: the method needs what the backbone's towers do not take (docs/backbones.md). The paper reports "
                 "ViT-B/32 (Table 1) and ViT-B/16 (Table 8) only.")


# Figure 3: the paper sweeps the number of clients (top row) and the joining rate (bottom row) on
# UCF101, RESISC45, CIFAR10 and CIFAR100 at beta 0.1, but prints no values. These are guesses: K in
# {5, 10, 20, 50, 100} with every client joining, and join rates {0.1, 0.2, 0.5} with the paper's 10
# clients (join rate 1.0 is the K = 10 column), on CIFAR10 only (add datasets to FIGURE3_DATASETS).
FIGURE3_DATASETS = ("cifar10",)
FIGURE3_CLIENTS = (5, 10, 20, 50, 100)
FIGURE3_JOIN_RATES = (0.1, 0.2, 0.5)


def figure3_columns(dataset: str, config: str | None = None, clients: tuple[int, ...] = FIGURE3_CLIENTS,
                    rates: tuple[float, ...] = FIGURE3_JOIN_RATES, joining_of: int = 10, label: str | None = None,
                    presets: str = "presets") -> tuple[Column, ...]:
    """Figure 3's columns on one dataset: K clients all joining, and `rates` of `joining_of` clients joining."""
    config = config or f"paper/table1/{dataset}-beta0.1.yaml"
    name = label or DATASET_LABELS[dataset]
    by_clients = tuple(
        Column(f"{dataset}-clients{k}", f"K={k}", f"{name}, number of clients (all join)", config, dataset,
               f"clients{k}", ("--federation.num_clients", str(k), "--federation.join_rate", "1.0"), presets)
        for k in clients
    )
    by_rate = tuple(
        Column(f"{dataset}-join{r}", f"join {r}", f"{name}, joining rate ({joining_of} clients)", config, dataset,
               f"join{r}", ("--federation.num_clients", str(joining_of), "--federation.join_rate", str(r)), presets)
        for r in rates
    )
    return by_clients + by_rate


PROXY_CONFIG = "proxy/cifar10-tinyclip.yaml"
PROXY_COLUMN = Column("cifar10-tinyclip", "CIFAR10 (tiny-clip proxy)", "CPU proxy: tiny-clip on CIFAR10 JPEGs, Dirichlet β = 0.1",
                      PROXY_CONFIG, "cifar10", "beta0.1")
PROXY_NOTE = ("proxy: the paper's number is ViT-B/32 CLIP on CIFAR10 beta 0.1 (full schedule); these runs use the "
              "8M-parameter tiny-clip on a 5% sample for 10 short rounds. Compare orderings and gaps, not values.")

DEMO_COLUMN = Column("demo", "demo", "demo: fedur-demo on ten generated shapes, 4 clients, Dirichlet β = 0.5, 5 rounds",
                     "smoke.yaml", "synthetic", "demo", presets="presets/demo")
DEMO_FLAGS = ("--federation.partition_seed", "{seed}")  # a demo of its own per seed, as benchmarks/demo_learning.py
DEMO_NOTE = ("demo: configs/smoke.yaml, offline in seconds per run; each seed draws its own images and split. No paper "
             "numbers: compare the methods' order and gaps.")

# Figure 3 on the demo: 2, 4 (the demo's) and 8 clients, and 8 clients of which a quarter or a half join.
DEMO_FIGURE3_COLUMNS = figure3_columns("demo", "smoke.yaml", (2, 4, 8), (0.25, 0.5), 8, "demo", "presets/demo")

# The evaluation protocols on the demo (docs/protocols.md): every method with its own labeller. Each protocol's
# columns read one run per row and seed (Column.runs), each showing another of its numbers (Column.value).
PROTOCOL_METHODS = (*BASELINES, *NEW_BASELINES)


def own_row(method: str) -> Row:
    """A method with its own pseudo-labeller, labelled with both."""
    cls = METHODS[method]
    labeller = cls().default_labeller()
    return method_row(method, None, (cls.label, labeller.label if labeller is not None else "-"))


PROTOCOL_ROWS = (ZERO_SHOT_ROW, PAPER_ROWS[1], *(own_row(m) for m in PROTOCOL_METHODS), FEDCOPL_ROW, FEDUR_ROW)


def reading(owner: Column, key: str, label: str, value: str) -> Column:
    """A column showing `value` of `owner`'s runs."""
    return replace(owner, key=f"{owner.key}-{key}", label=label, value=value, runs=owner.key)


DEMO_PROTOCOLS = Column("demo-protocols", "personal", "demo with a 5th client held out (evaluation.new_clients 1)",
                        "smoke.yaml", "synthetic", "demo-protocols",
                        ("--federation.num_clients", "5", "--evaluation.new_clients", "1"), "presets/demo")
DEMO_PROTOCOL_COLUMNS = (
    DEMO_PROTOCOLS,
    reading(DEMO_PROTOCOLS, "weighted", "personal (weighted)", "final_weighted_accuracy"),
    reading(DEMO_PROTOCOLS, "global", "global", "final_global_accuracy"),
    reading(DEMO_PROTOCOLS, "dual", "dual", "final_dual_accuracy"),
    reading(DEMO_PROTOCOLS, "arrival", "new client, arriving", "final_new_client_accuracy"),
    reading(DEMO_PROTOCOLS, "adapted", "new client, adapted", "new_client_adapted_accuracy"),
)
DEMO_B2N = Column("demo-base2novel", "base", "demo, base-to-novel: circle ... cross trained, ring ... wave novel",
                  "smoke.yaml", "synthetic", "demo-base2novel", ("--evaluation.base_to_novel", "true"), "presets/demo")
DEMO_B2N_COLUMNS = (DEMO_B2N, reading(DEMO_B2N, "novel", "novel", "final_novel_accuracy"),
                    reading(DEMO_B2N, "hm", "HM", "final_base_novel_harmonic"))
DEMO_DOMAINS = ("photo", "sketch", "mosaic")  # configs/demo-domains.yaml's
DEMO_LODO_COLUMNS = tuple(
    Column(f"demo-lodo-{d}", d, "demo with domains, leave one domain out: the held-out domain's test images",
           "demo-domains.yaml", "synthetic_domains", f"lodo-{d}", ("--evaluation.held_out_domain", d), "presets/demo",
           value="final_held_out_domain_accuracy") for d in DEMO_DOMAINS)
DEMO_SKEW = Column("demo-domains-mean", "mean", "demo with domains, feature skew: 3 domains x 2 clients (Dirichlet within)",
                   "demo-domains.yaml", "synthetic_domains", "domains", ("--federation.num_clients", "6"), "presets/demo",
                   value="final_domain_mean")
DEMO_SKEW_COLUMNS = (*(reading(DEMO_SKEW, d, d, f"final_domain_accuracy.{d}") for d in DEMO_DOMAINS), DEMO_SKEW)
PROTOCOL_NOTE = ("demo: configs/smoke.yaml (configs/demo-domains.yaml with domains), every method with its own "
                 "pseudo-labeller; what each column shows is said above the table (docs/protocols.md).")

TABLE1_NOTES = ("Table 1: ViT-B/32, Dirichlet label skew; 10 clients (5 for CUB and UCF101), 20 rounds x 10 local epochs.",)

# Privacy against utility on the demo (docs/privacy.md): every method with its own labeller and its demo preset, at
# epsilon 1, 4 and 16 (delta 1e-5; z calibrated to each, privacy.noise_multiplier calibrate) under central and local
# privacy, and without. C is the demo's median update norm (0.03; benchmarks/results/privacy/demo-privacy.md). Each
# run is attacked after it finishes (evaluation.membership_attack): the AUC columns read RUN/attack/.
PRIVACY_METHODS = ("fedur", "fedcopl", "promptfl", *(("dpfpl",) if "dpfpl" in METHODS else ()))
# DP-FPL also with its own local noise on (z_l 2.65: the original's epsilon 0.4 by its closed form, fedur/methods/dpfpl.py)
PRIVACY_ROWS = (*(own_row(m) for m in PRIVACY_METHODS),
                *((replace(own_row("dpfpl"), key="dpfpl-local-noise", labels=("DP-FPL, local noise 2.65", "FPL"),
                           flags=(*own_row("dpfpl").flags, "--method.local_noise", "2.65")),) if "dpfpl" in METHODS else ()))
PRIVACY_EPSILONS = (1, 4, 16)
PRIVACY_CLIP = "0.03"


def privacy_column(mode: str, epsilon: int | None) -> Column:
    """The demo with privacy.mode `mode` calibrated to `epsilon` (None: privacy off)."""
    flags = ("--evaluation.membership_attack", "true")
    if epsilon is None:
        return Column("demo-privacy-none", "none", "personal accuracy", "smoke.yaml", "synthetic", "privacy-none", flags,
                      "presets/demo")
    flags += ("--privacy.mode", mode, "--privacy.noise_multiplier", "calibrate", "--privacy.target_epsilon", str(epsilon),
              "--privacy.clip", PRIVACY_CLIP)
    return Column(f"demo-privacy-{mode}-eps{epsilon}", f"{mode} ε={epsilon}", "personal accuracy", "smoke.yaml",
                  "synthetic", f"privacy-{mode}-{epsilon}", flags, "presets/demo")


PRIVACY_OWNERS = (privacy_column("none", None), *(privacy_column(mode, eps) for mode in ("central", "local")
                                                  for eps in PRIVACY_EPSILONS))
PRIVACY_COLUMNS = (
    *PRIVACY_OWNERS,
    *(replace(reading(c, "global", c.label, "final_global_accuracy"), section="global accuracy") for c in PRIVACY_OWNERS),
    *(replace(reading(c, "auc", c.label, "attack.server_auc"), section="membership inference AUC, the server's model")
      for c in PRIVACY_OWNERS),
    *(replace(reading(c, "auc-personal", c.label, "attack.personal_auc"),
              section="membership inference AUC, the personal models (mean)") for c in PRIVACY_OWNERS),
    *(replace(reading(c, "histogram-tv", c.label, "attack.histogram_tv"),
              section="histogram attack: the server's estimate of a client's class shares, total variation from the truth "
                      "(mean over clients; higher: less learnt)") for c in PRIVACY_OWNERS),
)
PRIVACY_NOTE = ("demo: configs/smoke.yaml (4 clients, 5 rounds), each method with its demo preset; privacy at delta 1e-5, "
                "C = 0.03, z calibrated to the epsilon of the column (docs/privacy.md); the AUC is fedur-attack's loss "
                "attack, members (train images) against non-members (test images), 0.5 = nothing learnt.")

# Clients that drop and lag on the demo (docs/system.md): every client's speed lognormal (spread 1) and a median upload
# bandwidth of 2000 bytes per virtual second (FedUR's 3840-byte upload: about 2 s, beside 6-10 local steps), then
# uploads lost, a deadline at 0.8 x the round's median time (late uploads dropped, or the partial work taken), and
# over-selection (half the clients wanted, 3 of 4 asked, the first 2 taken). Each column with its virtual time.
SYSTEM_METHODS = ("fedur", "fedcopl", "promptfl")
SYSTEM_BASE = ("--clock.speeds", "lognormal", "--clock.bandwidth", "2000")
SYSTEM_SETTINGS = (
    ("all", "all answer", ()),
    ("drop20", "20% lost", ("--clock.drop_rate", "0.2")),
    ("drop50", "50% lost", ("--clock.drop_rate", "0.5")),
    ("deadline-drop", "deadline 0.8, drop", ("--clock.deadline", "0.8")),
    ("deadline-partial", "deadline 0.8, partial", ("--clock.deadline", "0.8", "--clock.late", "partial")),
    ("join50", "join 0.5", ("--federation.join_rate", "0.5")),
    ("over-select", "join 0.5, over-select", ("--federation.join_rate", "0.5", "--clock.over_select", "0.5")),
)
SYSTEM_PREFIX = "system-"  # Column.setting of the runs drawn against virtual time (fedur/app/tables/figures.py)
SYSTEM_OWNERS = tuple(Column(f"demo-system-{key}", label, "personal accuracy", "smoke.yaml", "synthetic", f"{SYSTEM_PREFIX}{key}",
                             (*SYSTEM_BASE, *flags), "presets/demo") for key, label, flags in SYSTEM_SETTINGS)
SYSTEM_COLUMNS = (
    *SYSTEM_OWNERS,
    *(replace(reading(c, "global", c.label, "final_global_accuracy"), section="global accuracy") for c in SYSTEM_OWNERS),
    *(replace(reading(c, "virtual", c.label, "system.virtual_seconds"), section="virtual seconds, the whole run")
      for c in SYSTEM_OWNERS),
    *(replace(reading(c, "taken", c.label, "system.accepted_uploads"), section="uploads taken, of the run's rounds")
      for c in SYSTEM_OWNERS),
)
SYSTEM_NOTE = ("demo: configs/smoke.yaml (4 clients, 5 rounds), each method with its demo preset; speeds lognormal "
               "(spread 1), bandwidth 2000 B/s median; a deadline in units of the round's median asked-client time.")

# Attacks against aggregators on the demo (docs/system.md): one attacker of the 4 clients (drawn per run from the
# seed), each attack at its default size, under FedAvg (mean) and each robust rule in Flower's definition; the
# trimmed mean cuts one upload at each end (trim 0.25: Flower's 0.2 of 4 cuts none), Krum assumes the one attacker.
# Asynchronous servers on the demo (docs/asynchronous.md): at lognormal speed spreads 0.5, 1 and 2 (bandwidth 2000 B/s
# median, as the system grid's), the synchronous server waiting for every client or for 0.8 x the round's median time
# (taking the late ones' partial work), FedBuff with buffers of 2 and 3 of the 4 clients training at once, and FedAsync;
# every asynchronous run applies as many client updates as the 5 synchronous rounds (server.steps' default). Each
# column's accuracy, the virtual seconds it took to reach 95% of the synchronous (all wait) run's final accuracy, and
# the virtual seconds of the whole run.
ASYNC_SPREADS = ("0.5", "1", "2")
ASYNC_SERVERS = (
    ("sync", "sync, all wait", ()),
    ("deadline", "sync, deadline 0.8 partial", ("--clock.deadline", "0.8", "--clock.late", "partial")),
    ("fedbuff2", "FedBuff, buffer 2", ("--server.mode", "fedbuff", "--server.buffer", "2")),
    ("fedbuff3", "FedBuff, buffer 3", ("--server.mode", "fedbuff", "--server.buffer", "3")),
    ("fedasync", "FedAsync", ("--server.mode", "fedasync")),
)
ASYNC_TARGET = 0.95


def async_column(spread: str, key: str, label: str, flags: tuple[str, ...]) -> Column:
    """The demo at lognormal speed spread `spread` under the server `key` (ASYNC_SERVERS)."""
    return Column(f"demo-async-s{spread}-{key}", label, f"personal accuracy, speed spread {spread}", "smoke.yaml",
                  "synthetic", f"{SYSTEM_PREFIX}async-s{spread}-{key}",
                  ("--clock.speeds", "lognormal", "--clock.speed_spread", spread, "--clock.bandwidth", "2000", *flags),
                  "presets/demo")


def async_readings(spread: str) -> tuple[Column, ...]:
    """The time to 95% of the synchronous run's final accuracy, and the whole run's virtual seconds, at `spread`."""
    owners = [async_column(spread, *server) for server in ASYNC_SERVERS]
    synchronous = owners[0].key
    return (*(replace(reading(c, "to95", c.label, "time_to"), target=(synchronous, ASYNC_TARGET),
                      section=f"virtual seconds to 95% of the synchronous run's final accuracy, speed spread {spread}")
              for c in owners),
            *(replace(reading(c, "virtual", c.label, "system.virtual_seconds"),
                      section=f"virtual seconds, the whole run, speed spread {spread}") for c in owners))


ASYNC_COLUMNS = (*(async_column(s, *server) for s in ASYNC_SPREADS for server in ASYNC_SERVERS),
                 *(c for s in ASYNC_SPREADS for c in async_readings(s)))
ASYNC_NOTE = ("demo: configs/smoke.yaml (4 clients; 5 rounds, or as many client updates: 10 FedBuff steps of 2, 7 of 3, "
              "20 FedAsync steps), each method with its demo preset; speeds lognormal, bandwidth 2000 B/s median; FedBuff "
              "and FedAsync with the 4 clients training at once, FedBuff's 1 / sqrt(1 + staleness) and server lr 1, "
              "FedAsync's mixing 0.6 x the same; personal accuracy, each client with what it holds (one in flight: the "
              "version it trains from; docs/asynchronous.md).")

ROBUST_ATTACKS = ("none", "sign_flip", "scale", "gaussian", "constant", "label_flip")
ROBUST_AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "norm_clip")


def robust_column(attack: str, aggregator: str) -> Column:
    flags = ("--aggregator.rule", aggregator, "--aggregator.trim", "0.25")
    if attack != "none":
        flags += ("--adversary.attackers", "1", "--adversary.attack", attack)
    return Column(f"demo-robust-{attack}-{aggregator}", aggregator, f"attack: {attack}", "smoke.yaml", "synthetic",
                  f"robust-{attack}-{aggregator}", flags, "presets/demo")


ROBUST_COLUMNS = tuple(robust_column(a, g) for a in ROBUST_ATTACKS for g in ROBUST_AGGREGATORS)
ROBUST_NOTE = ("demo: configs/smoke.yaml (4 clients, 5 rounds), each method with its demo preset; one attacker "
               "(adversary.attackers 1) with the attack's default size (sign_flip -1 x, scale 10 x, gaussian N(0, 1), "
               "constant 1); personal accuracy (the attacker's own included).")

GRIDS: dict[str, Grid] = {
    "table1": Grid(
        "table1", "Table 1: Dirichlet label skew (ViT-B/32)", PAPER_ROWS,
        tuple(dirichlet_column(d, b) for b in ("0.1", "0.05") for d in TABLE1_DATASETS),
        ("Method", "PL"), paper_tables=("table1",), average=True, notes=TABLE1_NOTES,
    ),
    "table2": Grid(
        "table2", "Table 2: quantity-based label skew (ViT-B/32)", PAPER_ROWS,
        tuple(quantity_column(d) for d in TABLE1_DATASETS), ("Method", "PL"), paper_tables=("table2",), average=True,
    ),
    "table6": Grid(
        "table6", "Table 6: ablation, Dirichlet β = 0.1", tuple(ablation_row(*a) for a in ABLATION),
        tuple(dirichlet_column(d, "0.1") for d in TABLE1_DATASETS[:4]),
        ("Data selection", "Confidence", "Entropy", "Weighted", "Negative"), paper_tables=("table6",),
    ),
    "table7": Grid(
        "table7", "Table 7: FL baselines with each pseudo-labeller, Dirichlet β = 0.1", LABELLER_ROWS,
        tuple(dirichlet_column(d, "0.1") for d in TABLE1_DATASETS[:5]), ("Method", "PL"),
        paper_tables=("table7", "table1"),
        notes=("The paper prints each baseline with its better labeller of Table 1 and with CoDPL; the other "
               "FPL/CPL numbers come from Table 1, CoPL rows have none.",),
    ),
    "figure3": Grid(
        "figure3", "Figure 3: number of clients and joining rate (Dirichlet β = 0.1)", PAPER_ROWS[1:],
        tuple(c for d in FIGURE3_DATASETS for c in figure3_columns(d)), ("Method", "PL"),
        notes=("The paper plots Figure 3 without printing values or its x-axis ticks: the swept values here "
               "are guesses (fedur/app/tables/grids.py), and there are no paper numbers to compare with.",),
    ),
    "proxy-table1": Grid(
        "proxy-table1", "Table 1 rows on the CPU proxy (tiny-clip, CIFAR10, β = 0.1)", EXTENDED_PAPER_ROWS, (PROXY_COLUMN,),
        ("Method", "PL"), paper_tables=("table1",), paper_note=PROXY_NOTE, uses_model_dir=True, notes=(PROXY_NOTE,),
    ),
    "proxy-table7": Grid(
        "proxy-table7", "Table 7 rows on the CPU proxy (tiny-clip, CIFAR10, β = 0.1)", ALL_LABELLER_ROWS, (PROXY_COLUMN,),
        ("Method", "PL"), paper_tables=("table7", "table1"), paper_note=PROXY_NOTE, uses_model_dir=True, notes=(PROXY_NOTE,),
    ),
    "demo-table1": Grid(
        "demo-table1", "Table 1 rows on the demo (fedur-demo CLIP, generated shapes, β = 0.5)", EXTENDED_PAPER_ROWS, (DEMO_COLUMN,),
        ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(DEMO_NOTE,),
    ),
    "demo-table7": Grid(
        "demo-table7", "Table 7 rows on the demo (fedur-demo CLIP, generated shapes, β = 0.5)", ALL_LABELLER_ROWS,
        (DEMO_COLUMN,), ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(DEMO_NOTE,),
    ),
    "demo-figure3": Grid(
        "demo-figure3", "Figure 3 on the demo: number of clients and joining rate (β = 0.5)", PAPER_ROWS[1:],
        DEMO_FIGURE3_COLUMNS, ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(DEMO_NOTE,),
    ),
    "demo-protocols": Grid(
        "demo-protocols", "Personal, global, dual, new clients on the demo", PROTOCOL_ROWS, DEMO_PROTOCOL_COLUMNS,
        ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(PROTOCOL_NOTE,),
    ),
    "demo-base2novel": Grid(
        "demo-base2novel", "Base-to-novel on the demo (FedTPG's table)", PROTOCOL_ROWS,
        DEMO_B2N_COLUMNS, ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(PROTOCOL_NOTE,),
    ),
    "demo-lodo": Grid(
        "demo-lodo", "Leave-one-domain-out on the demo with domains", PROTOCOL_ROWS,
        DEMO_LODO_COLUMNS, ("Method", "PL"), average=True, flags=DEMO_FLAGS, uses_data_root=False, notes=(PROTOCOL_NOTE,),
    ),
    "demo-table3": Grid(
        "demo-table3", "Table 3's feature skew on the demo with domains",
        PROTOCOL_ROWS, DEMO_SKEW_COLUMNS, ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False,
        notes=(PROTOCOL_NOTE,),
    ),
    "demo-privacy": Grid(
        "demo-privacy", "Privacy against utility on the demo", PRIVACY_ROWS, PRIVACY_COLUMNS,
        ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(PRIVACY_NOTE,), protocol="own",
    ),
    "demo-system": Grid(
        "demo-system", "Clients that drop and lag on the demo", tuple(own_row(m) for m in SYSTEM_METHODS), SYSTEM_COLUMNS,
        ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(SYSTEM_NOTE,), protocol="own",
    ),
    "demo-async": Grid(
        "demo-async", "Asynchronous servers on the demo", tuple(own_row(m) for m in SYSTEM_METHODS), ASYNC_COLUMNS,
        ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(ASYNC_NOTE,), protocol="own",
    ),
    "demo-robust": Grid(
        "demo-robust", "Attacks against aggregators on the demo", tuple(own_row(m) for m in SYSTEM_METHODS), ROBUST_COLUMNS,
        ("Method", "PL"), flags=DEMO_FLAGS, uses_data_root=False, notes=(ROBUST_NOTE,), protocol="own",
    ),
    "coop": Grid(
        "coop", "CoOp's eleven datasets in Table 1's protocol", PAPER_ROWS, COOP_COLUMNS, ("Method", "PL"), average=True,
        notes=(COOP_NOTE,),
    ),
    "backbones": Grid(
        "backbones", "Backbone families in Table 1's protocol (CIFAR10, β = 0.1)", PAPER_ROWS,
        tuple(backbone_column(*b, PAPER_ROWS) for b in BACKBONES), ("Method", "PL"), notes=(BACKBONE_NOTE,),
    ),
    "tiny": Grid(
        "tiny", "tiny: the mechanics tests' model and data (does not learn)",
        (FEDUR_ROW, FEDCOPL_ROW),
        (Column("tiny", "synthetic", "configs/tiny.yaml, 2 rounds", "tiny.yaml", "synthetic", "tiny"),),
        ("Method", "PL"), flags=("--federation.rounds", "2"), uses_data_root=False,
    ),
}


PROTOCOLS = {
    "fedur": "every row with the column's settings, FedUR's (the paper's implementation details give lr 0.1, 10 local "
             "epochs, 16 context vectors and a cosine schedule for all its experiments)",
    "own": "each baseline with settings of its own over the column's (configs/presets/: its published learning rate, "
           "local epochs, context length, schedule and server weighting; on the demo configs/presets/demo/: the "
           "learning rate a sweep on the demo chose for it, FedPGP's with its published schedule and weight decay); "
           "FedUR, FedCoPL, GDA-U and zero-shot as in the paper",
}


def with_protocol(grid: Grid, protocol: str) -> Grid:
    """`grid` under a protocol: 'fedur' (the grid as it is) or 'own', a grid of its own (its runs in
    <grid>-own/) whose baseline rows run with their presets (`preset_config`)."""
    if protocol == "fedur":
        return grid
    if protocol != "own":
        # internal: fedur-tables' choices check it first
        raise ValueError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    presets = sorted({preset_config(r, c) for r in grid.rows for c in grid.columns if r.preset})
    return replace(grid, name=f"{grid.name}-own", title=f"{grid.title}; baselines with their own settings",
                   protocol="own", notes=(*grid.notes, f"The presets: {', '.join(f'configs/{p}' for p in presets)}."))


def config_path(config: str) -> Path:
    """A grid's config file (`Column.config`) in fedur's configs/."""
    return CONFIGS / config


# Every grid with baseline rows also under the baselines' own protocol: fedur-tables table7-own, ...
GRIDS.update({f"{name}-own": with_protocol(grid, "own") for name, grid in list(GRIDS.items())
              if any(row.preset for row in grid.rows) and grid.protocol != "own"})


@dataclass(frozen=True)
class RunSpec:
    """One run of a grid: row x column x seed, and where it writes."""

    index: int  # position in the grid's run list = its SLURM array task id
    grid: Grid
    row: Row
    column: Column
    seed: int
    out: Path  # the tables' folder (--out)

    @property
    def cell_dir(self) -> Path:
        return self.out / self.grid.name / (self.column.runs or self.column.key) / self.row.key

    @property
    def value(self) -> str:
        """The summary.json key this run's cell shows."""
        return self.column.value or self.row.value

    @property
    def run_dir(self) -> Path:
        return self.cell_dir / f"seed{self.seed}"

    @property
    def log(self) -> Path:
        return self.cell_dir / f"seed{self.seed}.log"

    @property
    def name(self) -> str:
        return f"{self.row.key} | {self.column.key} | seed {self.seed}"


def expand(grid: Grid, seeds: list[int], out: Path, rows: list[str] | None = None,
           columns: list[str] | None = None) -> list[RunSpec]:
    """Every run of the grid, column-major (a column's rows and seeds together); `rows`/`columns` keep
    only those keys. The index is the position in the unfiltered list, so it names the same run whatever
    is filtered."""
    specs = []
    index = 0
    for column in grid.columns:
        for row in grid.rows:
            for seed in seeds:
                chosen = (rows is None or row.key in rows) and (columns is None or column.key in columns)
                if chosen and row.key not in column.skip_rows:
                    specs.append(RunSpec(index, grid, row, column, seed, out))
                index += 1
    return specs
