"""Does every method learn on the demo? Each method with its own labeller vs zero-shot on configs/smoke.yaml, over
seeds, on CPU.

The demo CLIP (fedur/model/weights/fedur-demo.pt, see its model card) separates the ten shapes well but
names them wrongly in a structured way: zero-shot is ~58%, a linear probe ~93%. This runs
`fedur/main.py --config configs/smoke.yaml` once per variant and seed (a baseline with its demo preset,
configs/presets/demo/<method>.yaml: the learning rate the sweep below chose for it) and writes a Markdown
table of zero-shot client mean, final mean and gain; `tests/test_learning.py` takes its margins from it.

    python benchmarks/demo_learning.py                    # 5 seeds x every variant below, ~15 min on 2 CPU cores
    python benchmarks/demo_learning.py --seeds 1,2,3 --variants fedur
    python benchmarks/demo_learning.py --sweep-lr 0.002,0.005,0.01,0.02,0.05 --variants promptfl,fedotp \
        --out benchmarks/results/demo_lr_sweep.md        # each variant at each lr, its preset's other settings kept

Every run is a fresh process; finished runs in the same --workdir are reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fedur import plugins
from fedur.launch_env import AVX2_CAP

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "configs" / "presets" / "demo"
# CPU kernels pick their vector instructions from the machine, so a seed near a tie can end differently on an AVX2
# and an AVX-512 machine; every run here is capped at AVX2 (fedur.launch_env.AVX2_CAP; a variable already set wins).
CAPPED = ("Every run with its CPU kernels capped at AVX2 (" + ", ".join(f"{k}={v}" for k, v in AVX2_CAP.items())
          + ", unless set otherwise; each run's summary.json environment says which), so that AVX2 and AVX-512 "
          "machines compute the same bits (docs/learning.md).")

# Every one of fedur's methods that has rounds (fedur/plugins.py: a method added to fedur is measured with nothing
# listed here), each with its demo preset where it has one (configs/presets/demo/<key>.yaml) ...
VARIANTS = {cls.key: ["--method", cls.__name__] for cls in plugins.builtin("method") if cls().rounds(1)}
# ... and the diagnostics below, each a question about one method.
DIAGNOSTICS = {
    # FedUR and SCAFFOLD with plain SGD at one rate, and SCAFFOLD with FedUR's optimizer (momentum, weight decay,
    # cosine: its correction added before SGD applies them) instead of its demo preset's plain SGD
    "fedur-sgd": ["--optim.momentum", "0", "--optim.weight_decay", "0", "--optim.schedule", "constant"],
    "scaffold-fedur-optim": ["--method", "SCAFFOLD"],
    # FedPGP with its published optimizer (configs/presets/fedpgp.yaml: a constant rate, weight decay 5e-4) at the demo's lr
    "fedpgp-published-optim": ["--method", "FedPGP", "--optim.schedule", "constant", "--optim.weight_decay", "0.0005"],
    # FedPGP without its contrastive term: the shared prompt and the personal low-rank term alone
    "fedpgp-mu0": ["--method", "FedPGP", "--method.mu", "0"],
    # FedPGP given twice the demo's rounds: its contrastive term costs accuracy in the first rounds
    "fedpgp-10-rounds": ["--method", "FedPGP", "--federation.rounds", "10"],
    # FedTPG at its demo preset but with each of the two settings its preset's review changed put back: every client
    # conditioning on every class (--method.classes all), and SGD momentum reset every round
    "fedtpg-classes-all": ["--method", "FedTPG", "--config", str(PRESETS / "fedtpg.yaml"), "--method.classes", "all"],
    "fedtpg-momentum-reset": ["--method", "FedTPG", "--config", str(PRESETS / "fedtpg.yaml"), "--optim.optimizer_state", "reset"],
    # SCAFFOLD at its demo preset with FedUR's weighting (selected pseudo-labels) instead of Algorithm 1's mean
    "scaffold-selected": ["--method", "SCAFFOLD", "--config", str(PRESETS / "scaffold.yaml"), "--method.weighting", "selected"],
    # FedPHA at its demo preset but pseudo-labelling every round, the demo's (its preset fixes its labels)
    "fedpha-refresh-every-round": ["--method", "FedPHA", "--config", str(PRESETS / "fedpha.yaml"), "--federation.refresh_every", "1"],
    # FedCoCoOp at the demo's batch 32 and from a random context (its demo preset takes CoCoOp's batch of 1 and its
    # "a photo of a"), and at batch 1 from a random context
    "fedcocoop-batch32": ["--method", "FedCoCoOp", "--config", str(PRESETS / "fedcocoop.yaml"), "--optim.batch_size", "32",
                          "--method.ctx_init", "null"],
    "fedcocoop-random-context": ["--method", "FedCoCoOp", "--config", str(PRESETS / "fedcocoop.yaml"), "--method.ctx_init", "null"],
    # DP-FPL at its demo preset with its local noise on (z_l 1: std 10 on each factor's gradient every step), and with the
    # tangent-space projection in place of its original's rebuilt gradient
    "dpfpl-local-noise-1": ["--method", "DPFPL", "--config", str(PRESETS / "dpfpl.yaml"), "--method.local_noise", "1"],
    "dpfpl-projection": ["--method", "DPFPL", "--config", str(PRESETS / "dpfpl.yaml"), "--method.gradient", "projection"],
}
ALL = {**VARIANTS, **DIAGNOSTICS}


def variant_flags(variant: str, lr: str | None) -> list[str]:
    """The variant's flags: with its demo preset (if it has one), whose learning rate a swept `lr` replaces (the
    preset's other settings, a method's own weighting or optimizer, stay)."""
    preset = PRESETS / f"{variant}.yaml"
    flags = [*ALL[variant], *(["--config", str(preset)] if preset.is_file() else [])]
    return flags if lr is None else [*flags, "--optim.lr", lr]


def run(variant: str, seed: int, args: argparse.Namespace, lr: str | None = None) -> dict:
    out = args.workdir / (f"{variant}-seed{seed}" if lr is None else f"{variant}-lr{lr}-seed{seed}")
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    cmd = [
        sys.executable, str(REPO / "fedur" / "main.py"), "--config", str(args.config),
        "--run.seed", str(seed), "--federation.partition_seed", str(seed),  # a demo of its own per seed
        "--run.output_dir", str(out), "--run.progress", "false", *variant_flags(variant, lr),
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**AVX2_CAP, **os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"[{variant} seed {seed}] failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    print(
        f"[{variant}{'' if lr is None else f' lr {lr}'} seed {seed}] zero-shot {summary['zero_shot_client_mean']:.2f}  "
        f"final {summary['final_mean_accuracy']:.2f}  ({time.perf_counter() - start:.0f} s)", flush=True,
    )
    return summary


def parallel(cases: list[tuple[str, int, str | None]], args: argparse.Namespace) -> dict:
    """{(variant, seed, lr): summary} of every case, `args.jobs` runs at a time (each its own process)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {case: pool.submit(run, case[0], case[1], args, case[2]) for case in cases}
        return {case: future.result() for case, future in futures.items()}


