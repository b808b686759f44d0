"""What a run on data without labels reports per image: predictions/client_XXX.csv, each client's final model's
class for every one of its train and test images (written by the rank that hosts the client)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from fedur.data.split_file import image_ids
from fedur.train.run_dir import writing

if TYPE_CHECKING:
    from fedur.train.host import Host

COLUMNS = ("split", "image", "predicted", "class", "confidence")


def write_predictions(host: Host, folder: Path, root: str | None) -> None:
    """One CSV per hosted client: split, image id (its path relative to dataset.root, or its index), the
    predicted class index and name, and the softmax probability of that class. No collective is called."""
    folder.mkdir(exist_ok=True)
    classnames = host.dataset.classnames
    rows: dict[int, list[tuple]] = {c.client_id: [] for c in host.clients}
    for split in ("train", "test"):
        data = getattr(host.dataset, split)
        ids = image_ids(data, root)
        predictions = host.predict(split)
        for client in host.clients:
            indices = client.train_indices if split == "train" else client.test_indices
            probs = predictions[client.client_id][0].softmax(dim=-1)
            confidence, predicted = probs.max(dim=-1) if len(probs) else (probs[:, 0], probs[:, 0].long())
            for index, c, p in zip(indices.tolist(), predicted.tolist(), confidence.tolist()):
                rows[client.client_id].append((split, index if ids is None else ids[index], c, classnames[c], f"{p:.6f}"))
    for client_id, lines in rows.items():
        path = folder / f"client_{client_id:03d}.csv"
        with writing(path), open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(lines)
