"""A split across clients read from a file (`federation.partition=file`), and the image ids that make every
run's split readable back: `partition.json` lists each client's train and test ids, so another run given
that file (`federation.partition_file=<run>/partition.json`) trains on exactly the same split.

An image's id is its path relative to `dataset.root` (with '/'; an absolute path for an image outside it)
for datasets of image files, and its index in the loaded split (0 .. N-1, in the dataset's order) for
images held in memory (the generated ones); a JSON file may give indices for any dataset.

JSON: {"train_ids": [[id, ...] per client], "test_ids": [[id, ...] per client] or null, "validation_ids": [[id, ...]
per client] (optional)}. A client is its position in the list. `test_ids` null or absent: every client is tested on
the whole test set. `validation_ids`: train images each client sets aside as its label-free validation split
(data.validation_fraction; never trained on), listed there instead of in train_ids.
CSV: a header naming the columns `client` (an integer, 0 .. K-1), `image` (an id) and optionally `split`
(train, test or validation; absent: train), then one line per image. Without test lines every client is tested on
the whole test set.

Either way every train image (in train_ids or validation_ids; and, when test ids are given, every test image) is
listed exactly once, no
id is unknown, all ids of a file are of one kind (paths or indices), and no client is without a train
image; each error is one line naming the file and the entry, as `<path>:<line>: <message>` for a CSV line
and `<path>: <message>` otherwise (a JSON entry by its place, train_ids[k][j]). A JSON file may also list
`skipped_ids` ({"train": [...], "test": [...]}): images left out on purpose, as a run that skipped unreadable
images records them, so that its partition.json replays.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedur.data.images import ImageSplit, line_of, reason
from fedur.data.partition import PartitionError, Parts

SPLITS = ("train", "test")


class GivenSplit(NamedTuple):
    """A split file's clients: each one's train rows, test rows (None: every client is tested on the whole test set)
    and label-free validation rows (None: the file names none), as indices into the loaded splits."""

    train: Parts
    test: Parts | None
    validation: Parts | None = None


def image_ids(split: ImageSplit, root: str | None) -> list[str] | None:
    """Each image's id: its path relative to `root` ('/'-separated; absolute when outside it), or None when
    the split holds no paths (its ids are indices)."""
    if split.paths is None:
        return None
    base = os.path.abspath(root) if root else None
    out = []
    for path in split.paths:
        full = os.path.abspath(path)
        inside = base is not None and full.startswith(base + os.sep)
        out.append(Path(os.path.relpath(full, base)).as_posix() if inside else Path(full).as_posix())
    return out


def part_ids(parts: Parts, ids: list[str] | None) -> list[list[str | int]]:
    """Each client's ids: `ids` at its indices, or the indices themselves when there are no path ids."""
    return [[int(i) for i in part] if ids is None else [ids[i] for i in part] for part in parts]


def left_out_ids(split: ImageSplit, kept: np.ndarray, root: str | None) -> list[str | int]:
    """The ids of the images of `split` not in `kept` (those skipped as unreadable)."""
    left = np.setdiff1d(np.arange(len(split)), kept)
    ids = image_ids(split, root)
    return [int(i) if ids is None else ids[i] for i in left]


