"""The run's sink, on rank 0 the way Fabric's loggers are: it writes the run files (config.yaml,
metrics.jsonl, summary.json, placement.json, partition.json, zero_shot.json, confusion.json and the
PNGs), logs to TensorBoard, and prints the per-round line and the closing table. It never communicates:
the round loop gathers every per-client value first. On the other ranks it only keeps the rounds.

Rounds are counted from 1 wherever they are read: the round line, metrics.jsonl's "round", summary.json's
"best_round", TensorBoard's step (step 0 is zero-shot CLIP, round r is step r). A run from before that
counted from 0 in its files (History.first_round 0, summary.json's "first_round") keeps its own numbering
there when resumed; steps and printed lines count from 1 either way. A resumed run (`start_round` > 0) starts from the History its run
directory gave back, and reopens the same tensorboard/ directory with purge_step = start_round + 1:
TensorBoard drops whatever the interrupted run logged after the last kept round, and nothing at or
below that step is logged again (its new event file named after the interrupted run's: sinks.py).

What a round's row becomes (TensorBoard's scalars, the round line) is declared field by field in
fedur/train/round_fields.py; every scalar, figure and text goes to the run's sinks (fedur/train/sinks.py:
TensorBoard) through one stream, `_scalars` and `_figure`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fedur.federated.placement import placement_lines
from fedur.metrics import accuracies, best, fmt, harmonic_mean, mean, pooled
from fedur.train.progress import QUIET, Progress, eta_seconds, format_duration
from fedur.train.round_fields import ADAPTED, CONFIG, CONFUSION, FIELD, HPARAMS, PARTITION, RELIABILITY, VIRTUAL_TIME, round_line
from fedur.train.round_fields import scalars as row_scalars
from fedur.train.run_dir import METRICS, ZERO_SHOT, History, RunDir, writing
from fedur.train.sinks import Sink
from fedur.train.trackers import open_trackers


def heatmap(*args, **kwargs):
    """fedur.plots.heatmap, imported when a figure is drawn: matplotlib is not needed before the first round."""
    from fedur.plots import heatmap as draw

    return draw(*args, **kwargs)


def zero_shot_label_free(found: dict | None, training: Tensor) -> dict:
    """zero_shot.json's label-free entries: zero-shot CLIP's estimated accuracy per client ({estimator: [K] %}), and
    with test labels its expected calibration error per client and its reliability bins pooled over the training
    clients."""
    if found is None:
        return {}
    from fedur.evaluation.calibration import ece

    out = {} if found["estimates"] is None else {"zero_shot_estimated_accuracy": found["estimates"]}
    per_client = [ece(bins) for bins in found["bins"]]
    if any(e is not None for e in per_client):
        out["zero_shot_ece"] = per_client
        out["zero_shot_calibration_bins"] = found["bins"][training].sum(dim=0).tolist()
    return out


def summary_table(rounds: list[dict], zero_shot: list[float | None] | None, accuracy: bool = True) -> str:
    """Per client: zero-shot, final and best accuracy (%) with its round (without test labels, no
    `accuracy`: none of these), selected count in the final round; then the mean over the training clients
    (best: of the mean curve; a new client, evaluation.new_clients, is marked and left out of it)."""
    num_clients = len(rounds[-1]["client_accuracy"])
    zero_shot = zero_shot or [None] * num_clients
    new = set(rounds[-1].get("new_clients") or [])

    def at_round(index: int | None) -> str:
        return "n/a" if index is None else f"{index + 1}"  # the rows are every round in order: row i is round i + 1

    lines = []
    for k in range(num_clients):
        curve = [r["client_accuracy"][k] for r in rounds]
        value, at = best(curve)
        lines.append([f"{k}" + (" (new)" if k in new else ""), fmt(zero_shot[k]), fmt(curve[-1]), fmt(value), at_round(at),
                      fmt(rounds[-1]["selected"][k], 0)])
    value, at = best([r["mean_accuracy"] for r in rounds])
    kept = [k for k in range(num_clients) if k not in new]
    lines.append(["mean", fmt(mean([zero_shot[k] for k in kept])), fmt(rounds[-1]["mean_accuracy"]), fmt(value), at_round(at),
                  fmt(mean([rounds[-1]["selected"][k] for k in kept]), 0)])
    header = ["client", "zero-shot", "final", "best", "at round", "selected"]
    if not accuracy:
        lines = [[row[0], row[-1]] for row in lines]
        header = ["client", "selected"]
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header, *lines])


class Recorder:
    def __init__(
        self, run_dir: RunDir, enabled: bool, history: History | None = None, start_round: int = 0,
        progress: Progress = QUIET, figures: bool = True, loggers: tuple[str, ...] = ("tensorboard",),
    ) -> None:
        self.run_dir, self.enabled, self.start_round, self.progress = run_dir, enabled, start_round, progress
        self.figures = figures  # run.figures: draw the heatmaps (else the numbers only)
        history = history or History()
        self.first_round = history.first_round  # the number of the first round in this run's files
        self.rounds: list[dict] = list(history.rounds)
        self.zero_shot: dict = dict(history.zero_shot)
        self.placement: dict = {}
        self.classnames: list[str] = []
        self.test_labels = True  # False: no accuracy to report (note_unlabelled)
        self.adapted: dict = {}  # the new clients' accuracy after adapting (record_adapted)
        self.skipped: list[str] = []  # the images left out as unreadable (note_skipped)
        self.startup: dict[str, float] = {}  # where this session's time before its first round went (seconds)
        self.loggers = loggers  # run.loggers: the trackers the sinks are (fedur/train/trackers.py)
        self.sinks: list[Sink] = []  # opened with the first round's record (`open_sinks`)
        self.deferred: list | None = [] if enabled else None  # what waits for them: TensorBoard's step 0, the figures

    def open_sinks(self) -> None:
        """The sinks (TensorBoard's writer), and what waited for them: nothing a run needs before its first round is
        imported or drawn before it (TensorBoard, matplotlib); called with the first round's record, or at the finish."""
        if self.deferred is None:
            return
        self.sinks = open_trackers(list(self.loggers), self.run_dir.root, self.start_round, self.note)
        waiting, self.deferred = self.deferred, None
        for write in waiting:
            write()

    def later(self, write: Callable[[], None]) -> None:
        """`write()` now, or once the sinks are open (`open_sinks`), in the order asked."""
        if self.deferred is not None:
            self.deferred.append(write)
        elif self.enabled:
            write()

    def note(self, line: str) -> None:
        """Print a line (rank 0; not fabric.print, which prints once per node)."""
        if self.enabled:
            self.progress.write(line)

    def _logs(self, step: int) -> bool:
        """TensorBoard gets this step: rank 0, and after a resume only steps the kept rounds did not log."""
        return self.enabled and (self.start_round == 0 or step > self.start_round)

    def _write_json(self, name: str, content: dict) -> None:
        """One top-level key per line, each value compact (matrices stay one line each)."""
        if self.enabled:
            lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in content.items()]
            with writing(self.run_dir.path(name)):
                self.run_dir.path(name).write_text("{\n" + ",\n".join(lines) + "\n}\n")

    def _figure(self, draw, tag: str | None, step: int, file: str | None = None) -> None:
        """A figure (`draw()` builds it: fedur.plots) to a PNG in the run directory and/or to the sinks' images, drawn
        once for all, when the sinks are open."""
        logs = tag is not None and self._logs(step)
        if not self.figures or (not logs and file is None):
            return

        def write() -> None:
            from fedur.plots import close, rendered, write_png

            fig = draw()
            pixels = rendered(fig)  # (H, W, 3) uint8
            close(fig)
            if logs:
                for sink in self.sinks:
                    sink.image(tag, pixels, step)
            if file is not None:
                with writing(self.run_dir.path(file)):
                    write_png(pixels, self.run_dir.path(file))

        self.later(write)

    def start(self, config_yaml: str, description: str) -> None:
        """config.yaml; a resumed run keeps it and writes its own settings next to it."""
        if self.enabled:
            name = f"config.resumed-at-round-{self.start_round + 1}.yaml" if self.start_round else "config.yaml"
            with writing(self.run_dir.path(name)):
                self.run_dir.path(name).write_text(config_yaml)
        if self._logs(0):
            def text() -> None:
                for sink in self.sinks:
                    sink.text(CONFIG, f"```\n{config_yaml}\n```", 0)

            self.later(text)
        self.note(description)

    def record_placement(self, placement: dict) -> None:
        """placement.json (federated/placement.py::placement_table) and one printed line per rank."""
        self.placement = placement
        self._write_json("placement.json", placement)
        for line in placement_lines(placement):
            self.note(line)

    def record_partition(self, partition: dict) -> None:
        """partition.json (fedur/train/setup.py::partition_record: each client's class counts and image ids), and
        the client x class heatmaps of the split as partition_{train,test}.png and TensorBoard images (step 0)
        where there are labels to count."""
        self.classnames = classnames = partition["classnames"]
        self._write_json("partition.json", partition)
        if not self.enabled:
            return
        names = partition.get("client_names")
        clients = [f"client {k}" + (f" ({names[k]})" if names else "") for k in range(len(partition["train_sizes"]))]
        for name in ("train", "test"):
            if partition[name] is not None:
                counts, title = np.array(partition[name]), f"{name} images per client and class"
                self._figure(lambda counts=counts, title=title: heatmap(counts, clients, classnames, title),
                             PARTITION.replace("NAME", name), 0, file=f"partition_{name}.png")

    def note_skipped(self, skipped: list[str]) -> None:
        """The images left out as unreadable (data.corrupt_images skip): said once, on the console too, and kept for
        summary.json's skipped_images."""
        self.skipped = list(skipped)
        if skipped:
            self.note(f"{len(skipped)} unreadable image(s) left out (data.corrupt_images skip), e.g. {skipped[0]}; every "
                      f"one of them: skipped_ids in {self.run_dir.path('partition.json')} (and skipped_images in summary.json)")

    def note_unlabelled(self, train_labels: bool, test_labels: bool) -> None:
        """Say once what is not reported for want of labels (metrics.jsonl and summary.json hold null there)."""
        self.test_labels = test_labels
        if not train_labels:
            self.note("no train labels: pseudo-label accuracy is not reported; selected counts, pseudo-label "
                      "histograms (metrics.jsonl: selection) and agreement between refreshes are reported")
        if not test_labels:
            self.note("no test labels: test accuracy (per client and mean), the confusion matrix and the zero-shot "
                      "accuracy are not reported; each client's predictions per image are written to predictions/")

    def record_zero_shot(self, counts: Tensor, training: Tensor | None = None, held_out: dict[str, Tensor] | None = None,
                         label_free: dict | None = None) -> None:
        """zero_shot.json from every client's (K, 2) counts with zero-shot CLIP; the means cover the `training`
        clients ((K,) bool; None: all), the new clients' (evaluation.new_clients) come apart. `label_free`
        (fedur/train/label_free.py::zero_shot): its estimated accuracies and, with test labels, its calibration."""
        training = torch.ones(len(counts), dtype=torch.bool, device="cpu") if training is None else training
        per_client = accuracies(counts)
        new = [per_client[k] for k in torch.nonzero(~training).flatten().tolist()]
        self.zero_shot = {
            "zero_shot_client_mean": mean([acc for acc, t in zip(per_client, training.tolist()) if t]),
            "zero_shot_client_accuracy": per_client,
            # the training clients' test images pooled: the whole test set when their test sets partition it
            "zero_shot_global": pooled(counts[training]),
            **({"zero_shot_new_clients": mean(new)} if new else {}),
            **({"zero_shot_held_out": {name: accuracies(c.view(1, 2))[0] for name, c in held_out.items()}} if held_out else {}),
            **zero_shot_label_free(label_free, training),
        }
        self._write_json(ZERO_SHOT, self.zero_shot)
        if self.test_labels:
            self.note(
                f"zero-shot CLIP: client mean {fmt(self.zero_shot['zero_shot_client_mean'])}%, "
                f"global {self.zero_shot['zero_shot_global']:.2f}%"
                + "".join(f", {name} {fmt(acc)}%" for name, acc in self.zero_shot.get("zero_shot_held_out", {}).items())
            )
        before = {"mean_accuracy": self.zero_shot["zero_shot_client_mean"], "client_accuracy": per_client,
                  "held_out_accuracy": self.zero_shot.get("zero_shot_held_out", {}),  # zero-shot CLIP as a round's fields
                  "estimated_accuracy": {"zero_shot": self.zero_shot.get("zero_shot_estimated_accuracy")},
                  "ece": {"zero_shot": self.zero_shot.get("zero_shot_ece")}}
        self._scalars(row_scalars(before), step=0)

    def record_round(self, row: dict) -> None:
        self.rounds.append(row)
        if not self.enabled:
            return
        with writing(self.run_dir.path(METRICS)), open(self.run_dir.path(METRICS), "a") as f:
            f.write(json.dumps(row) + "\n")
        self.open_sinks()
        step = row["round"] + 1 - self.first_round  # rounds completed, from 1
        self._scalars(row_scalars(row, self.rounds[:-1]), step)
        if row.get("selection") is not None and self._logs(step):  # (K, C) selected counts, refresh rounds
            selection = np.array(row["selection"])
            classes = self.classnames or [str(c) for c in range(selection.shape[1])]
            self._figure(lambda: heatmap(selection, [f"client {k}" for k in range(len(selection))], classes,
                                         f"selected pseudo-labels, round {step}"), FIELD["selection"].image, step)
        session = self.rounds[self.start_round:]  # the pace of this process, not of an interrupted one
        left = eta_seconds(sum(r["round_seconds"] for r in session), len(session), row["rounds"] - step)
        unit = "step" if "version" in row else "round"  # an asynchronous server's steps (docs/asynchronous.md)
        self.note("  ".join([f"{unit} {step:>3}/{row['rounds']}", *round_line(row, self.test_labels),
                             f"eta {format_duration(left)}"]))

    def record_adapted(self, counts: Tensor, training: Tensor) -> None:
        """The new clients' (evaluation.new_clients) accuracy after adapting alone, from (K, 2) counts (the
        training clients' rows unused): summary.json's new_client_adapted_accuracy and TensorBoard's
        accuracy/new_clients_adapted at the step after the last round's (a resume after the last commit logs it)."""
        per_client = accuracies(counts)
        new = torch.nonzero(~training).flatten().tolist()
        self.adapted = {"new_client_adapted_accuracy": mean([per_client[k] for k in new]),
                        "new_client_adapted_client_accuracy": {str(k): per_client[k] for k in new}}
        self._scalars({ADAPTED: self.adapted["new_client_adapted_accuracy"]}, len(self.rounds) + 1)
        if self.test_labels:
            arrived = self.rounds[-1].get("new_client_accuracy") if self.rounds else None
            self.note(f"new clients {', '.join(map(str, new))}: {fmt(arrived)}% as they arrive, "
                      f"{fmt(self.adapted['new_client_adapted_accuracy'])}% after adapting alone")

    def record_virtual_time(self) -> None:
        """accuracy_virtual_time.png (and TensorBoard's accuracy/virtual_time image): the personal (and global) mean
        accuracy against the virtual clock (clock.speeds ...; docs/system.md)."""
        rounds = [r for r in self.rounds if r.get("virtual_clock") is not None and r.get("mean_accuracy") is not None]
        if not rounds or not self.test_labels:
            return
        from fedur.plots import line_plot

        clock = [0.0] + [r["virtual_clock"] for r in rounds]
        series = {"personal mean": (clock, [self.zero_shot.get("zero_shot_client_mean")] + [r["mean_accuracy"] for r in rounds])}
        if any(r.get("global_accuracy") is not None for r in rounds):
            series["global"] = (clock, [self.zero_shot.get("zero_shot_global")] + [r.get("global_accuracy") for r in rounds])
        self._figure(lambda: line_plot(series, "accuracy against virtual time", "virtual seconds", "accuracy (%)",
                                       integer_x=False), VIRTUAL_TIME, len(self.rounds), "accuracy_virtual_time.png")

    def record_reliability(self) -> None:
        """reliability.png (and TensorBoard's calibration/reliability image): the last round's personal models (their
        test images pooled over the training clients), the server's model and zero-shot CLIP, with their ECE."""
        bins = self.rounds[-1].get("calibration_bins") if self.rounds else None
        if bins is None or not self.test_labels:
            return
        from fedur.evaluation.calibration import ece, reliability
        from fedur.plots import reliability_diagram

        found = {"personal models": bins["personal"], "server's model": bins.get("server"),
                 "zero-shot CLIP": self.zero_shot.get("zero_shot_calibration_bins")}
        tables = {name: torch.tensor(b, device="cpu") for name, b in found.items() if b is not None}
        models = {f"{name} (ECE {fmt(ece(b))})": reliability(b) for name, b in tables.items() if ece(b) is not None}
        step = len(self.rounds)
        self._figure(lambda: reliability_diagram(models, f"reliability after round {step}"), RELIABILITY, step,
                     file="reliability.png")

    def record_confusion(self, per_client: Tensor, classnames: list[str]) -> None:
        """confusion.json and a heatmap of the (C, C) confusion matrix [true, predicted], summed over the
        clients' test sets, from the (K, C, C) per-client matrices of the final prompts."""
        matrix = per_client.sum(dim=0).numpy()
        step = len(self.rounds)
        self._write_json("confusion.json", {"round": step, "classnames": classnames, "matrix": matrix.tolist()})
        self._figure(lambda: heatmap(matrix, classnames, classnames,
                                     f"confusion after round {step} (rows: true, columns: predicted)", normalize_rows=True),
                     CONFUSION, step)

    def _scalars(self, scalars: dict[str, float | None], step: int) -> None:
        """The stream of scalars: {tag: value} at `step` to every sink (None, inf and nan left out)."""
        if self._logs(step):
            clean = {k: v for k, v in scalars.items() if v is not None and math.isfinite(v)}

            def write() -> None:
                for sink in self.sinks:
                    sink.scalars(clean, step)

            self.later(write)

    def finish(self, settings: dict, extra: dict) -> dict:
        """summary.json. The final accuracies are the last round's; with no round (zero-shot CLIP) the model
        that was evaluated is the zero-shot one."""
        self.open_sinks()
        zero_shot = self.zero_shot
        final = self.rounds[-1] if self.rounds else {  # zero-shot CLIP is its own server model
            "mean_accuracy": zero_shot.get("zero_shot_client_mean"),
            "client_accuracy": zero_shot.get("zero_shot_client_accuracy"),
            "weighted_accuracy": zero_shot.get("zero_shot_global"),
            "global_accuracy": zero_shot.get("zero_shot_global"),
            "dual_accuracy": harmonic_mean(zero_shot.get("zero_shot_client_mean"), zero_shot.get("zero_shot_global")),
            "new_client_accuracy": zero_shot.get("zero_shot_new_clients"),
            "held_out_accuracy": zero_shot.get("zero_shot_held_out", {}),
            "base_novel_harmonic": harmonic_mean(zero_shot.get("zero_shot_client_mean"),
                                                 zero_shot.get("zero_shot_held_out", {}).get("novel")),
        }
        _, at = best([r["mean_accuracy"] for r in self.rounds])
        top = self.rounds[at] if at is not None else {}
        summary = {
            "final_mean_accuracy": final.get("mean_accuracy"),
            "final_client_accuracy": final.get("client_accuracy"),
            "final_weighted_accuracy": final.get("weighted_accuracy"),
            "final_global_accuracy": final.get("global_accuracy"),
            "final_dual_accuracy": final.get("dual_accuracy"),
            "new_clients": final.get("new_clients", []),
            "final_new_client_accuracy": final.get("new_client_accuracy"),
            "final_held_out_accuracy": final.get("held_out_accuracy", {}),
            "final_novel_accuracy": (final.get("held_out_accuracy") or {}).get("novel"),
            "final_base_novel_harmonic": final.get("base_novel_harmonic"),
            "final_held_out_domain_accuracy": next((v for k, v in (final.get("held_out_accuracy") or {}).items()
                                                    if k.startswith("domain:")), None),
            **self.adapted,
            "best_mean_accuracy": top.get("mean_accuracy"),
            "best_round": top.get("round"),
            "first_round": self.first_round,  # the number of the first round in metrics.jsonl and best_round
            **self.zero_shot,
            "rounds_completed": len(self.rounds),
            "startup_seconds": self.startup,  # this session's: imports, setup, zero_shot, other, total
            **extra,
            "placement": self.placement,
            "settings": settings,
        }
        if self.enabled:
            with writing(self.run_dir.path("summary.json")):
                self.run_dir.path("summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        metrics = {f"hparams/{key}": summary.get(key) for key in HPARAMS if summary.get(key) is not None}
        for sink in self.sinks:
            sink.finish(settings, metrics, len(self.rounds))
        if self.rounds:
            self.note(summary_table(self.rounds, self.zero_shot.get("zero_shot_client_accuracy"), self.test_labels))
        if not self.rounds or not self.test_labels:  # zero-shot CLIP (nothing was trained), or no accuracy to give
            return summary
        best_round = "n/a" if at is None else at + 1
        self.note(
            f"final mean accuracy {fmt(summary['final_mean_accuracy'])}% (best {fmt(summary['best_mean_accuracy'])}% "
            f"after round {best_round}); zero-shot client mean {fmt(summary.get('zero_shot_client_mean'))}%"
        )
        if summary["final_global_accuracy"] is not None:
            self.note(f"global (the server's model on the training clients' test images) {fmt(summary['final_global_accuracy'])}%, "
                      f"dual (harmonic mean with the personal mean) {fmt(summary['final_dual_accuracy'])}%")
        return summary
