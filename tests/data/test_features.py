"""The frozen-feature cache's files (fedur/data/features.py): keyed by every image and the tower, built once and
read back bit for bit, safe when a build stops half-way, damaged files found and built again with one line, a disk
too small refused in one line."""

import copy
import json
import os
import shutil
from collections import namedtuple

import numpy as np
import pytest
import torch
from open_clip.transformer import QuickGELU

from fedur.data import features as store
from fedur.data.datasets import DataUnavailableError, ImageSplit
from fedur.data.features import BUILD_BATCH, TowerSpec, Wanted, checksum, feature_key, open_features, split_identity
from fedur.model.clip import load_clip
from fedur.model.frozen import tower_digest

from .test_cache import write_images

TOWER = TowerSpec("tiny", "a" * 64, "Compose(...)", "cpu")
ROW = (3,)


def table(n: int, dtype=torch.float32):
    """A compute that gives row i the values (i, i + 0.5, -i) in `dtype`, counting the batches it computes."""
    calls = []

    def compute(plan):
        for rows in plan:
            calls.append(len(rows))
            r = torch.from_numpy(rows.astype(np.float32))
            yield torch.stack([r, r + 0.5, -r], dim=1).to(dtype)
    return compute, calls


def opened(tmp_path, n=10, compute=None, say=None, identity="images", tower=TOWER):
    compute = compute or table(n)[0]
    return open_features(tmp_path, Wanted("test:data", "train", "features", identity, n, ROW, tower), compute, say=say)


def files(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))


def test_built_once_then_opened_with_the_same_bits(tmp_path):
    compute, calls = table(10)
    first, built = opened(tmp_path, compute=compute)
    assert built and calls == [10] and first.shape == (10, 3)
    again, built = opened(tmp_path, compute=compute)
    assert not built and calls == [10]  # a warm open computes nothing
    assert torch.equal(again.rows(np.arange(10)), first.rows(np.arange(10)))
    assert torch.equal(again.rows(np.array([7, 2])), torch.tensor([[7, 7.5, -7], [2, 2.5, -2]]))
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["shape"] == [10, 3] and record["crc32"] == checksum(np.load(next(tmp_path.glob("*.npy"))))


def test_rows_are_built_in_fixed_batches_and_read_in_the_towers_dtype(tmp_path):
    compute, calls = table(BUILD_BATCH + 3, torch.bfloat16)
    file, _ = opened(tmp_path, n=BUILD_BATCH + 3, compute=compute)
    assert calls == [BUILD_BATCH, 3]  # consecutive rows, whatever the run reads later
    assert file.rows(np.array([1])).dtype == torch.bfloat16 and np.load(file.path).dtype == np.float32


def test_another_image_on_disk_or_another_tower_gives_another_file(tmp_path):
    paths = write_images(tmp_path / "images", 4)
    split = ImageSplit(np.zeros(4, dtype=np.int64), paths=paths)
    before = split_identity(split, "train", "test:data")
    assert split_identity(split, "train", "test:data") == before  # a key is a pure function of the images
    assert split_identity(split, "train", "test:data", np.array([0, 1, 3])) != before  # an image left out
    stat = os.stat(paths[1])
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touched: another modification time
    touched = split_identity(split, "train", "test:data")
    assert touched != before
    with open(paths[2], "ab") as f:  # another size
        f.write(b"\0")
    assert split_identity(split, "train", "test:data") not in (before, touched)
    towers = [TOWER, TowerSpec("tiny", "b" * 64, TOWER.preprocess, TOWER.computed),  # other weights
              TowerSpec("tiny", TOWER.digest, "Compose(other)", TOWER.computed),
              TowerSpec("tiny", TOWER.digest, TOWER.preprocess, "cuda")]
    assert len({feature_key(before, "features", t) for t in towers} | {feature_key(before, "tokens", TOWER)}) == 5
    for tower in towers:
        opened(tmp_path / "cache", tower=tower)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 4


def test_the_tower_digest_names_the_weights_and_the_architecture(tmp_path):
    torch.manual_seed(0)
    tiny = load_clip("fedur-tiny", None).model.visual
    torch.manual_seed(0)
    same = load_clip("fedur-tiny", None).model.visual
    torch.manual_seed(1)
    other = load_clip("fedur-tiny", None).model.visual  # another random init: another "weights file"
    assert tower_digest(tiny) == tower_digest(same) != tower_digest(other)
    torch.save(tiny.state_dict(), tmp_path / "w.pt")
    with torch.no_grad():
        tiny.proj[0, 0] += 1e-6  # one weight changed
    assert tower_digest(tiny) != tower_digest(same)


