"""What the recorder and fedur-report make of hand-written rounds that hold every metrics.jsonl field: the TensorBoard
scalars (tag, step, value), the other TensorBoard entries (images, text, hparams: tag and step), the console lines,
the files the recorder writes and fedur-report's Markdown. tests/train/test_round_fields.py compares them with
tests/train/recorded_outputs.json, recorded before the fields were declared in one table (fedur/train/round_fields.py):
the declarations changed none of these outputs.

An output that changes on purpose is recorded again with

    python -m tests.train.recorded_outputs

and the change to the JSON file is reviewed with the code that made it.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch

RECORDED = Path(__file__).with_suffix(".json")


def full_rows() -> list[dict]:
    """Three rounds of 3 clients (client 2 new) and 3 classes with every field there is: refreshes at rounds 1 and 3,
    central privacy (infinite epsilon at round 3), lost and late uploads (round 2 keeps the global state), held-out
    novel classes and a held-out domain, the method's own metrics, divergence and upload sizes per piece."""
    rows = []
    for r in (1, 2, 3):
        refreshed = r != 2
        acc = [40.0 + 10 * r, 60.0 + 5 * r, 30.0 + r]
        rows.append({
            "round": r, "rounds": 3, "mean_accuracy": (acc[0] + acc[1]) / 2, "client_accuracy": acc,
            "weighted_accuracy": 51.0 + r, "global_accuracy": 45.5 + r, "dual_accuracy": 48.25 + r, "new_clients": [2],
            "new_client_accuracy": acc[2], "held_out_accuracy": {"novel": 20.0 + r, "domain:photo": 33.0 - r},
            "base_novel_harmonic": 30.5 + r, "pseudo_label_accuracy": [70.0 + r, 55.5, None],
            "pseudo_label_agreement": [None] * 3 if r == 1 else [80.0, 90.0, None] if refreshed else [None] * 3,
            "selected": [6 + r, 4, 2], "selected_per_class": [5, 4, 3 + r],
            "selection": [[3, 2, 1 + r], [1, 2, 1], [1, 0, 1]] if refreshed else None,
            "class_weights": [0.75, 1.25, 1.0] if refreshed else None,
            **({"released_histograms": None, "released_totals": [5.5, 4.0, 3.25]} if refreshed else {}),
            "refreshed": refreshed, "participants": [0, 1], "lr": 0.05 / r, "loss": [1.5 / r, 2.0 / r, None],
            "loss_pos": [0.5, 0.75, None], "loss_neg": [1.0 / r, 1.25, None], "round_seconds": 12.5 + r,
            "phase_seconds": {"refresh": 2.0, "train": 8.5, "aggregate": 0.5, "evaluate": 1.5},
            "bytes_sent": [2048, 2048 * (r != 2), 0], "upload_bytes": {"text_ctx": 2048},
            "prompt_divergence": {"text_ctx": {"drift_diversity": 0.5 / r, "cosine_distance": 0.125}},
            "method": {"gpa_mass": 0.25 * r},
            "epsilon": None if r == 3 else 1.5 * r, "delta": 1e-05, "clip": 0.0625,
            "asked": [0, 1], "answered": [0] if r == 2 else [0, 1], "dropped": [1] if r == 2 else [], "late": [],
            "surplus": [], "accepted": [0] if r == 2 else [0, 1], "histograms_lost": [1] if r == 3 else [],
            "attackers_accepted": [], "kept_global": r == 2, "virtual_seconds": 3.5 + r, "virtual_clock": 3.5 * r + r * (r + 1) / 2,
            "deadline_seconds": 4.0, "client_virtual_seconds": [3.0, 3.25 + r, None], "local_steps": [4, 4, None],
            "estimated_accuracy": {"estimator": "mano", "personal": {"mano": [40.0 + r, 50.0, 30.5], "confidence": None},
                                   "server": {"mano": [38.5, 44.0 + r, 30.0], "confidence": None}},
            "server_client_accuracy": [45.0 + r, 46.5, 30.0],
            "ece": {"personal": [10.0 + r, 12.5, None], "server": 8.25 + r},
            "calibration_bins": {"personal": [[2, 1, 2**31]] + [[0, 0, 0]] * 13 + [[4, 4, 2**34]],
                                 "server": [[1, 0, 2**31]] + [[0, 0, 0]] * 13 + [[5, 4, 5 * 2**32]]},
        })
    return rows


