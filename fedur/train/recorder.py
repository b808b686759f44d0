"""What a run leaves behind and shows: config.yaml, metrics.jsonl, summary.json, placement.json,
partition.json, zero_shot.json, confusion.json, TensorBoard events, the final prompts; the per-round
line and the closing table.

Only rank 0 writes run files and prints (the per-client values it writes were gathered to it first),
except the final prompts: each rank saves those of its own clients. TensorBoard step = rounds completed:
step 0 is zero-shot CLIP, the round with index r in metrics.jsonl is step r + 1, as in the round line.

Resume (`start_round` > 0): the recorder keeps the first start_round rows of metrics.jsonl and cuts the
rest (so the file ends equal to an uninterrupted run's), reloads zero_shot.json, and reopens the same
tensorboard/ directory with purge_step = start_round + 1: TensorBoard drops whatever the interrupted run
logged after the last kept round, and nothing at or below that step is logged again.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch
from lightning import Fabric
from lightning.fabric.loggers import TensorBoardLogger
from torch import Tensor

from fedur.data.partition import class_histogram
from fedur.federated.collectives import Collectives
from fedur.plots import chw, heatmap
from fedur.train.progress import Progress, eta_seconds, format_duration

METRICS = "metrics.jsonl"


class ResumeError(RuntimeError):
    """The run directory does not hold what a resume at the given round needs."""


def accuracies(counts: Tensor) -> list[float | None]:
    """Per-client accuracy in % from (K, 2) [correct, total]; None for a client without test images."""
    return [100.0 * float(c) / float(n) if n > 0 else None for c, n in counts.tolist()]


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def client_histograms(
    collectives: Collectives, clients: list, train_labels: np.ndarray, test_labels: np.ndarray, num_classes: int,
    num_clients: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(K, C) class counts of every client's train and of its test images, gathered from the ranks that
    host the clients. Every rank must call this."""
    train = class_histogram(train_labels, [c.train_indices for c in clients], num_classes)  # (n_local, C)
    test = class_histogram(test_labels, [c.test_indices for c in clients], num_classes)
    local = {c.client_id: torch.from_numpy(np.concatenate([train[i], test[i]])).long() for i, c in enumerate(clients)}
    both = collectives.gather_clients(local, num_clients, like=torch.zeros(2 * num_classes, dtype=torch.long), what="class histograms").numpy()
    return both[:, :num_classes], both[:, num_classes:]  # (K, C) each


def resume_rounds(path: Path, count: int, truncate: bool) -> list[dict]:
    """The first `count` rows of metrics.jsonl; with `truncate`, the file is cut right after them."""
    if not path.is_file():
        raise ResumeError(f"cannot resume at round {count}: {path} is missing; resume needs the run directory it wrote")
    lines = path.read_bytes().split(b"\n")[:-1]  # the last piece is empty or a partly written line
    if len(lines) < count:
        raise ResumeError(
            f"cannot resume at round {count}: {path} holds only {len(lines)} complete rounds; the checkpoint is "
            "newer than the metrics, so resume from an earlier checkpoint or start a new run.output_dir"
        )
    rows = [json.loads(line) for line in lines[:count]]
    if [r["round"] for r in rows] != list(range(count)):
        raise ResumeError(f"{path}: rounds {[r['round'] for r in rows]} are not 0..{count - 1} in order")
    if truncate:  # cutting keeps the first bytes in place: other ranks may read them meanwhile
        os.truncate(path, sum(len(line) + 1 for line in lines[:count]))
    return rows


def best(values: list[float | None]) -> tuple[float | None, int]:
    """The largest present value and its index (the first on ties; (None, 0) when none is present)."""
    present = [(v, i) for i, v in enumerate(values) if v is not None]
    return max(present, key=lambda p: p[0]) if present else (None, 0)


def summary_table(rounds: list[dict], zero_shot: list[float | None] | None) -> str:
    """Per client: zero-shot, final and best accuracy (%) with its round, selected count in the final
    round; then the mean over clients (best: of the mean curve)."""
    num_clients = len(rounds[-1]["client_accuracy"])
    zero_shot = zero_shot or [None] * num_clients
    lines = []
    for k in range(num_clients):
        curve = [r["client_accuracy"][k] for r in rounds]
        value, at = best(curve)
        lines.append([f"{k}", _fmt(zero_shot[k]), _fmt(curve[-1]), _fmt(value), f"{at + 1}",
                      f"{rounds[-1]['selected'][k]}"])
    value, at = best([r["mean_accuracy"] for r in rounds])
    lines.append(["mean", _fmt(mean(zero_shot)), _fmt(rounds[-1]["mean_accuracy"]), _fmt(value),
                  f"{rounds[at]['round'] + 1}", f"{sum(rounds[-1]['selected']) / num_clients:.0f}"])
    header = ["client", "zero-shot", "final", "best", "at round", "selected"]
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header, *lines])