def read_split_file(path: str, train: ImageSplit, test: ImageSplit, root: str | None) -> GivenSplit:
    """(train parts, test parts or None for a test set every client shares, validation parts or None) from a JSON or
    CSV split file, checked against the loaded splits; raises PartitionError with one line naming the file and the
    wrong entry."""
    entries = read_entries(path)
    skipped, where = entries["skipped"], entries["where"]
    validation = entries.get("validation")
    named = entries["train"]
    if validation is not None:  # a train image is named once, in train_ids or in validation_ids
        if len(validation) > len(named):
            raise PartitionError(f"{path}: validation ids name {len(validation)} clients but the train ids only "
                                 f"{len(named)}; give every client with validation images train images too")
        validation = validation + [[] for _ in range(len(named) - len(validation))]
        named = [t + v for t, v in zip(named, validation)]
        if where["train"] is not None:  # CSV: each entry's line
            where = {**where, "train": [t + v for t, v in zip(where["train"], where["validation"])]}
        else:  # JSON: each entry by its place
            where = {**where, "train": [[f"train_ids[{k}][{j}]" for j in range(len(t))]
                                        + [f"validation_ids[{k}][{j}]" for j in range(len(v))]
                                        for k, (t, v) in enumerate(zip(entries["train"], validation))]}
    both = _resolve(path, "train", named, train, root, skipped["train"], where["train"])
    sizes = [len(t) for t in entries["train"]]
    train_parts = [part[:n] for part, n in zip(both, sizes)]
    validation_parts = None if validation is None else [part[n:] for part, n in zip(both, sizes)]
    for k, part in enumerate(train_parts):
        if len(part) == 0:
            raise PartitionError(f"{path}: client {k} has no train image; every client needs at least one (remove "
                                 "the client or give it images)")
    if entries["test"] is None:
        return GivenSplit(train_parts, None, validation_parts)
    if len(entries["test"]) > len(train_parts):
        raise PartitionError(f"{path}: test ids name {len(entries['test'])} clients but the train ids only "
                             f"{len(train_parts)}; give every client with test images train images too")
    padded = entries["test"] + [[] for _ in range(len(train_parts) - len(entries["test"]))]
    return GivenSplit(train_parts, _resolve(path, "test", padded, test, root, skipped["test"], where["test"]), validation_parts)


def count_clients(path: str) -> int:
    """The number of clients a split file names (what federation.num_clients becomes)."""
    return len(read_entries(path)["train"])


def names_validation(path: str) -> bool:
    """Whether a split file names validation images (JSON validation_ids, CSV lines of split validation)."""
    return read_entries(path).get("validation") is not None


def read_entries(path: str) -> dict:
    """{"train": [[id, ...] per client], "test": [[id, ...] per client] or None, "validation": the same or None,
    "skipped": {split: [id, ...]}, "where": {split: [[where, ...] per client] or None}} as the file gives them; where:
    a CSV entry's line number (None: JSON, whose entries are named by their place, train_ids[k][j])."""
    text = _read_text(path)
    if Path(path).suffix.lower() == ".csv":
        return _read_csv(path, text)
    try:
        content = json.loads(text)
    except json.JSONDecodeError as err:
        raise PartitionError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno}); give JSON with "
                             "train_ids (a list per client) or a .csv file") from err
    if not isinstance(content, dict) or not isinstance(content.get("train_ids"), list):
        raise PartitionError(f"{path}: no 'train_ids' list (one list of image ids per client); an earlier run's "
                             "partition.json has one")
    entries = {}
    for split in SPLITS:
        lists = content.get(f"{split}_ids")
        if split == "test" and lists is None:
            entries[split] = None
            continue
        if not isinstance(lists, list) or not all(isinstance(ids, list) for ids in lists):
            raise PartitionError(f"{path}: '{split}_ids' must be a list of lists of image ids (one list per client)")
        entries[split] = lists
    if not entries["train"]:
        raise PartitionError(f"{path}: 'train_ids' names no client")
    skipped = content.get("skipped_ids") or {}
    if not isinstance(skipped, dict) or not all(isinstance(skipped.get(split, []), list) for split in SPLITS):
        raise PartitionError(f"{path}: 'skipped_ids' must map train and test to lists of image ids (the images left "
                             "out on purpose)")
    validation = content.get("validation_ids")
    if validation is not None and (not isinstance(validation, list) or not all(isinstance(ids, list) for ids in validation)):
        raise PartitionError(f"{path}: 'validation_ids' must be a list of lists of image ids (one list per client)")
    entries["validation"] = validation
    entries["skipped"] = {split: skipped.get(split, []) for split in SPLITS}
    entries["where"] = {split: None for split in (*SPLITS, "validation")}
    return entries