def bare_rows() -> list[dict]:
    """Two rounds of 2 clients without labels of either kind, a method without a labeller that does not train (no
    pseudo-labels, no losses), under local privacy (each client's epsilon)."""
    return [{
        "round": r, "rounds": 2, "mean_accuracy": None, "client_accuracy": [None, None], "weighted_accuracy": None,
        "global_accuracy": None, "dual_accuracy": None, "new_clients": [], "new_client_accuracy": None,
        "held_out_accuracy": {}, "base_novel_harmonic": None, "pseudo_label_accuracy": [None, None],
        "pseudo_label_agreement": [None, None], "selected": [None, None], "selected_per_class": None, "selection": None,
        "class_weights": None, "refreshed": r == 1, "participants": [0, 1], "lr": None, "loss": [None, None],
        "loss_pos": [None, None], "loss_neg": [None, None], "round_seconds": 4.0, "phase_seconds": {"train": 3.0},
        "bytes_sent": [640, 640], "upload_bytes": {"counts": 40, "sums": 600}, "prompt_divergence": {}, "method": {},
        "epsilon": 2.0 * r, "delta": 1e-05, "clip": 0.5, "epsilon_per_client": [2.0 * r, 1.5 * r],
    } for r in (1, 2)]


def step_rows() -> list[dict]:
    """Three steps of an asynchronous server (FedBuff, buffer 2) over 3 clients and 3 classes, the second not evaluated
    (server.evaluate_every), a refresh at the first (every client's) and the third (client 1's, as it starts)."""
    rows = []
    for r in (1, 2, 3):
        evaluated = r != 2
        acc = [40.0 + 10 * r, 60.0 + 5 * r, 30.0 + r] if evaluated else [None] * 3
        rows.append({
            "round": r, "rounds": 3, "mean_accuracy": sum(acc) / 3 if evaluated else None, "client_accuracy": acc,
            "weighted_accuracy": 50.0 + r if evaluated else None, "global_accuracy": 45.5 + r if evaluated else None,
            "dual_accuracy": 48.0 + r if evaluated else None, "new_clients": [], "new_client_accuracy": None,
            "held_out_accuracy": {}, "base_novel_harmonic": None, "pseudo_label_accuracy": [70.0, 55.5 + r, 60.0],
            "pseudo_label_agreement": [None] * 3 if r == 1 else [None, 90.0, None],
            "selected": [6, 4 + r, 2], "selected_per_class": [5, 4 + r, 3],
            "selection": [[3, 2, 1], [1, 2 + r, 1], [1, 0, 1]] if r != 2 else None,
            "class_weights": [0.75, 1.25, 1.0] if r != 2 else None,
            **({"released_histograms": [[3, 2, 1], [1, 2 + r, 1], [1, 0, 1]], "released_totals": [5, 4 + r, 3]} if r != 2 else {}),
            "refreshed": r != 2, "participants": [[1, 2], [0, 1], [1, 2]][r - 1], "lr": 0.05,
            "loss": [[None, 1.5, 1.0], [2.0, 1.25, None], [None, 1.0, 0.75]][r - 1],
            "loss_pos": [[None, 1.0, 0.5], [1.5, 1.0, None], [None, 0.75, 0.5]][r - 1],
            "loss_neg": [[None, 0.5, 0.5], [0.5, 0.25, None], [None, 0.25, 0.25]][r - 1], "round_seconds": 2.5 + r,
            "phase_seconds": {"refresh": 0.5, "train": 1.5, "aggregate": 0.25, "start": 0.25, "evaluate": 0.5 * (r != 2)},
            "bytes_sent": [[24, 2072, 2072], [2048, 2048, 0], [0, 2072, 2048]][r - 1], "upload_bytes": {"visual": 2048},
            "prompt_divergence": {"visual": {"drift_diversity": 0.5 / r, "cosine_distance": 0.25}}, "method": {},
            "version": r, "arrived": [[2, 1], [1, 0], [2, 1]][r - 1], "staleness": [[0, 0], [1, 1], [1, 0]][r - 1],
            "step_sizes": [[1.0, 1.0], [0.7071, 0.7071], [0.7071, 1.0]][r - 1],
            "arrival_seconds": [[0.25, 0.5], [1.0, 1.0], [1.25, 1.5]][r - 1], "arrival_steps": [[1, 1], [1, 1], [2, 1]][r - 1],
            "started": [[1, 2], [0, 1], [1, 2]][r - 1], "in_flight": [0, 1, 2], "virtual_clock": [0.5, 1.0, 1.5][r - 1],
        })
    return rows


def old_rows() -> list[dict]:
    """A run of fedur from before most fields (rounds counted from 0): what fedur-report still reads."""
    return [{"round": r, "mean_accuracy": 50.0 + r, "client_accuracy": [45.0 + r, 55.0 + r], "selected": [40 + r, 30],
             "round_seconds": 60.0} for r in range(3)]