class Recorder:
    def __init__(self, fabric: Fabric, run_dir: Path, start_round: int = 0, progress: bool = False) -> None:
        self.fabric, self.run_dir, self.start_round = fabric, run_dir, start_round
        self.writer = fabric.is_global_zero
        self.progress = Progress(enabled=progress and self.writer)  # rank 0's bars; the others stay quiet
        self.rounds: list[dict] = resume_rounds(run_dir / METRICS, start_round, self.writer) if start_round else []
        self.zero_shot: dict = self._load_zero_shot() if start_round else {}
        self.placement: dict = {}
        self.classnames: list[str] = []
        self.tensorboard = None
        if self.writer:
            purge = {"purge_step": start_round + 1} if start_round else {}  # passed on to SummaryWriter
            self.tensorboard = TensorBoardLogger(root_dir=str(run_dir), name="", version="tensorboard", **purge)

    def _load_zero_shot(self) -> dict:
        path = self.run_dir / "zero_shot.json"
        if not path.is_file():
            raise ResumeError(f"cannot resume at round {self.start_round}: {path} is missing")
        return json.loads(path.read_text())

    def _print(self, line: str) -> None:
        if self.writer:  # not fabric.print: that prints once per node
            self.progress.write(line)

    def _logs(self, step: int) -> bool:
        """TensorBoard gets this step: rank 0, and after a resume only steps the kept rounds did not log."""
        return self.tensorboard is not None and (self.start_round == 0 or step > self.start_round)

    def _write_json(self, name: str, content: dict) -> None:
        """One top-level key per line, each value compact (matrices stay one line each)."""
        if self.writer:
            lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in content.items()]
            (self.run_dir / name).write_text("{\n" + ",\n".join(lines) + "\n}\n")

    def start(self, config_yaml: str, description: str) -> None:
        """config.yaml; a resumed run keeps it and writes its own settings next to it."""
        if self.writer:
            name = f"config.resumed-at-round-{self.start_round + 1}.yaml" if self.start_round else "config.yaml"
            (self.run_dir / name).write_text(config_yaml)
        if self._logs(0):
            self.tensorboard.experiment.add_text("config", f"```\n{config_yaml}\n```", 0)
        self._print(description)

    def record_placement(self, collectives: Collectives, clients: list, num_clients: int) -> None:
        """Gather which rank (and node) hosts each client into placement.json and print one line per rank.
        Every rank must call this."""
        f = self.fabric
        here = torch.tensor([1, f.global_rank, f.node_rank, f.local_rank])  # leading 1: client is hosted
        hosted = {c.client_id: here for c in clients}
        rows = collectives.gather_clients(hosted, num_clients, like=torch.zeros(4, dtype=torch.long), what="placement")  # (K, 4)
        if not torch.all(rows[:, 0] == 1):
            raise RuntimeError(f"clients hosted by {rows[:, 0].tolist()} ranks (client id order); expected 1 each")
        environment = getattr(f.strategy, "cluster_environment", None)
        ranks = {}
        for k, (_, rank, node, local) in enumerate(rows.tolist()):
            ranks.setdefault(rank, {"rank": rank, "node": node, "local_rank": local, "clients": []})["clients"].append(k)
        self.placement = {
            "cluster_environment": type(environment).__name__ if environment is not None else None,
            "world_size": f.world_size,
            "num_nodes": int(rows[:, 2].max()) + 1,
            "ranks": [ranks[r] for r in sorted(ranks)],
        }
        self._write_json("placement.json", self.placement)
        for r in self.placement["ranks"]:
            self._print(f"rank {r['rank']} (node {r['node']}, local rank {r['local_rank']}) hosts clients {r['clients']}")

    def record_partition(self, train_hist: np.ndarray, test_hist: np.ndarray, classnames: list[str]) -> None:
        """partition.json, and the client x class heatmaps of the split as partition_{train,test}.png and
        TensorBoard images (step 0)."""
        self.classnames = classnames
        counts = {"train": train_hist.tolist(), "test": test_hist.tolist()}
        self._write_json("partition.json", {"classnames": classnames, **counts})
        if not self.writer:
            return
        clients = [f"client {k}" for k in range(len(train_hist))]
        for name, hist in (("train", train_hist), ("test", test_hist)):
            image = heatmap(hist, clients, classnames, f"{name} images per client and class")
            image.save(self.run_dir / f"partition_{name}.png")
            if self._logs(0):
                self.tensorboard.experiment.add_image(f"partition/{name}", chw(image), 0)

    def record_zero_shot(self, counts: Tensor) -> None:
        per_client = accuracies(counts)
        total = counts.sum(dim=0)
        self.zero_shot = {
            "zero_shot_client_mean": mean(per_client),
            "zero_shot_client_accuracy": per_client,
            # the client test sets partition the whole test set, so this is zero-shot on the test set
            "zero_shot_global": 100.0 * float(total[0]) / max(float(total[1]), 1.0),
        }
        self._write_json("zero_shot.json", self.zero_shot)
        self._print(
            f"zero-shot CLIP: client mean {_fmt(self.zero_shot['zero_shot_client_mean'])}%, "
            f"global {self.zero_shot['zero_shot_global']:.2f}%"
        )
        clients = {f"accuracy/client_{k:03d}": acc for k, acc in enumerate(per_client)}
        self._scalars({"accuracy/mean": self.zero_shot["zero_shot_client_mean"], **clients}, step=0)

    def record_round(self, row: dict) -> None:
        self.rounds.append(row)
        if not self.writer:
            return
        with open(self.run_dir / METRICS, "a") as f:
            f.write(json.dumps(row) + "\n")
        step = row["round"] + 1
        scalars = {
            "accuracy/mean": row["mean_accuracy"],
            "optim/lr": row["lr"],
            "time/round_seconds": row["round_seconds"],
            "comm/bytes_total": sum(row["bytes_sent"]),
            "comm/bytes_cumulative": sum(sum(r["bytes_sent"]) for r in self.rounds),
            "pseudo_labels/accuracy_mean": mean(row["pseudo_label_accuracy"]),
            "pseudo_labels/selected_total": sum(row["selected"]),
        }
        for k, acc in enumerate(row["client_accuracy"]):
            scalars[f"accuracy/client_{k:03d}"] = acc
            scalars[f"pseudo_labels/accuracy_client_{k:03d}"] = row["pseudo_label_accuracy"][k]
            scalars[f"pseudo_labels/selected_client_{k:03d}"] = row["selected"][k]
            scalars[f"loss/client_{k:03d}"] = row["loss"][k]
        for name in ("loss", "loss_pos", "loss_neg"):
            scalars[f"loss/{name}_mean"] = mean(row[name])
        for c, weight in enumerate(row.get("class_weights") or []):  # refresh rounds with class weights on
            scalars[f"pseudo_labels/class_weight_{c:03d}"] = weight
        self._scalars(scalars, step)
        if row.get("selection") is not None and self._logs(step):  # (K, C) selected counts, refresh rounds
            selection = np.array(row["selection"])
            classes = self.classnames or [str(c) for c in range(selection.shape[1])]
            image = heatmap(selection, [f"client {k}" for k in range(len(selection))], classes,
                            f"selected pseudo-labels, round {step}")
            self.tensorboard.experiment.add_image("pseudo_labels/selection", chw(image), step)
        session = self.rounds[self.start_round:]  # the pace of this process, not of an interrupted one
        left = eta_seconds(sum(r["round_seconds"] for r in session), len(session), row["rounds"] - step)
        self._print(
            f"round {step:>3}/{row['rounds']}  acc {_fmt(row['mean_accuracy'])}%  "
            f"pseudo-label acc {_fmt(mean(row['pseudo_label_accuracy']))}%  "
            f"selected {sum(row['selected'])}  loss {_fmt(mean(row['loss']), 4)}  lr {row['lr']:.4f}  "
            f"{row['round_seconds']:.1f}s  eta {format_duration(left)}"
        )

    def record_confusion(self, per_client: Tensor, classnames: list[str]) -> None:
        """confusion.json and a heatmap of the (C, C) confusion matrix [true, predicted], summed over the
        clients' test sets, from the (K, C, C) per-client matrices of the final prompts."""
        matrix = per_client.sum(dim=0).numpy()
        step = len(self.rounds)
        self._write_json("confusion.json", {"round": step, "classnames": classnames, "matrix": matrix.tolist()})
        if self._logs(step):
            image = heatmap(matrix, classnames, classnames, f"confusion after round {step} (rows: true, columns: predicted)",
                            normalize_rows=True)
            self.tensorboard.experiment.add_image("confusion/final", chw(image), step)

    def _scalars(self, scalars: dict, step: int) -> None:
        if self._logs(step):
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
        top = self.rounds[best([r["mean_accuracy"] for r in self.rounds])[1]] if self.rounds else {}
        summary = {
            "final_mean_accuracy": final.get("mean_accuracy"),
            "final_client_accuracy": final.get("client_accuracy"),
            "best_mean_accuracy": top.get("mean_accuracy"),
            "best_round": top.get("round"),
            **self.zero_shot,
            "rounds_completed": len(self.rounds),
            **extra,
            "placement": self.placement,
            "settings": settings,
        }
        if self.writer:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if self.tensorboard is not None:
            metrics = {
                "hparams/final_mean_accuracy": summary["final_mean_accuracy"],
                "hparams/best_mean_accuracy": summary["best_mean_accuracy"],
                "hparams/zero_shot_client_mean": summary.get("zero_shot_client_mean"),
            }
            present = {k: v for k, v in metrics.items() if v is not None}
            if present:  # the settings with the final metrics, for TensorBoard's HPARAMS tab
                self.tensorboard.log_hyperparams(settings, present, step=len(self.rounds))
            self.tensorboard.finalize("success")
        if self.rounds:
            self._print(summary_table(self.rounds, self.zero_shot.get("zero_shot_client_accuracy")))
        best_round = "n/a" if summary["best_round"] is None else summary["best_round"] + 1
        self._print(
            f"final mean accuracy {_fmt(summary['final_mean_accuracy'])}% (best {_fmt(summary['best_mean_accuracy'])}% "
            f"after round {best_round}); zero-shot client mean {_fmt(summary.get('zero_shot_client_mean'))}%"
        )
        return summary


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