def gain(summary: dict) -> float:
    return summary["final_mean_accuracy"] - summary["zero_shot_client_mean"]


def write_measured(path: Path, results: dict[str, dict[int, dict]], call: str) -> None:
    """The numbers tests/test_learning.py and tests/test_bf16.py take their margins from: per variant and seed, the
    zero-shot client mean and the final mean; variants measured before (in the file already) are kept."""
    measured = json.loads(path.read_text())["variants"] if path.is_file() else {}
    for variant, by_seed in results.items():
        flags = [f.replace(f"{REPO}/", "") for f in variant_flags(variant, None)]  # paths relative to the checkout
        measured[variant] = {str(seed): {"zero_shot": s["zero_shot_client_mean"], "final": s["final_mean_accuracy"],
                                         "flags": flags} for seed, s in by_seed.items()}
    path.write_text(json.dumps({"command": call.strip("`"), "capped": AVX2_CAP, "variants": measured}, indent=1) + "\n")


def table(results: dict[str, dict[int, dict]]) -> str:
    lines = [
        "| method | seed | zero-shot client mean | final mean | gain |",
        "|---|---|---|---|---|",
    ]
    for variant, by_seed in results.items():
        gains = [gain(s) for s in by_seed.values()]
        for seed, s in by_seed.items():
            lines.append(
                f"| {variant} | {seed} | {s['zero_shot_client_mean']:.2f} | {s['final_mean_accuracy']:.2f} | {gain(s):+.2f} |"
            )
        lines.append(f"| {variant} | min / mean gain | | | {min(gains):+.2f} / {statistics.fmean(gains):+.2f} |")
    return "\n".join(lines)