def record(tmp: Path) -> dict:
    """Every output of the three runs (written under `tmp`), with `tmp` replaced by "TMP"."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    from fedur.app.report import main as report
    from fedur.federated.placement import placement_table
    from fedur.train.recorder import Recorder
    from fedur.train.run_dir import RunDir

    outputs = {}
    for name, rows, labels, figures in (("full", full_rows(), True, True), ("bare", bare_rows(), False, False),
                                        ("steps", step_rows(), True, False)):
        folder = tmp / name
        folder.mkdir()
        console = io.StringIO()
        with contextlib.redirect_stdout(console):
            recorder = Recorder(RunDir(folder), enabled=True, figures=figures)
            recorder.start("seed: 1\n", f"the {name} run")
            recorder.record_placement(placement_table(len(rows[0]["client_accuracy"]), [(0, 0)], None))
            recorder.note_unlabelled(labels, labels)
            k = len(rows[0]["client_accuracy"])
            if labels:
                recorder.record_partition({"classnames": ["cat", "dog", "owl"], "train": [[3, 2, 1], [1, 2, 3], [2, 2, 2]],
                                           "test": [[1, 1, 1], [2, 0, 1], [0, 1, 2]], "train_sizes": [6, 6, 6],
                                           "test_sizes": [3, 3, 3], "client_names": None, "train_ids": None, "test_ids": None})
            zero_shot = torch.tensor([[1, 4], [3, 4], [1, 2]][:k])
            full = name == "full"
            bins = torch.zeros(k, 15, 3, dtype=torch.long)
            bins[:, 14] = torch.tensor([3, 2, 3 * 2**32])
            recorder.record_zero_shot(zero_shot, torch.tensor([True, True, False][:k]) if full else None,
                                      {"novel": torch.tensor([1, 8]), "domain:photo": torch.tensor([5, 8])} if full else None,
                                      {"estimates": {"mano": [35.0, 42.5, 30.0][:k], "confidence": None},
                                       "bins": bins if labels else torch.zeros(k, 15, 3, dtype=torch.long)})
            for row in rows:
                recorder.record_round(row)
            if full:
                recorder.record_adapted(torch.tensor([[0, 1], [0, 1], [7, 8]]), torch.tensor([True, True, False]))
            if labels:
                recorder.record_virtual_time()
                recorder.record_confusion(torch.eye(3, dtype=torch.long).expand(3, 3, 3) * 2, ["cat", "dog", "owl"])
                recorder.record_reliability()
            extra = {"wall_seconds": 125.0, "dataset": "synthetic", "privacy": {"stopped_at_target": labels,
                     "stopped_before_round": 4, "target_epsilon": 3.0}}
            if labels:
                extra["system"] = {"attackers": [1], "attack": "gaussian", "aggregator": "trimmed_mean"}
            if name == "steps":
                del extra["privacy"]
                extra["system"] = {"attackers": [], "attack": "none", "aggregator": "mean", "server": {
                    "mode": "fedbuff", "concurrency": 3, "buffer": 2, "steps": 3, "arrivals": 6, "staleness_mean": 0.5,
                    "staleness_max": 1}}
            settings = {"federation": {"partition": "dirichlet", "beta": 0.5, "num_clients": k, "rounds": len(rows)}}
            recorder.finish(settings, extra)
        tensorboard = []
        for path in sorted((folder / "tensorboard").rglob("events.out.tfevents.*")):
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    kind = value.metadata.plugin_data.plugin_name or value.WhichOneof("value")
                    number = tensor_util.make_ndarray(value.tensor).item() if kind == "scalars" else None
                    tensorboard.append([event.step, value.tag, kind, number])
        outputs[name] = {
            "tensorboard": sorted(tensorboard, key=lambda e: (e[0], e[1])),
            "console": console.getvalue().splitlines(),
            "files": {f: (folder / f).read_text().splitlines() for f in ("metrics.jsonl", "summary.json", "zero_shot.json")},
        }
    old = tmp / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in old_rows()))
    (old / "zero_shot.json").write_text(json.dumps({"zero_shot_client_mean": 40.0, "zero_shot_client_accuracy": [35.0, 45.0]}))
    (old / "config.yaml").write_text("federation:\n  partition: iid\n  num_clients: 2\n  rounds: 4\n")
    with contextlib.redirect_stdout(io.StringIO()):
        report([str(tmp / name) for name in ("full", "bare", "old", "steps")] + ["--out", str(tmp / "report")])
    outputs["report.md"] = (tmp / "report" / "report.md").read_text().replace(str(tmp), "TMP").splitlines()
    outputs["report files"] = sorted(p.name for p in (tmp / "report").iterdir())
    return outputs


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        RECORDED.write_text(json.dumps(record(Path(folder)), indent=1) + "\n")
    print(f"wrote {RECORDED}")
