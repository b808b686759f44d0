import multiprocessing
import os
import pickle

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from fedur.data.cache import CacheOptions, corrupt_message, prepare_splits, split_preprocess
from fedur.data.datasets import DataUnavailableError, ImageSplit
from fedur.data.loaders import BatchNormalize, ImageLoader, MappedImages, Pixels, SplitImages, in_batches, unchanged
from fedur.errors import ConfigError

SIZE = 24
PREPROCESS = open_clip.image_transform(SIZE, is_train=False)  # what open_clip gives a 24-px model


def write_images(folder, n, seed=0):
    """n JPEGs and PNGs of varied sizes, aspect ratios and modes (RGB, grayscale, palette)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    paths = []
    for i in range(n):
        h, w = rng.randint(16, 60, size=2)
        image = Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8))
        image = (image, image.convert("L"), image.convert("P"))[i % 3]
        path = folder / f"{i:03d}.{'png' if i % 3 == 2 else 'jpg'}"
        image.save(path)
        paths.append(str(path))
    return paths


def tensor(prepared, image):
    """What the model gets for one image: the per-sample transform, then the batch step."""
    return prepared.normalize(prepared.transform(image))


def prepare(train, test, cache_dir, **kwargs):
    settings = {"cache": True, "cache_dir": str(cache_dir), "corrupt": "stop", "workers": 0}
    settings.update(kwargs)
    return prepare_splits(train, test, PREPROCESS, SIZE, "test:images", CacheOptions(**settings))


@pytest.fixture
def splits(tmp_path):
    paths = write_images(tmp_path / "images", 12)
    train = ImageSplit(np.arange(9, dtype=np.int64) % 3, paths=paths[:9])
    test = ImageSplit(np.arange(3, dtype=np.int64), paths=paths[9:])
    return train, test


def test_cached_tensors_are_those_of_decoding_directly(splits, tmp_path):
    train, test = splits
    prepared = prepare(train, test, tmp_path / "cache")
    assert isinstance(prepared.train.arrays, MappedImages) and prepared.train.arrays.shape == (9, SIZE, SIZE, 3)
    for split, original in ((prepared.train, train), (prepared.test, test)):
        for i in range(len(original)):
            cached = tensor(prepared, split.arrays[i])
            assert torch.equal(cached, PREPROCESS(original.load(i)))  # bit for bit, every mode
            if i % 3 == 0:  # RGB: also what open_clip's preprocess gives on the opened file
                assert torch.equal(cached, PREPROCESS(Image.open(original.paths[i])))
    assert np.array_equal(prepared.train.labels, train.labels) and prepared.skipped == []


def test_arrays_in_memory_go_through_the_same_cache(tmp_path):
    pixels = np.random.RandomState(0).randint(0, 256, (5, 32, 32, 3), dtype=np.uint8)  # CIFAR-like
    split = ImageSplit(np.zeros(5, dtype=np.int64), arrays=pixels)
    prepared = prepare(split, split, tmp_path)
    for i in range(5):
        assert torch.equal(tensor(prepared, prepared.train.arrays[i]), PREPROCESS(Image.fromarray(pixels[i])))
    changed = pixels.copy()
    changed[0, 0, 0, 0] ^= 1
    again = prepare(ImageSplit(split.labels, arrays=changed), split, tmp_path)
    assert again.built == ("train",) and again.cache_files["train"] != prepared.cache_files["train"]


def test_a_second_run_opens_the_file_and_changes_give_a_new_one(splits, tmp_path):
    train, test = splits
    first = prepare(train, test, tmp_path / "cache")
    assert first.built == ("train", "test")
    stat = os.stat(first.cache_files["train"])
    second = prepare(train, test, tmp_path / "cache")
    assert second.built == () and second.cache_files == first.cache_files
    again = os.stat(first.cache_files["train"])
    assert (again.st_ino, again.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)

    fewer = prepare(ImageSplit(train.labels[:8], paths=train.paths[:8]), test, tmp_path / "cache")
    assert fewer.built == ("train",) and fewer.cache_files["train"] != first.cache_files["train"]
    bigger = prepare_splits(
        train, test, open_clip.image_transform(SIZE + 8, is_train=False), SIZE + 8, "test:images",
        CacheOptions(cache=True, cache_dir=str(tmp_path / "cache"), workers=0),
    )
    assert bigger.built == ("train", "test") and bigger.train.arrays.shape == (9, SIZE + 8, SIZE + 8, 3)
    Image.open(train.paths[0]).rotate(90).save(train.paths[0])  # same name, new content
    os.utime(train.paths[0], ns=(stat.st_mtime_ns + 10**9, stat.st_mtime_ns + 10**9))
    assert prepare(train, test, tmp_path / "cache").built == ("train",)


def corrupt(splits):
    train, test = splits
    with open(train.paths[4], "r+b") as f:  # a truncated JPEG
        f.truncate(os.path.getsize(train.paths[4]) // 2)
    with open(test.paths[1], "w") as f:
        f.write("not an image")
    return train, test


@pytest.mark.parametrize("cache", [True, False])
def test_corrupt_images_stop_the_run_with_their_paths(splits, tmp_path, cache):
    train, test = corrupt(splits)
    with pytest.raises(DataUnavailableError) as err:
        prepare(train, test, tmp_path / "cache", cache=cache)
    message = str(err.value)
    assert "2 image(s) cannot be read" in message and "data.corrupt_images=skip" in message
    assert train.paths[4] in message and test.paths[1] in message


@pytest.mark.parametrize("cache", [True, False])
def test_skip_leaves_corrupt_images_out_and_keeps_labels_aligned(splits, tmp_path, cache):
    train, test = corrupt(splits)
    prepared = prepare(train, test, tmp_path / "cache", cache=cache, corrupt="skip")
    assert prepared.skipped == [train.paths[4], test.paths[1]]
    assert prepared.train_kept.tolist() == [0, 1, 2, 3, 5, 6, 7, 8] and prepared.test_kept.tolist() == [0, 2]
    assert np.array_equal(prepared.train.labels, train.labels[prepared.train_kept])
    assert len(prepared.train) == 8 and len(prepared.test) == 2
    for i, original in enumerate(prepared.train_kept):
        image = prepared.train.arrays[i] if cache else prepared.train.load(i)
        assert torch.equal(tensor(prepared, image), PREPROCESS(train.load(int(original))))
    # the verdict is stored with the cache (or the verification record): a rerun decodes nothing
    assert prepare(train, test, tmp_path / "cache", cache=cache, corrupt="skip").built == ()


def test_corrupt_message_lists_the_first_twenty_and_counts_the_rest():
    bad = [{"path": f"/d/{i}.jpg", "error": "OSError: truncated"} for i in range(25)]
    message = corrupt_message(bad)
    assert "/d/19.jpg" in message and "/d/20.jpg" not in message and "... and 5 more" in message


def test_the_image_loader_reads_cached_rows_in_worker_processes_kept_across_passes(splits, tmp_path):
    train, test = splits
    prepared = prepare(train, test, tmp_path / "cache", workers=2)
    assert len(pickle.dumps(prepared.train.arrays)) < 1000  # a worker gets the path, not the pixels
    assert SplitImages({"train": prepared.train}, prepared.transform).raw_rows["train"]  # no PIL round trip
    loader = ImageLoader({"train": prepared.train, "test": prepared.test}, prepared.transform, num_workers=2)
    in_process = ImageLoader({"train": prepared.train, "test": prepared.test}, prepared.transform, num_workers=0)
    workers = None
    for indices in (np.array([8, 0, 3, 5, 1]), np.array([2, 7])):  # two passes, the same worker processes
        plan = in_batches(indices, 2)
        batches = list(loader.batches("train", plan))
        assert [len(b) for b in batches] == [len(p) for p in plan]
        assert all(b.dtype == torch.uint8 and b.shape[1:] == (3, SIZE, SIZE) for b in batches)
        assert all(torch.equal(a, b) for a, b in zip(batches, in_process.batches("train", plan)))
        expected = torch.stack([PREPROCESS(train.load(int(i))) for i in indices])
        assert torch.equal(prepared.normalize(torch.cat(batches)), expected)
        pids = [w.pid for w in loader._iterator._workers]
        assert workers is None or pids == workers
        workers = pids
    one = [np.array([1])]
    assert torch.equal(torch.cat(list(loader.batches("test", one))), torch.cat(list(in_process.batches("test", one))))
    loader.close()


def test_pixels_take_arrays_and_pil_images_alike_and_batch_normalize_matches_torchvision():
    pixels = np.random.RandomState(1).randint(0, 256, (2, SIZE, SIZE, 3), dtype=np.uint8)
    _, mean, std = split_preprocess(PREPROCESS)
    assert torch.equal(Pixels()(pixels[0]), Pixels()(Image.fromarray(pixels[0])))
    batch = BatchNormalize(mean, std)(torch.stack([Pixels()(p) for p in pixels]))  # (2, 3, S, S)
    assert torch.equal(batch, torch.stack([PREPROCESS(Image.fromarray(p)) for p in pixels]))
    with pytest.raises(TypeError, match="uint8"):
        BatchNormalize(mean, std)(batch)  # normalising twice would be silent otherwise
    with pytest.raises(ConfigError, match="data.cache=false"):
        split_preprocess(lambda image: image)


def test_without_the_cache_the_preprocess_normalises_and_the_batch_step_does_nothing(splits, tmp_path):
    train, test = splits
    prepared = prepare(train, test, tmp_path / "cache", cache=False)
    assert prepared.transform is PREPROCESS and prepared.normalize is unchanged and prepared.cache_files == {}
    assert prepared.train is train  # nothing left out: the split itself


def _build(args):
    train, test, cache_dir = args
    return prepare(train, test, cache_dir).built


def test_concurrent_builders_decode_once_and_leave_whole_files(splits, tmp_path):
    train, test = splits
    with multiprocessing.get_context("fork").Pool(2) as pool:
        built = pool.map(_build, [(train, test, tmp_path / "cache")] * 2)
    # Each split has its own lock: every split is decoded by exactly one builder (which one may differ
    # per split), and the other builder waits for it and opens the file.
    assert sorted(split for splits_built in built for split in splits_built) == ["test", "train"]
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")] == []  # no temporaries left
    prepared = prepare(train, test, tmp_path / "cache")
    assert prepared.built == () and torch.equal(tensor(prepared, prepared.train.arrays[2]), PREPROCESS(train.load(2)))