def _read_text(path: str) -> str:
    """The split file's text (UTF-8, a byte-order mark dropped: Excel writes one); each way of not having one
    (no such file, a directory, unreadable, not UTF-8) is one line naming the file."""
    file = Path(path).expanduser()
    if file.is_dir():
        inside = os.path.join(path, "partition.json")
        hint = f"it holds partition.json: {inside}" if (file / "partition.json").is_file() else \
            "e.g. the partition.json of an earlier run"
        raise PartitionError(f"{path}: federation.partition_file is a directory; give a JSON or CSV split file ({hint})")
    if not file.exists():
        raise PartitionError(f"{path}: no such file (federation.partition_file); give a JSON or CSV split file (e.g. "
                             "the partition.json of an earlier run)")
    try:
        data = file.read_bytes()
    except OSError as err:
        raise PartitionError(f"{path}: cannot read federation.partition_file {reason(err)}") from err
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise PartitionError(f"{path}:{line_of(data, err.start)}: not UTF-8 text (byte {data[err.start]:#04x}); save "
                             "the file as UTF-8") from err


def _read_csv(path: str, text: str) -> dict:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = [(reader.line_num, row) for row in reader]  # line_num: the file's line where the row ends
    except csv.Error as err:
        raise PartitionError(f"{path}:{reader.line_num}: not a CSV line ({err}); give the columns client, image (and "
                             "split)") from err
    if not rows:
        raise PartitionError(f"{path}: the file is empty; its first line must name the columns client and image (and "
                             "optionally split)")
    first, names = rows[0]
    header = [name.strip().lower() for name in names]
    if "client" not in header or "image" not in header:
        raise PartitionError(f"{path}:{first}: the first line must name the columns client and image (and optionally "
                             f"split), found {names}")
    col = {name: header.index(name) for name in ("client", "image", "split") if name in header}
    by_split: dict[str, dict[int, list]] = {"train": {}, "test": {}, "validation": {}}
    lines: dict[str, dict[int, list]] = {"train": {}, "test": {}, "validation": {}}
    for number, row in rows[1:]:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            raise PartitionError(f"{path}:{number}: expected {len(header)} columns ({', '.join(header)}), found {row}")
        client, image = row[col["client"]].strip(), row[col["image"]].strip()
        split = row[col["split"]].strip().lower() if "split" in col else "train"
        if split not in by_split:
            raise PartitionError(f"{path}:{number}: split {split!r} is none of train, test and validation")
        if not client.isdigit():
            raise PartitionError(f"{path}:{number}: client {client!r} is not a client id (0, 1, ...)")
        by_split[split].setdefault(int(client), []).append(image)
        lines[split].setdefault(int(client), []).append(number)
    if not by_split["train"]:
        raise PartitionError(f"{path}: lists no train image")
    num_clients = max(max(by_split["train"]), max(by_split["test"], default=-1), max(by_split["validation"], default=-1)) + 1
    missing = [k for k in range(num_clients) if k not in by_split["train"]]
    if missing:
        raise PartitionError(f"{path}: client {missing[0]} has no train image (client ids run 0 .. {num_clients - 1}); "
                             "every client needs at least one")
    lists = {split: [by_split[split].get(k, []) for k in range(num_clients)] for split in by_split}
    where = {split: [lines[split].get(k, []) for k in range(num_clients)] for split in by_split}
    return {"train": lists["train"], "test": lists["test"] if by_split["test"] else None,
            "validation": lists["validation"] if by_split["validation"] else None,
            "skipped": {split: [] for split in SPLITS}, "where": where}


