"""Does a change of fedur's code leave its results as they were? Every method with every pseudo-labeller
and the switches, run by two checkouts, compared file by file.

    git worktree add /tmp/fedur-before <commit>
    python benchmarks/output_parity.py run /tmp/fedur-before /tmp/parity/before --legacy   # a pre-plugin checkout
    python benchmarks/output_parity.py run . /tmp/parity/after
    python benchmarks/output_parity.py compare /tmp/parity/before /tmp/parity/after

Rounds are compared by rounds completed, so a run from before rounds were counted from 1 in the files
(metrics.jsonl's "round", summary.json's "best_round", checkpoints/round_NNNNN) compares with one after.

A case is a run of configs/tiny.yaml (random-init tiny CLIP, 4 rounds, two refreshes) or of the demo
(configs/smoke.yaml). `compare` checks, per case: every metrics.jsonl row but the timings, summary.json
(but wall time, settings and placement; a key the older run lacks is an addition, not a difference),
zero_shot.json, partition.json, confusion.json (a metrics.jsonl key only the newer run writes is an addition),
and every tensor of every .pt file (final prompts and the
kept checkpoints: prompts, momenta, pseudo-labels, masks, caches, server state) with torch.equal; a tensor
only the newer run's file holds is an addition too (the final client files now carry the method's own state).
`--legacy` translates the cases to the command line of fedur before methods, labellers and datasets were
classes (method.name, method.labeller, labels.*, data.name; tests/tiny.yaml).

Results of the last comparison: benchmarks/results/output_parity.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

TIMING = {"round_seconds", "phase_seconds"}
SUMMARY_SKIP = {"wall_seconds", "startup_seconds", "settings", "placement"}  # timings, and what may differ by design


def fedur_plugins() -> tuple[list[type], list[str]]:
    """fedur's own methods and labeller names, from the classes (fedur/plugins.py); a checkout before that module
    listed them here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fedur import plugins

    return plugins.builtin("method"), [cls.__name__ for cls in plugins.builtin("labeller")]


def cases() -> dict[str, list[str]]:
    """Every trainable method with every labeller, alone and in groups of 2, and every training-free one, on
    configs/tiny.yaml; the switches; the evaluation protocols; every method on the demo."""
    methods, labellers = fedur_plugins()
    trainable = [m.__name__ for m in methods if m.trains]
    tiny, smoke = ["--config", "configs/tiny.yaml"], ["--config", "configs/smoke.yaml"]
    out = {f"{m.lower()}-{lab.lower()}": [*tiny, "--method", m, "--labeller", lab] for m in trainable for lab in labellers}
    out.update({m.__name__.lower(): [*tiny, "--method", m.__name__] for m in methods if not m.trains})
    out.update({f"{m.__name__.lower()}-g2": [*tiny, "--run.clients_per_step", "2", "--method", m.__name__]
                for m in methods if m.trains})
    out.update({f"{m.lower()}-{lab.lower()}-g2": [*tiny, "--run.clients_per_step", "2", "--method", m, "--labeller", lab]
                for m in ("FedUR", "PromptFL") for lab in labellers})
    codpl = [*tiny, "--method", "FedUR", "--labeller", "CoDPL"]
    out.update({
        "fedur-online": [*codpl, "--labeller.negatives", "online"],
        "fedur-ratio-invsqrt": [*codpl, "--labeller.negatives", "ratio", "--labeller.class_weights", "inv_sqrt",
                                "--labeller.weight_source", "requested"],
        "fedur-nocoop": [*codpl, "--labeller.cooperative_selection", "false", "--labeller.entropy_filter", "false"],
        "fedur-share-both": [*tiny, "--method", "FedUR", "--method.share", "both"],
        "fedcopl-share-none": [*tiny, "--method", "FedCoPL", "--method.share", "none"],
        "fedur-join": [*tiny, "--federation.join_rate", "0.5", "--optim.optimizer_state", "client", "--method", "FedUR"],
        "fedur-shared-opt": [*tiny, "--optim.optimizer_state", "shared", "--method", "FedUR"],
        "fedur-cpl-grip": [*tiny, "--method", "FedUR", "--labeller", "CPL", "--labeller.per_class", "grip",
                           "--labeller.quantiles", "[0.6, 0.9]"],
        "promptprox-mu": [*tiny, "--method", "PromptProx", "--method.mu", "0.1"],
        "pfedprompt-alpha": [*tiny, "--method", "PFedPrompt", "--method.cache_alpha", "0.5", "--method.cache_beta", "3"],
        "fedotp-eps": [*tiny, "--method", "FedOTP", "--method.eps", "0.2", "--method.top_percent", "0.5"],
        "fedur-fpl8": [*tiny, "--method", "FedUR", "--labeller", "FPL", "--labeller.per_class", "8",
                       "--labeller.class_weights", "inv", "--labeller.negatives", "threshold"],
        "scaffold-plain": [*tiny, "--method", "SCAFFOLD", "--optim.momentum", "0", "--optim.weight_decay", "0",
                           "--optim.schedule", "constant", "--federation.join_rate", "0.75"],
        "fedur-constant": [*tiny, "--method", "FedUR", "--optim.schedule", "constant"],
    })
    domains = ["--dataset", "SyntheticDomains", "--dataset.classes", "5", "--dataset.train_per_class", "12",
               "--dataset.test_per_class", "4", "--dataset.domains", "[photo, sketch, mosaic]", "--federation.partition",
               "domain_dirichlet", "--federation.clients_per_domain", "2", "--evaluation.held_out_domain", "mosaic"]
    for m in methods:  # the evaluation protocols, every method: new clients, base-to-novel, a held-out domain
        name = m.__name__
        out[f"protocols-new-{name.lower()}"] = [*tiny, "--method", name, "--evaluation.new_clients", "1"]
        out[f"protocols-b2n-{name.lower()}"] = [*tiny, "--method", name, "--evaluation.base_to_novel", "true"]
        out[f"protocols-lodo-{name.lower()}"] = [*tiny, "--method", name, *domains]
    out["protocols-fedur-mean"] = [*tiny, "--method", "FedUR", "--method.global_text", "mean", "--evaluation.new_clients", "1"]
    out["protocols-fedur-global-off"] = [*tiny, "--method", "FedUR", "--evaluation.global_model", "false"]
    out["protocols-fedur-shared-test"] = [*tiny, "--method", "FedUR", "--federation.partition", "iid"]
    out.update({f"smoke-{m.__name__.lower()}": [*smoke, "--method", m.__name__] for m in methods})
    out["smoke-fedur-g2"] = [*smoke, "--run.clients_per_step", "2", "--method", "FedUR"]
    out["smoke-fedur-workers2"] = [*smoke, "--data.num_workers", "2", "--method", "FedUR"]  # its order changed on purpose
    out.update(shared_cases())
    return out


