"""Every method's defaults and published preset held to its original's configuration files, value by value.

For each method whose settings come from an original (a class with a `preset`), a table of pins: the setting, the
original's value in fedur's terms, and where the original says it ("repo@commit path Lnn"). A pin's scope says what
it holds: the class's default (`inspect.signature`), the published preset (configs/presets/<preset>.yaml, where a
key it leaves out is the class's or the run config's default), or both. Every constructor argument of the class and
every key of its published preset is pinned or is a difference the method's section of docs/reference-parity.md
lists (its row named here), so that a default changed by mistake, or a setting added without a source, fails here.

The originals were read at the commits below (docs/reference-parity.md names the same ones); the line numbers are
theirs. A value fedur derives from the original's is written as the derivation (PromptSRC's GPA mean: 15 of its 20
epochs, as a fraction of the rounds: 15 / 20). FedTPG is not pinned yet: UNPINNED says why.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import pytest
import yaml

from fedur import config, plugins

from ..conftest import REPO

COOP = "KaiyangZhou/CoOp@ff61507"
DASSL = "KaiyangZhou/Dassl.pytorch@c61a1b5"  # the Dassl CoOp, MaPLe and PromptSRC install (none vendors one)
KGCOOP = "htyao89/KgCoOp@c43ccc3"
MAPLE = "muzairkhattak/multimodal-prompt-learning@69bce21"
PROMPTSRC = "muzairkhattak/PromptSRC@bb95c77"
FLIP = "0-ml/flip@ec3a848"
PFEDMOAP = "ljaiverson/pFedMoAP@a481de3"
FEDPHA = "CYFang6/FedPHA@1ab33df"
DPFPL = "linhhtran/DP-FPL@cce74b4"
PROMPTFL = "PEILab-Federated-Learning/PromptFL@da401e7"
FEDOTP = "HongxiaLee/FedOTP@9948611"
FEDPGP = "TianyuCuiOvO/FedPGP@d43045b"
PROMPTFOLIO = "PanBikang/PromptFolio@8f729aa"

COCOOP_CFG = f"{COOP} configs/trainers/CoCoOp/vit_b16_c4_ep10_batch1_ctxv1.yaml"
KGCOOP_CFG = f"{KGCOOP} KgCoOp/configs/trainers/KgCoOp/vit_b16_ep100_ctxv1.yaml"
KGCOOP_DASSL = f"{KGCOOP} Dassl.ProGrad.pytorch/dassl/config/defaults.py"
MAPLE_CFG = f"{MAPLE} configs/trainers/MaPLe/vit_b16_c2_ep5_batch4_2ctx.yaml"
PROMPTSRC_CFG = f"{PROMPTSRC} configs/trainers/PromptSRC/vit_b16_c2_ep20_batch4_4+4ctx.yaml"
PFEDMOAP_CFG = f"{PFEDMOAP} configs/trainers/PFEDMOAP/vit_b16.yaml"
FEDPHA_DATA = f"{FEDPHA} configs/datasets/caltech101.yaml"  # and every dataset config but cifar100.yaml's lr
FLIP_RANDOM = f"{FLIP} main.py L169 (--ctx_init ''), flcore/models/text/prompt.py L94 (N(0, 0.02^2))"
FLIP_DATA_SIZE = f"{FLIP} flcore/servers/server_base.py L213-218, L230-237"
FLIP_ONE_EPOCH = f"{FLIP} scripts/run_batch.sh L28"



@dataclass(frozen=True)
class Pin:
    setting: str  # "method.<argument>", or "<model|federation|optim>.<field>" of the run config
    value: object  # the original's value in fedur's terms
    source: str  # "repo@commit path Lnn", where the original says it
    scope: Literal["default", "preset", "both"] = "both"


PROMPTFL_RUN = (  # PromptFL's settings: pFedPrompt's preset takes them [guess: pFedPrompt has no public code]
    Pin("method.weighting", "uniform", f"{PROMPTFL} utils.py L76-85", "preset"),
    Pin("model.n_ctx", 16, f"{PROMPTFL} federated_main.py L96; README.md L27", "preset"),
    Pin("federation.local_epochs", 5, f"{PROMPTFL} scripts/main_pipeline.sh L27, L51", "preset"),
    Pin("optim.lr", 0.001, f"{PROMPTFL} scripts/main_pipeline.sh L9, L53", "preset"),
    Pin("optim.batch_size", 32, f"{PROMPTFL} configs/trainers/CoOp/vit_b16_ep50.yaml L3", "preset"),
    Pin("optim.momentum", 0.9, f"{PROMPTFL} Dassl/dassl/config/defaults.py L154", "preset"),
    Pin("optim.weight_decay", 5e-4, f"{PROMPTFL} Dassl/dassl/config/defaults.py L153", "preset"),
)
GLP_OT_CFG = f"{FEDOTP} configs/trainers/GLP_OT/vit_b16.yaml"  # merged after federated_main.py L101-104, at L119
FEDOTP_RUN = (
    Pin("federation.local_epochs", 1, f"{GLP_OT_CFG} L18", "preset"),
    Pin("optim.lr", 0.001, f"{GLP_OT_CFG} L17", "preset"),
    Pin("optim.batch_size", 32, f"{FEDOTP} federated_main.py L510 (set at L121)", "preset"),
    Pin("optim.momentum", 0.9, f"{FEDOTP} Dassl/dassl/config/defaults.py L157", "preset"),
    Pin("optim.weight_decay", 5e-4, f"{FEDOTP} Dassl/dassl/config/defaults.py L156", "preset"),
    Pin("optim.schedule", "constant", f"{GLP_OT_CFG} L19 (single_step); {FEDOTP} federated_main.py L509 (gamma 1)",
        "preset"),
)

PINS: dict[str, tuple[Pin, ...]] = {
    "fedcocoop": (
        Pin("method.ctx_init", None, FLIP_RANDOM, "default"),
        Pin("method.ctx_init", "a photo of a", f"{COCOOP_CFG} L34", "preset"),
        Pin("method.weighting", "data", FLIP_DATA_SIZE, "preset"),
        Pin("model.n_ctx", 4, f"{COCOOP_CFG} L33", "preset"),
        Pin("federation.local_epochs", 1, FLIP_ONE_EPOCH, "preset"),
        Pin("optim.lr", 0.002, f"{COCOOP_CFG} L17", "preset"),
        Pin("optim.batch_size", 1, f"{COCOOP_CFG} L3; {FLIP} main.py L44-45", "preset"),
        Pin("optim.momentum", 0.9, f"{DASSL} dassl/config/defaults.py L154", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{DASSL} dassl/config/defaults.py L153", "preset"),
    ),
    "fedkgcoop": (
        Pin("method.w", 8.0, f"{KGCOOP} KgCoOp/scripts/run.sh L2-11; KgCoOp/scripts/xd_train.sh L8"),
        Pin("method.ctx_init", None, FLIP_RANDOM, "default"),
        Pin("method.ctx_init", "a photo of a", f"{KGCOOP_CFG} L33; {KGCOOP} KgCoOp/trainers/kgcoop.py L94-98", "preset"),
        Pin("method.weighting", "data", FLIP_DATA_SIZE, "preset"),
        Pin("model.n_ctx", 4, f"{KGCOOP} KgCoOp/scripts/base2new_train.sh L13; KgCoOp/trainers/kgcoop.py L98", "preset"),
        Pin("federation.local_epochs", 1, FLIP_ONE_EPOCH, "preset"),
        Pin("optim.lr", 0.002, f"{KGCOOP_CFG} L17", "preset"),
        Pin("optim.batch_size", 128, f"{KGCOOP_CFG} L3", "preset"),
        Pin("optim.momentum", 0.9, f"{KGCOOP_DASSL} L152", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{KGCOOP_DASSL} L151", "preset"),
    ),
    "fedmaple": (
        Pin("method.depth", None, f"{MAPLE_CFG} L36 (PROMPT_DEPTH 9; null: 9, capped at the towers' blocks)"),
        Pin("method.ctx_init", None, FLIP_RANDOM, "default"),
        Pin("method.ctx_init", "a photo of a", f"{MAPLE_CFG} L34", "preset"),
        Pin("method.clone_projections", True, f"{MAPLE} trainers/maple.py L117", "default"),
        Pin("method.weighting", "data", FLIP_DATA_SIZE, "preset"),
        Pin("model.n_ctx", 2, f"{MAPLE_CFG} L33", "preset"),
        Pin("model.ctx_suffix", "of a", f"{MAPLE} trainers/maple.py L91-92 (the first 2 tokens the context, "
                                        f"the prompt \"a photo of a\")", "preset"),
        Pin("federation.local_epochs", 1, f"{FLIP} main.py L141", "preset"),
        Pin("optim.lr", 0.0035, f"{MAPLE_CFG} L17", "preset"),
        Pin("optim.batch_size", 4, f"{MAPLE_CFG} L3", "preset"),
        Pin("optim.momentum", 0.9, f"{DASSL} dassl/config/defaults.py L154", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{DASSL} dassl/config/defaults.py L153", "preset"),
        Pin("optim.schedule", "cosine", f"{MAPLE_CFG} L19", "preset"),
        Pin("optim.warmup_epochs", 1, f"{MAPLE_CFG} L20", "preset"),
        Pin("optim.warmup_lr", 1e-5, f"{MAPLE_CFG} L22", "preset"),
    ),
    "fedpromptsrc": (
        Pin("method.text_depth", None, f"{PROMPTSRC_CFG} L39 (PROMPT_DEPTH_TEXT 9; null: 9, capped)"),
        Pin("method.vision_depth", None, f"{PROMPTSRC_CFG} L38 (PROMPT_DEPTH_VISION 9; null: 9, capped)"),
        Pin("method.ctx_init", None, FLIP_RANDOM, "default"),
        Pin("method.ctx_init", "a photo of a", f"{PROMPTSRC_CFG} L36", "preset"),
        Pin("method.text_weight", 25.0, f"{PROMPTSRC_CFG} L40"),
        Pin("method.image_weight", 10.0, f"{PROMPTSRC_CFG} L41"),
        Pin("method.gpa", "rounds", f"{FLIP} flcore/models/clip/PromptSRC.py L26-28 (GPA over the rounds)"),
        Pin("method.gpa_mean", 15 / 20, f"{PROMPTSRC_CFG} L42 (GPA_MEAN 15) of L19 (MAX_EPOCH 20)"),
        Pin("method.gpa_std", 1 / 20, f"{PROMPTSRC_CFG} L43 (GPA_STD 1) of L19 (MAX_EPOCH 20)"),
        Pin("method.weighting", "data", FLIP_DATA_SIZE, "preset"),
        Pin("model.n_ctx", 4, f"{PROMPTSRC_CFG} L35", "preset"),
        Pin("model.visual_tokens", 4, f"{PROMPTSRC_CFG} L34", "preset"),
        Pin("federation.local_epochs", 1, FLIP_ONE_EPOCH, "preset"),
        Pin("optim.lr", 0.0025, f"{PROMPTSRC_CFG} L18", "preset"),
        Pin("optim.batch_size", 4, f"{PROMPTSRC_CFG} L4", "preset"),
        Pin("optim.momentum", 0.9, f"{DASSL} dassl/config/defaults.py L154", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{DASSL} dassl/config/defaults.py L153", "preset"),
        Pin("optim.schedule", "cosine", f"{PROMPTSRC_CFG} L20", "preset"),
        Pin("optim.warmup_epochs", 1, f"{PROMPTSRC_CFG} L21", "preset"),
        Pin("optim.warmup_lr", 1e-5, f"{PROMPTSRC_CFG} L23", "preset"),
    ),
    "pfedmoap": (
        Pin("method.num_experts", 10, f"{PFEDMOAP} train.sh L32; federated_main.py L44"),
        Pin("method.lam", 0.5, f"{PFEDMOAP} train.sh L30; federated_main.py L48"),
        Pin("method.scaling", 10.0, f"{PFEDMOAP} train.sh L31; federated_main.py L49"),
        Pin("method.gate_dim", 128, f"{PFEDMOAP} federated_main.py L47", "preset"),
        Pin("method.gate_heads", 8, f"{PFEDMOAP} federated_main.py L46"),
        Pin("method.gate_lr_ratio", 0.01 / 0.002, f"{PFEDMOAP_CFG} L26 (the gate's SGD) over L17 (the prompt's)"),
        Pin("method.selection", "nearest", f"{PFEDMOAP} train.sh L29; federated_main.py L45 (the flag; the code runs "
                                           "'random': trainers/pfedmoap.py L321)", "default"),
        Pin("method.eval_prompt", "own", f"{PFEDMOAP} federated_main.py L381, L404", "default"),
        Pin("method.weighting", "data", f"{PFEDMOAP} federated_main.py L392; utils/fed_utils.py L5-28", "preset"),
        Pin("model.n_ctx", 16, f"{PFEDMOAP} train.sh L37; federated_main.py L40", "preset"),
        Pin("model.ctx_init_std", 0.02, f"{PFEDMOAP} trainers/pfedmoap.py L57", "preset"),
        Pin("federation.local_epochs", 5, f"{PFEDMOAP} federated_main.py L17", "preset"),
        Pin("optim.lr", 0.002, f"{PFEDMOAP_CFG} L17 (merged after --lr: federated_main.py L175-199)", "preset"),
        Pin("optim.batch_size", 16, f"{PFEDMOAP} train.sh L25, L57", "preset"),
        Pin("optim.momentum", 0.9, f"{PFEDMOAP} Dassl/dassl/config/defaults.py L157", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{PFEDMOAP} Dassl/dassl/config/defaults.py L156", "preset"),
        Pin("optim.schedule", "cosine", f"{PFEDMOAP_CFG} L19", "preset"),
        Pin("optim.cosine_epochs", 5, f"{PFEDMOAP} federated_main.py L107-108 (T_max = MAX_EPOCH = --local_epochs)",
            "preset"),
        Pin("optim.warmup_epochs", 1, f"{PFEDMOAP_CFG} L20", "preset"),
        Pin("optim.warmup_lr", 1e-5, f"{PFEDMOAP_CFG} L22", "preset"),
    ),
    "fedpha": (
        Pin("method.alpha", 1.0, f"{FEDPHA} federated_main.py L498"),
        Pin("method.ratio", 0.8, f"{FEDPHA} federated_main.py L499"),
        Pin("method.pull_weight", 1.0, f"{FEDPHA} trainers/GL_SVDMSE.py L354"),
        Pin("method.push_weight", 1.0, f"{FEDPHA} trainers/GL_SVDMSE.py L355"),
        Pin("method.global_weight", 1.0, f"{FEDPHA} trainers/GL_SVDMSE.py L358-359"),
        Pin("method.detach_basis", False, f"{FEDPHA} trainers/GL_SVDMSE.py L129-147 (no detach)", "default"),
        Pin("method.weighting", "data", f"{FEDPHA} federated_main.py L323; utils/fed_utils.py L29-52", "preset"),
        Pin("model.n_ctx", 16, f"{FEDPHA} federated_main.py L494", "preset"),
        Pin("model.ctx_init_std", 0.02, f"{FEDPHA} trainers/GL_SVDMSE.py L96-97", "preset"),
        Pin("federation.local_epochs", 1, f"{FEDPHA_DATA} L22", "preset"),
        Pin("optim.lr", 0.001, f"{FEDPHA_DATA} L20", "preset"),
        Pin("optim.batch_size", 32, f"{FEDPHA} federated_main.py L478 (set at L162)", "preset"),
        Pin("optim.momentum", 0.9, f"{FEDPHA} Dassl/dassl/config/defaults.py L158", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{FEDPHA} Dassl/dassl/config/defaults.py L157", "preset"),
        Pin("optim.schedule", "constant", f"{FEDPHA_DATA} L23 (single_step); {FEDPHA} federated_main.py L477 "
                                          "(gamma 1)", "preset"),
        Pin("optim.optimizer_state", "reset", f"{FEDPHA} Dassl/dassl/engine/trainer.py L459-471 (momentum zeroed "
                                              "after every client)", "preset"),
    ),
    "dpfpl": (
        Pin("method.rank", 8, f"{DPFPL} federated_main.py L242"),
        Pin("method.local_clip", 10.0, f"{DPFPL} federated_main.py L243"),
        Pin("method.local_noise", 0.0, f"{DPFPL} federated_main.py L244 (--noise 0: neither clipped nor noised)"),
        Pin("method.gradient", "reference", f"{DPFPL} trainers/DP_FPL.py L68-76, L312-315"),
        Pin("method.weighting", "uniform", f"{DPFPL} federated_main.py L163"),
        Pin("model.n_ctx", 16, f"{DPFPL} federated_main.py L256", "preset"),
        Pin("model.ctx_init_std", 0.02, f"{DPFPL} trainers/DP_FPL.py L120, L126", "preset"),
        Pin("federation.local_epochs", 1, f"{DPFPL} federated_main.py L49", "preset"),
        Pin("optim.lr", 0.001, f"{DPFPL} federated_main.py L235", "preset"),
        Pin("optim.batch_size", 32, f"{DPFPL} federated_main.py L236, L42-43 (--useall True, L250)", "preset"),
        Pin("optim.momentum", 0.9, f"{DPFPL} Dassl/dassl/config/defaults.py L153", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{DPFPL} Dassl/dassl/config/defaults.py L152", "preset"),
        Pin("optim.schedule", "constant", f"{DPFPL} configs/trainers/DP-FPL/vit_b16.yaml L17 (single_step); "
                                          "Dassl/dassl/config/defaults.py L172 (gamma 1)", "preset"),
    ),
}

PINS |= {
    "promptfl": PROMPTFL_RUN,
    "pfedprompt": PROMPTFL_RUN,
    "promptprox": (
        Pin("method.mu", 0.5, f"{FEDOTP} federated_main.py L513 (its fedprox, L296-309)"),
        Pin("method.weighting", "data", f"{FEDOTP} federated_main.py L309; utils/fed_utils.py L5-13", "preset"),
        Pin("model.n_ctx", 16, f"{FEDOTP} federated_main.py L529 (its argparse default)", "preset"),
        *FEDOTP_RUN,  # [guess]: no script runs its fedprox; the config is the one FedOTP's own script passes
    ),
    "fedotp": (
        Pin("method.eps", 0.1, f"{FEDOTP} scripts/fedotp_cifar100.sh L12; federated_main.py L537"),
        Pin("method.top_percent", 0.8, f"{FEDOTP} scripts/fedotp_cifar100.sh L11"),
        Pin("method.thresh", 0.001, f"{FEDOTP} scripts/fedotp_cifar100.sh L13; federated_main.py L538", "default"),
        Pin("method.max_iter", 100, f"{FEDOTP} scripts/fedotp_cifar100.sh L14; federated_main.py L539", "default"),
        Pin("method.weighting", "data", f"{FEDOTP} federated_main.py L374; utils/fed_utils.py L5-13", "preset"),
        Pin("model.n_ctx", 4, f"{FEDOTP} scripts/fedotp_cifar100.sh L24", "preset"),
        *FEDOTP_RUN,
    ),
    "fedpgp": (
        Pin("method.rank", 8, f"{FEDPGP} scripts/plot_basetonew_base.sh L34, L57 (BOTTLENECK)"),
        Pin("method.mu", 0.5, f"{FEDPGP} scripts/plot_basetonew_base.sh L36, L55"),
        Pin("method.temperature", 0.5, f"{FEDPGP} scripts/plot_basetonew_base.sh L30, L56"),
        Pin("method.weighting", "data", f"{FEDPGP} federated_main.py L349", "preset"),
        Pin("model.n_ctx", 16, f"{FEDPGP} scripts/plot_basetonew_base.sh L26", "preset"),
        Pin("federation.local_epochs", 2, f"{FEDPGP} scripts/plot_basetonew_base.sh L21, L66", "preset"),
        Pin("optim.lr", 0.001, f"{FEDPGP} scripts/plot_basetonew_base.sh L15; configs/trainers/PLOT/vit_b16.yaml L17",
            "preset"),
        Pin("optim.batch_size", 32, f"{FEDPGP} federated_main.py L471 (its script passes the shots, L69)", "preset"),
        Pin("optim.momentum", 0.9, f"{FEDPGP} Dassl/dassl/config/defaults.py L157", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{FEDPGP} Dassl/dassl/config/defaults.py L156", "preset"),
        Pin("optim.schedule", "constant", f"{FEDPGP} configs/trainers/PLOT/vit_b16.yaml L18 (single_step); "
                                          "federated_main.py L441 (gamma 1)", "preset"),
    ),
    "promptfolio": (
        Pin("method.theta", 0.4, f"{PROMPTFOLIO} federated_main.py L399 (--frac_p)"),
        Pin("method.weighting", "data", f"{PROMPTFOLIO} trainers/PromptFolio.py L412-417", "preset"),
        Pin("model.n_ctx", 8, f"{PROMPTFOLIO} federated_main.py L412", "preset"),
        Pin("federation.local_epochs", 5, f"{PROMPTFOLIO} configs/trainers/PromptFolio/vit_b16.yaml L18 (merged after "
                                           "federated_main.py L121, at L139)", "preset"),
        Pin("optim.lr", 0.002, f"{PROMPTFOLIO} configs/trainers/PromptFolio/vit_b16.yaml L17", "preset"),
        Pin("optim.batch_size", 16, f"{PROMPTFOLIO} federated_main.py L418 (set at L141, after the yaml)", "preset"),
        Pin("optim.momentum", 0.9, f"{PROMPTFOLIO} Dassl/dassl/config/defaults.py L157", "preset"),
        Pin("optim.weight_decay", 5e-4, f"{PROMPTFOLIO} Dassl/dassl/config/defaults.py L156", "preset"),
        Pin("optim.schedule", "cosine", f"{PROMPTFOLIO} configs/trainers/PromptFolio/vit_b16.yaml L19", "preset"),
        Pin("optim.cosine_epochs", 5, f"{PROMPTFOLIO} configs/trainers/PromptFolio/vit_b16.yaml L18 (T_max = MAX_EPOCH)",
            "preset"),
        Pin("optim.warmup_epochs", 1, f"{PROMPTFOLIO} configs/trainers/PromptFolio/vit_b16.yaml L20", "preset"),
        Pin("optim.warmup_lr", 1e-5, f"{PROMPTFOLIO} configs/trainers/PromptFolio/vit_b16.yaml L22", "preset"),
    ),
}

# What a method's defaults or published preset set otherwise than its original, each with the row of its section of
# docs/reference-parity.md that says so (the row's first cell).
DIFFERS: dict[str, dict[str, str]] = {
    "fedcocoop": {"method.image_chunk": "Text passes", "optim.schedule": "Schedule"},
    "fedkgcoop": {"method.template": "The hand-crafted prompt t0", "optim.schedule": "Schedule"},
    "fedmaple": {},
    "fedpromptsrc": {},
    "pfedmoap": {"method.gate_dim": "The gate's width"},
    "fedpha": {},
    "dpfpl": {},
    "promptfl": {"method.weighting": "The server's weighting"},
    "pfedprompt": {"method.cache_shots": "Cache size", "method.cache_self_vote": "Self-votes",
                   "method.cache_alpha_scale": "alpha's scale", "method.cache_alpha": "alpha and beta",
                   "method.cache_beta": "alpha and beta"},
    "promptprox": {},
    "fedotp": {},
    "fedpgp": {},
    "promptfolio": {},
}

# Methods with a published preset whose values no table here holds yet, and why.
UNPINNED = {
    "fedtpg": "its published values come in part from a run's log (output/cross_cls/fedtpg/20_8/43/log.txt), not a "
              "configuration file; its preset's comment cites them and tests/methods/test_fedtpg.py holds its SGD state",
}

# Methods without a published preset, and why none.
NO_ORIGINAL = {
    "fedur": "the paper's method: its settings are fedur's defaults (FedUR has no released code)",
    "fedcopl": "run at the paper's protocol, fedur's defaults (docs/reference-parity.md#fedur-and-fedcopl)",
    "gdau": "a reconstruction of an unsupervised GDA: its few-shot reference has no federated settings",
    "scaffold": "Algorithm 1 of the paper, no code: its demo preset's plain SGD is the algorithm's",
    "zeroshot": "no training",
}

SOURCE = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{7} \S+ L\d+")  # repo@commit path Lnn
SECTIONS = ("model", "federation", "optim")


def methods() -> dict[str, type]:
    return plugins.by_key("method")


def published(cls: type) -> dict:
    return yaml.safe_load((plugins.configs_dir() / "presets" / f"{cls.preset}.yaml").read_text())


def own_defaults(cls: type) -> dict[str, object]:
    """{argument: default} of the class's own constructor (its base's arguments come through **kwargs)."""
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def class_default(cls: type, name: str) -> object:
    """The default of constructor argument `name`, from the class or the first base that declares it."""
    for klass in cls.__mro__:
        params = inspect.signature(klass.__init__).parameters if "__init__" in vars(klass) else {}
        if name in params:
            return params[name].default
    raise AssertionError(f"{cls.__name__} takes no argument {name!r}")


def run_default(setting: str) -> object:
    """The run config's default of `setting` ("optim.lr": OptimConfig's lr)."""
    section, name = setting.split(".")
    group = {field.name: field for field in dataclasses.fields(config.Config)}[section].default_factory()
    return getattr(group, name)


def preset_value(cls: type, preset: dict, setting: str) -> object:
    section, name = setting.split(".")
    if section == "method":
        return (preset["method"].get("init_args") or {}).get(name, class_default(cls, name))
    return (preset.get(section) or {}).get(name, run_default(setting))


def preset_settings(preset: dict) -> set[str]:
    found = {f"method.{name}" for name in (preset["method"].get("init_args") or {})}
    return found | {f"{section}.{name}" for section in SECTIONS for name in (preset.get(section) or {})}


def same(found: object, expected: object) -> bool:
    if isinstance(expected, float) and not isinstance(found, bool):
        return isinstance(found, int | float) and found == pytest.approx(expected, rel=1e-12)
    return found == expected and type(found) is type(expected)


def test_every_method_is_pinned_or_named_with_its_reason():
    """The methods with a published preset are the pinned ones and the named unpinned ones; the others are named
    with the reason they have none (a method added to fedur fails here until it is one of them)."""
    found = methods()
    with_preset = {key for key, cls in found.items() if cls.preset}
    assert with_preset == set(PINS) | set(UNPINNED) and not set(PINS) & set(UNPINNED)
    assert set(found) - with_preset == set(NO_ORIGINAL)
    assert set(DIFFERS) == set(PINS)


@pytest.mark.parametrize("key", sorted(PINS))
def test_the_defaults_are_the_originals(key):
    cls = methods()[key]
    wrong = [(pin.setting, class_default(cls, pin.setting.split(".")[1]), pin.value, pin.source)
             for pin in PINS[key] if pin.scope != "preset" and pin.setting.startswith("method.")
             and not same(class_default(cls, pin.setting.split(".")[1]), pin.value)]
    assert not wrong, f"{cls.__name__}'s defaults are not its original's (setting, default, original, source): {wrong}"


@pytest.mark.parametrize("key", sorted(PINS))
def test_the_published_preset_is_the_originals(key):
    cls = methods()[key]
    preset = published(cls)
    assert preset["method"]["class_path"] == cls.__name__
    wrong = [(pin.setting, preset_value(cls, preset, pin.setting), pin.value, pin.source)
             for pin in PINS[key] if pin.scope != "default" and not same(preset_value(cls, preset, pin.setting), pin.value)]
    assert not wrong, f"configs/presets/{cls.preset}.yaml is not its original's (setting, preset, original, source): {wrong}"


@pytest.mark.parametrize("key", sorted(PINS))
def test_every_setting_is_pinned_or_a_difference_the_page_lists(key):
    cls = methods()[key]
    pinned = {pin.setting: pin for pin in PINS[key]}
    arguments = {f"method.{name}" for name in own_defaults(cls)}
    by_default = {p.setting for p in PINS[key] if p.scope != "preset"} | set(DIFFERS[key])
    by_preset = {p.setting for p in PINS[key] if p.scope != "default"} | set(DIFFERS[key])
    assert not arguments - by_default, f"{cls.__name__}: arguments without a pin or a listed difference"
    assert not preset_settings(published(cls)) - by_preset, f"configs/presets/{cls.preset}.yaml: keys without a pin"
    assert all(SOURCE.match(pin.source) for pin in PINS[key]), [p.source for p in PINS[key] if not SOURCE.match(p.source)]
    assert not set(DIFFERS[key]) & {s for s, p in pinned.items() if p.scope == "both"}
    section = parity_section(cls.label)
    missing = [row for row in DIFFERS[key].values() if f"\n| {row} |" not in section]
    assert not missing, f"docs/reference-parity.md#{cls.label} has no row {missing}"


def parity_section(label: str) -> str:
    """The text of `label`'s section of docs/reference-parity.md (from its heading to the next)."""
    text = (REPO / "docs" / "reference-parity.md").read_text()
    start = text.index(f"\n## {label}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def tall(text_blocks: int, vision_blocks: int) -> SimpleNamespace:
    """A stand-in model with ViT-B's towers as far as the depth rules read them."""
    visual = SimpleNamespace(transformer=SimpleNamespace(resblocks=[None] * vision_blocks))
    return SimpleNamespace(text_depth=text_blocks, vision_depth=vision_blocks, clip=SimpleNamespace(visual=visual))


def test_a_depth_left_null_is_the_originals_nine_on_vit_b():
    """MaPLe's PROMPT_DEPTH 9 (its vit_b16_c2_ep5_batch4_2ctx.yaml L36), PromptSRC's PROMPT_DEPTH_TEXT and _VISION 9 (L38-39): what the
    defaults' null resolves to at ViT-B's 12 blocks (and the smaller tower's blocks where it has fewer)."""
    from fedur.methods import maple, promptsrc

    assert maple.prompt_depth(tall(12, 12), None) == 9 and maple.prompt_depth(tall(4, 12), None) == 4
    assert promptsrc.prompt_depth(tall(12, 12), None, "text") == 9
    assert promptsrc.prompt_depth(tall(12, 12), None, "vision") == 9
    assert promptsrc.prompt_depth(tall(12, 3), None, "vision") == 3


def test_promptsrcs_gpa_weights_are_its_epochs_read_as_rounds():
    """At 20 rounds the weights of the rounds are PromptSRC's of its 20 epochs (trainers/promptsrc.py L265-270:
    pdf(e; 15, 1) at e = 1..20, normalised): 0.40 at round 15, 0.24 at 14 and 16, 0.05 at 13 and 17."""
    import math

    from fedur.methods.promptsrc import FedPromptSRC, gaussian

    method = FedPromptSRC()
    ours = [gaussian(r, method.gpa_mean * 20, method.gpa_std * 20) for r in range(1, 21)]
    theirs = [math.exp(-0.5 * (e - 15) ** 2) / math.sqrt(2 * math.pi) for e in range(1, 21)]
    assert [w / sum(ours) for w in ours] == pytest.approx([w / sum(theirs) for w in theirs], rel=1e-9)
    assert [round(w / sum(ours), 2) for w in ours[12:17]] == [0.05, 0.24, 0.4, 0.24, 0.05]
