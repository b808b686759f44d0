"""What a run leaves behind: config.yaml, metrics.jsonl, summary.json, TensorBoard events, final prompts.

Only rank 0 writes run files (the per-client values it writes were gathered to it first), except the
final prompts: each rank saves the text prompts of its own clients.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from lightning import Fabric
from lightning.fabric.loggers import TensorBoardLogger
from torch import Tensor


def accuracies(counts: Tensor) -> list[float | None]:
    """Per-client accuracy in % from (K, 2) [correct, total]; None for a client without test images."""
    return [100.0 * float(c) / float(n) if n > 0 else None for c, n in counts.tolist()]


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


class Recorder:
    def __init__(self, fabric: Fabric, run_dir: Path, start_round: int = 0) -> None:
        """`start_round` > 0 continues a resumed run: metrics.jsonl keeps its first `start_round` lines and
        TensorBoard appends to the same event directory, dropping events of later steps."""
        self.fabric, self.run_dir = fabric, run_dir
        self.writer = fabric.is_global_zero
        self.rounds: list[dict] = []
        self.zero_shot: dict = {}
        self.tensorboard = None
        if self.writer:
            purge = {"purge_step": start_round + 1} if start_round > 0 else {}
            self.tensorboard = TensorBoardLogger(root_dir=str(run_dir), name="", version="tensorboard", **purge)
            if start_round > 0:
                self.rounds = self._truncate_metrics(start_round)

    def _truncate_metrics(self, rounds: int) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines()[:rounds] if path.exists() else []
        path.write_text("".join(line + "\n" for line in lines))
        return [json.loads(line) for line in lines]

    def start(self, config_yaml: str, description: str) -> None:
        if self.writer:
            (self.run_dir / "config.yaml").write_text(config_yaml)
            if self.tensorboard is not None:
                self.tensorboard.experiment.add_text("config", f"```\n{config_yaml}\n```", 0)
        self.fabric.print(description)

    def record_zero_shot(self, counts: Tensor) -> None:
        per_client = accuracies(counts)
        total = counts.sum(dim=0)
        self.zero_shot = {
            "zero_shot_client_mean": mean(per_client),
            "zero_shot_client_accuracy": per_client,
            # the client test sets partition the whole test set, so this is zero-shot on the test set
            "zero_shot_global": 100.0 * float(total[0]) / max(float(total[1]), 1.0),
        }
        self.fabric.print(
            f"zero-shot CLIP: client mean {_fmt(self.zero_shot['zero_shot_client_mean'])}%, "
            f"global {self.zero_shot['zero_shot_global']:.2f}%"
        )
        # TensorBoard step = rounds completed, so the accuracy curve starts at zero-shot CLIP (step 0)
        self._scalars({"accuracy/mean": self.zero_shot["zero_shot_client_mean"]}, step=0)

    def record_round(self, row: dict) -> None:
        self.rounds.append(row)
        if not self.writer:
            return
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        step = row["round"] + 1
        scalars = {
            "accuracy/mean": row["mean_accuracy"],
            "optim/lr": row["lr"],
            "time/round_seconds": row["round_seconds"],
            "comm/bytes_total": sum(row["bytes_sent"]),
            "pseudo_labels/accuracy_mean": mean(row["pseudo_label_accuracy"]),
        }
        for k, acc in enumerate(row["client_accuracy"]):
            scalars[f"accuracy/client_{k:03d}"] = acc
            scalars[f"pseudo_labels/accuracy_client_{k:03d}"] = row["pseudo_label_accuracy"][k]
            scalars[f"pseudo_labels/selected_client_{k:03d}"] = row["selected"][k]
            scalars[f"loss/client_{k:03d}"] = row["loss"][k]
        for name in ("loss", "loss_pos", "loss_neg"):
            scalars[f"loss/{name}_mean"] = mean(row[name])
        self._scalars(scalars, step)
        self.fabric.print(
            f"round {step:>3}/{row['rounds']}  acc {_fmt(row['mean_accuracy'])}%  "
            f"pseudo-label acc {_fmt(mean(row['pseudo_label_accuracy']))}%  "
            f"selected {sum(row['selected'])}  loss {_fmt(mean(row['loss']), 4)}  lr {row['lr']:.4f}  "
            f"{row['round_seconds']:.1f}s"
        )

    def _scalars(self, scalars: dict, step: int) -> None:
        if self.tensorboard is not None:
            clean = {k: v for k, v in scalars.items() if v is not None and math.isfinite(v)}
            self.tensorboard.log_metrics(clean, step=step)

    def save_prompts(self, shared: dict[str, Tensor], clients: list) -> None:
        """prompts/global.pt: the shared prompts (rank 0); prompts/client_XXX.pt: the visual prompt and
        text context each client classifies with (written by the rank that hosts it)."""
        folder = self.run_dir / "prompts"
        folder.mkdir(exist_ok=True)
        if self.writer and shared:
            torch.save({name: t.cpu() for name, t in shared.items()}, folder / "global.pt")
        for client in clients:
            state = {"client_id": client.client_id, "visual": client.visual.cpu(), "text_ctx": client.text_ctx.cpu()}
            torch.save(state, folder / f"client_{client.client_id:03d}.pt")

    def finish(self, settings: dict, extra: dict) -> dict:
        final = self.rounds[-1] if self.rounds else {}
        best = max(self.rounds, key=lambda r: r["mean_accuracy"] or -1.0) if self.rounds else {}
        summary = {
            "final_mean_accuracy": final.get("mean_accuracy"),
            "final_client_accuracy": final.get("client_accuracy"),
            "best_mean_accuracy": best.get("mean_accuracy"),
            "best_round": best.get("round"),
            **self.zero_shot,
            "rounds_completed": len(self.rounds),
            **extra,
            "settings": settings,
        }
        if self.writer:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            if self.tensorboard is not None:
                self.tensorboard.finalize("success")
        self.fabric.print(
            f"final mean accuracy {_fmt(summary['final_mean_accuracy'])}% (best {_fmt(summary['best_mean_accuracy'])}% "
            f"at round {summary['best_round']}); zero-shot client mean {_fmt(summary.get('zero_shot_client_mean'))}%"
        )
        return summary


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