def shared_cases() -> dict[str, list[str]]:
    """The cases the test files share (tests/shared_runs.py: one mechanism each, privacy, clients that drop, lag and
    attack), as the tests run them: "shared-<name>"."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.shared_runs import SHARED, SPECIAL

    return {f"shared-{name}": [*SHARED, *args] for name, args in SPECIAL.items()}


# ---------------------------------------------------------------- the pre-plugin command line

LEGACY_LABELLER_KEYS = {"per_class": None, "quantiles": "cpl_quantiles"}  # per_class: fpl_ or cpl_ by labeller
LEGACY_METHOD_KEYS = {"mu": "prox_mu", "eps": "ot_eps", "top_percent": "ot_top_percent", "max_iter": "ot_max_iter",
                      "thresh": "ot_thresh"}


def legacy(args: list[str]) -> list[str]:
    """`args` for fedur before plugins: --method X -> --method.name x, --labeller L -> --method.labeller l,
    --labeller.k -> --labels.k, --method.k -> --method.<old k>, configs/tiny.yaml -> tests/tiny.yaml."""
    out, labeller = [], None
    for flag, value in zip(args[0::2], args[1::2]):
        value = value.replace("configs/tiny.yaml", "tests/tiny.yaml")
        if flag == "--method":
            out += ["--method.name", value.lower()]
        elif flag == "--labeller":
            labeller = value.lower()
            out += ["--method.labeller", labeller]
        elif flag.startswith("--labeller."):
            key = flag.split(".", 1)[1]
            key = (f"{labeller}_per_class" if key == "per_class" else LEGACY_LABELLER_KEYS.get(key) or key)
            out += [f"--labels.{key}", value]
        elif flag.startswith("--method."):
            key = flag.split(".", 1)[1]
            out += [f"--method.{LEGACY_METHOD_KEYS.get(key, key)}", value]
        else:
            out += [flag, value]
    return out


def run(repo: Path, out: Path, is_legacy: bool, names: list[str]) -> int:
    """Every case (or those `names`) with the checkout `repo`'s fedur into `out`/<case>; 1 when a run failed."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FEDUR_CACHE_DIR": str(out / ".cache"), "PYTHONPATH": str(repo)}
    failed = []
    for name, args in cases().items():
        if names and name not in names:
            continue
        folder = out / name
        if (folder / "summary.json").exists():
            continue
        argv = [*(legacy(args) if is_legacy else args), "--run.output_dir", str(folder), "--run.progress", "false"]
        done = subprocess.run([sys.executable, "-m", "fedur.main", *argv], cwd=repo, env=env, capture_output=True, text=True)
        print(f"{name}: exit {done.returncode}", (done.stderr.strip().splitlines() or [""])[-1][:200], flush=True)
        if done.returncode:
            failed.append(name)
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def tensors(obj, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {name: t for key, value in items for name, t in tensors(value, f"{prefix}.{key}").items()}


def first_round(run: Path) -> int:
    """The number a run gives its first round in its files: 0 before fedur counted rounds from 1 (checkpoint
    format 1), 1 since (format 2)."""
    marker = next(run.glob("checkpoints/round_*/COMMITTED.json"), None)
    return 1 if marker is None or json.loads(marker.read_text()).get("format", 1) >= 2 else 0


def numbered(path: Path, first: int) -> Path:
    """`path` with a checkpoint folder round_NNNNN named by rounds completed (so both numberings compare)."""
    return Path(*(f"round_{int(p[6:]) + 1 - first:05d}" if p.startswith("round_") and p[6:].isdigit() else p for p in path.parts))


def differences(a: Path, b: Path) -> list[str]:
    found = []
    firsts = [first_round(d) for d in (a, b)]
    rows = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] if (d / "metrics.jsonl").exists()
            else [] for d in (a, b)]
    if len(rows[0]) != len(rows[1]):
        found.append(f"rounds: {len(rows[0])} vs {len(rows[1])}")
    for x, y in zip(*rows):
        x, y = ({**row, "round": row["round"] + 1 - first} for row, first in zip((x, y), firsts))  # rounds completed
        # a key only the newer run's line has is an addition (upload_bytes, method), like a summary key
        keys = sorted(k for k in x if k not in TIMING and x.get(k) != y.get(k))
        if keys:
            found.append(f"metrics round {x['round']}: {keys}")
    summaries = [json.loads((d / "summary.json").read_text()) for d in (a, b)]
    for summary, first in zip(summaries, firsts):
        if summary.get("best_round") is not None:
            summary["best_round"] += 1 - summary.get("first_round", first)
    found += [f"summary {k}" for k in summaries[0] if k not in SUMMARY_SKIP and summaries[0][k] != summaries[1].get(k)]
    for name in ("zero_shot.json", "partition.json", "confusion.json"):
        texts = [(d / name).read_text() if (d / name).exists() else None for d in (a, b)]
        if texts[0] != texts[1]:
            found.append(name)
    files = [{numbered(p.relative_to(d), first): p for p in d.rglob("*.pt")} for d, first in zip((a, b), firsts)]
    if set(files[0]) != set(files[1]):
        found.append(f".pt files: {sorted(set(files[0]) ^ set(files[1]))}")
    for path in sorted(files[0]):
        if path not in files[1]:
            continue
        x, y = (tensors(torch.load(side[path], weights_only=True)) for side in files)
        if set(x) - set(y):  # a tensor the newer run lacks (one it adds is an addition, like a summary key)
            found.append(f"{path}: missing {sorted(set(x) - set(y))}")
        found += [f"{path}{k}" for k in sorted(x.keys() & y.keys())
                  if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not torch.equal(x[k], y[k])]
    return found


def compare(before: Path, after: Path, names: list[str]) -> int:
    names = names or sorted(p.name for p in before.iterdir() if (p / "summary.json").exists())
    same = 0
    for name in names:
        if not (after / name / "summary.json").exists():
            print(f"{name}: missing in {after}")
            continue
        found = differences(before / name, after / name)
        same += not found
        print(f"{name}: {'identical' if not found else 'DIFFERENT'}", *found[:6], sep="\n    " if found else "")
    print(f"{same} of {len(names)} identical")
    return 0 if same == len(names) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the cases with a checkout's fedur")
    r.add_argument("repo", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--legacy", action="store_true", help="the checkout predates plugins (its old command line)")
    r.add_argument("names", nargs="*", help="only these cases")
    c = sub.add_parser("compare", help="compare two folders of runs")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("names", nargs="*")
    args = parser.parse_args()
    if args.command == "run":
        return run(args.repo.resolve(), args.out.resolve(), args.legacy, args.names)
    return compare(args.before, args.after, args.names)


if __name__ == "__main__":
    sys.exit(main())