def sweep_table(results: dict[str, dict[str, dict[int, dict]]], seeds: list[int]) -> str:
    """Per variant and lr: each seed's gain, the smallest and the mean; the lr with the largest smallest gain
    (ties: the larger mean) in bold."""
    lines = [f"| method | lr | {' | '.join(f'seed {s}' for s in seeds)} | min / mean gain |",
             f"|---|---|{'---|' * len(seeds)}---|"]
    for variant, by_lr in results.items():
        best = max(by_lr, key=lambda lr: (min(map(gain, by_lr[lr].values())), statistics.fmean(map(gain, by_lr[lr].values()))))
        for lr, by_seed in by_lr.items():
            gains = [gain(by_seed[s]) for s in seeds]
            mark = "**" if lr == best else ""
            lines.append(f"| {variant} | {mark}{lr}{mark} | {' | '.join(f'{g:+.2f}' for g in gains)} | "
                         f"{mark}{min(gains):+.2f} / {statistics.fmean(gains):+.2f}{mark} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "smoke.yaml")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--variants", default=",".join(ALL), help=f"comma-separated, of: {', '.join(ALL)}")
    parser.add_argument("--sweep-lr", default=None, help="comma-separated learning rates: a sweep table instead")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedur-demo-learning"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each a process of one thread)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "demo_learning.md")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    config = args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config
    call = f"`python benchmarks/demo_learning.py --seeds {args.seeds} --variants {args.variants}"
    if args.sweep_lr:
        lrs = args.sweep_lr.split(",")
        done = parallel([(v, seed, lr) for v in variants for lr in lrs for seed in seeds], args)
        results = {v: {lr: {seed: done[v, seed, lr] for seed in seeds} for lr in lrs} for v in variants}
        text = (f"# Learning rates on the demo ({config})\n\n{call} --sweep-lr {args.sweep_lr}`: each method with its "
                "own labeller at each learning rate, gain of the final mean client accuracy over zero-shot (points); "
                "in bold the lr with the largest smallest gain. A baseline's demo preset (configs/presets/demo/) takes it; "
                "FedUR and FedCoPL keep the demo's 0.002 under both protocols, as the paper runs them with one "
                f"setting. {CAPPED}\n\n" + sweep_table(results, seeds) + "\n")
    else:
        done = parallel([(v, seed, None) for v in variants for seed in seeds], args)
        results = {v: {seed: done[v, seed, None] for seed in seeds} for v in variants}
        presets = [v for v in variants if (PRESETS / f"{v}.yaml").is_file()]
        text = (f"# Every method on the demo ({config})\n\n{call}`: one process per run, mean client accuracy (%) on "
                f"each client's test split; {', '.join(presets) or 'no variant'} with its demo preset "
                f"(configs/presets/demo/). {CAPPED}\n\n" + table(results) + "\n")
        write_measured(args.out.with_suffix(".json"), results, call)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