def _resolve(
    path: str, split: str, lists: list[list], data: ImageSplit, root: str | None, skipped: list, lines: list[list] | None
) -> Parts:
    """Index arrays into `data` of each client's ids, checking that each of its images is named once (by a
    client, or among the `skipped` ones); `lines`: each entry's line in a CSV file (None: a JSON file's entries,
    named by their place, train_ids[k][j])."""
    if len(data) == 0 and (any(lists) or skipped):
        raise PartitionError(f"{path}: the dataset has no {split} images; drop the file's {split} ids")
    ids = image_ids(data, root)
    position = None if ids is None else {image: i for i, image in enumerate(ids)}
    owner: dict[int, str | int] = {}
    kinds: dict[bool, str | int] = {}  # is an index -> the first entry of that kind
    named = [(f"skipped_ids.{split}[{j}]", entry, None) for j, entry in enumerate(skipped)]
    named += [(lines[k][j] if lines else f"{split}_ids[{k}][{j}]", entry, k)
              for k, entries in enumerate(lists) for j, entry in enumerate(entries)]
    members: list[list[int]] = [[] for _ in lists]
    for where, entry, k in named:
        index = _index(_entry(path, where, entry), entry, position, len(data), split, ids)
        is_index = _is_index(entry, position)
        kinds.setdefault(is_index, where)
        if len(kinds) > 1:
            first = _place(kinds[not is_index])
            raise PartitionError(f"{_entry(path, where, entry)} is {'an index' if is_index else 'a path'} but {first} is "
                                 f"{'a path' if is_index else 'an index'}; give every id of a file in one kind")
        if index in owner:
            raise PartitionError(f"{_entry(path, where, entry)} names a {split} image already listed at "
                                 f"{_place(owner[index])}; list every image once")
        owner[index] = where
        if k is not None:
            members[k].append(index)
    parts = [np.asarray(part, dtype=np.int64) for part in members]
    if len(owner) != len(data):
        left = next(i for i in range(len(data)) if i not in owner)
        raise PartitionError(f"{path}: {len(data) - len(owner)} of the {len(data)} {split} images are in no client, "
                             f"e.g. {ids[left] if ids is not None else left!r}; list every image once")
    return parts


def _entry(path: str, where: str | int, entry) -> str:
    """An entry as an error begins: "<path>:<line>: image <id>" (CSV) or "<path>: train_ids[k][j] = <id>" (JSON)."""
    return f"{path}:{where}: image {entry!r}" if isinstance(where, int) else f"{path}: {where} = {entry!r}"


def _place(where: str | int) -> str:
    """Another entry of the same file, as a message names it: "line 7" (CSV) or "train_ids[0][3]" (JSON)."""
    return f"line {where}" if isinstance(where, int) else where


def _is_index(entry, position: dict[str, int] | None) -> bool:
    """An integer, or (for images that are not files) a string of digits; else a path."""
    return (isinstance(entry, int) and not isinstance(entry, bool)) or (
        isinstance(entry, str) and position is None and entry.isdigit())


def _index(named: str, entry, position: dict[str, int] | None, n: int, split: str, ids: list[str] | None) -> int:
    """The row of `entry` in the split; `named`: the entry as an error begins (`_entry`)."""
    if _is_index(entry, position):
        index = int(entry)
        if not 0 <= index < n:
            raise PartitionError(f"{named} is not an index of the {n} {split} images (0 .. {n - 1})")
        return index
    if position is None:
        raise PartitionError(f"{named}: this dataset's images are not files; give their indices (0 .. N-1)")
    index = position.get(Path(str(entry)).as_posix())
    if index is None:
        raise PartitionError(f"{named} is not a {split} image of the dataset (ids are paths relative to dataset.root, "
                             f"e.g. {ids[0]!r})")
    return index


def keep_rows(parts: Parts, kept: np.ndarray) -> Parts:
    """`parts` (indices into a split) as indices into its subset of rows `kept` (sorted), without the rows
    left out (images skipped as unreadable)."""
    out = []
    for part in parts:
        at = np.searchsorted(kept, part)
        inside = (at < len(kept)) & (kept[np.minimum(at, len(kept) - 1)] == part) if len(kept) else np.zeros(len(part), bool)
        out.append(at[inside].astype(np.int64))
    return out