def test_an_interrupted_build_leaves_nothing_that_is_read(tmp_path):
    def failing(plan):
        yield torch.zeros(len(plan[0]), 3)
        raise KeyboardInterrupt  # the process stopped half-way
    with pytest.raises(KeyboardInterrupt):
        opened(tmp_path, n=BUILD_BATCH + 1, compute=failing)
    assert files(tmp_path) == []  # no temporary file, no .npy, no sidecar
    file, built = opened(tmp_path, n=BUILD_BATCH + 1)
    assert built and torch.equal(file.rows(np.array([BUILD_BATCH])), torch.tensor([[256.0, 256.5, -256.0]]))


@pytest.mark.parametrize("damage, why", [("flip", "checksum"), ("truncate", "cannot be read"), ("grow", "bytes"),
                                         ("remove", "missing")])
def test_a_damaged_file_is_said_in_one_line_and_built_again(tmp_path, damage, why):
    opened(tmp_path)
    npy = next(tmp_path.glob("*.npy"))
    data = bytearray(npy.read_bytes())
    if damage == "flip":
        data[-5] ^= 0xFF  # a byte of the last row
        npy.write_bytes(bytes(data))
    elif damage == "truncate":
        npy.write_bytes(bytes(data[:-4]))
    elif damage == "grow":
        npy.write_bytes(bytes(data) + b"\0" * 12)
    else:
        npy.unlink()
    said = []
    compute, calls = table(10)
    file, built = opened(tmp_path, compute=compute, say=said.append)
    assert built and calls == [10] and len(said) == 1 and "\n" not in said[0]
    assert str(npy) in said[0] and why in said[0] and "damaged" in said[0]
    assert torch.equal(file.rows(np.array([9])), torch.tensor([[9.0, 9.5, -9.0]]))  # the computed rows, not the damaged
    assert not opened(tmp_path, say=said.append)[1] and len(said) == 1  # whole again: opened quietly


def test_a_disk_too_small_is_refused_in_one_line(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6, 100))
    with pytest.raises(DataUnavailableError, match=r"frozen-feature cache needs .* data.feature_cache=false") as err:
        opened(tmp_path)
    assert "\n" not in str(err.value) and files(tmp_path) == []


def test_the_checksum_reads_the_file_in_chunks(monkeypatch):
    rows = np.arange(30, dtype=np.float32).reshape(10, 3)
    whole = checksum(rows)
    monkeypatch.setattr(store, "CHECK_ROWS", 3)
    assert checksum(rows) == whole


def test_the_zero_shot_class_features_are_computed_once_with_their_uncached_bits(tiny_clip, tmp_path):
    from fedur.model.clip import zero_shot_weights
    from fedur.train.features import text_spec, zero_shot_text

    from ..test_device_guards import StubFabric

    fabric = StubFabric(torch.device("cpu"))
    spec = text_spec(fabric, tiny_clip, "fedur-tiny")
    names = ["cat", "dog", "a red bird"]
    direct = zero_shot_weights(tiny_clip, names, "a photo of a {}.", torch.device("cpu"))
    for _ in range(2):  # cold, then warm
        assert torch.equal(zero_shot_text(fabric, tiny_clip, spec, names, "a photo of a {}.", "test", str(tmp_path)), direct)
    zero_shot_text(fabric, tiny_clip, spec, names, "a drawing of a {}.", "test", str(tmp_path))  # other prompts
    zero_shot_text(fabric, tiny_clip, spec, names[:2], "a photo of a {}.", "test", str(tmp_path))  # other classes
    assert len(list(tmp_path.glob("*-classes-text-*.npy"))) == 3
    assert text_spec(fabric, tiny_clip, "fedur-tiny").digest == spec.digest != tower_digest(tiny_clip.model.visual)
    quick = copy.deepcopy(tiny_clip)
    for block in quick.model.transformer.resblocks:  # the same weights, another activation: another text tower
        block.mlp.gelu = QuickGELU()
    assert text_spec(fabric, quick, "fedur-tiny").digest != spec.digest
