import gc
import hashlib
import inspect
from pathlib import Path

import docstring_parser
import numpy as np
import pytest
from jsonargparse import ArgumentParser, lazy_instance
from PIL import Image

from fedur import plugins
from fedur.data import synthetic
from fedur.data.benchmarks import CUB
from fedur.data.cifar import CIFAR10
from fedur.data.datasets import (
    DataOptions,
    Dataset,
    DataUnavailableError,
    ImageDataset,
    ImageFolder,
    ImageSplit,
    Synthetic,
    dataset_classes,
    load_imagefolder,
    prepare_dataset,
)
from fedur.errors import PluginError


def write_folder(root, layout):
    """layout: {split: {class: n_images}}; writes small PNGs."""
    for split, classes in layout.items():
        for name, n in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(np.full((8, 8, 3), 10 * i, dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def test_imagefolder_counts_labels_and_names(tmp_path):
    root = write_folder(tmp_path, {"train": {"sea_lion": 3, "ant": 2}, "test": {"sea_lion": 1, "ant": 2}})
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")
    ds = load_imagefolder(str(root))
    assert ds.classnames == ["ant", "sea lion"]  # sorted folders, '_' read as a space
    assert np.bincount(ds.train.labels).tolist() == [2, 3]
    assert np.bincount(ds.test.labels).tolist() == [2, 1]
    assert ds.train.load(0).mode == "RGB" and ds.train.load(0).size == (8, 8)


def test_classnames_file(tmp_path):
    root = write_folder(tmp_path, {"train": {"a": 1, "b": 1}, "test": {"a": 1, "b": 1}})
    names = tmp_path / "names.txt"
    names.write_text("red_panda\nkoala\n")
    options = DataOptions(classnames_file=str(names))
    assert prepare_dataset(ImageFolder(str(root)), options, seed=1).classnames == ["red panda", "koala"]
    names.write_text("only one\n")
    with pytest.raises(DataUnavailableError, match="has 1 names but there are 2 classes"):
        prepare_dataset(ImageFolder(str(root)), options, seed=1)


def test_wrong_layouts_name_the_path(tmp_path):
    write_folder(tmp_path / "no_test", {"train": {"a": 1}})
    with pytest.raises(DataUnavailableError, match="no_test/test is missing"):
        load_imagefolder(str(tmp_path / "no_test"))
    write_folder(tmp_path / "empty", {"train": {"a": 1, "b": 0}, "test": {"a": 1, "b": 1}})
    with pytest.raises(DataUnavailableError, match="empty/train/b has no images"):
        load_imagefolder(str(tmp_path / "empty"))
    write_folder(tmp_path / "mismatch", {"train": {"a": 1, "b": 1}, "test": {"a": 1, "c": 1}})
    with pytest.raises(DataUnavailableError, match="only in train: \\['b'\\]"):
        load_imagefolder(str(tmp_path / "mismatch"))


def test_corrupt_image_is_reported_by_path(tmp_path):
    root = write_folder(tmp_path, {"train": {"a": 1, "b": 1}, "test": {"a": 1, "b": 1}})
    (root / "train" / "a" / "0.png").write_bytes(b"not a png")
    with pytest.raises(DataUnavailableError, match="0.png"):
        load_imagefolder(str(root)).train.load(0)


def test_synthetic_is_deterministic_with_separate_train_and_test_streams():
    a, b = Synthetic(4, 5, 2, 16).load(seed=3), Synthetic(4, 5, 2, 16).load(seed=3)
    assert np.array_equal(a.train.arrays, b.train.arrays) and np.array_equal(a.test.arrays, b.test.arrays)
    assert a.classnames == ["circle", "square", "triangle", "star"] and len(a.test) == 8
    assert not np.array_equal(a.train.arrays[:8], a.test.arrays), "the test split is drawn from its own stream"
    assert not np.array_equal(Synthetic(4, 5, 2, 16).load(seed=4).train.arrays, a.train.arrays)
    with pytest.raises(DataUnavailableError, match=r"dataset.classes must be in \[2, 10\]"):
        Synthetic(11, 5, 2, 16).load(seed=3)
    with pytest.raises(DataUnavailableError, match=r"dataset.classes must be in \[2, 10\]"):
        Synthetic(1).check()  # before any compute


def test_fractions_keep_every_class(tmp_path):
    ds = prepare_dataset(Synthetic(classes=5, train_per_class=40), DataOptions(train_fraction=0.1), seed=1)
    assert np.bincount(ds.train.labels).tolist() == [4] * 5
    with pytest.raises(DataUnavailableError, match="fractions"):
        prepare_dataset(Synthetic(), DataOptions(train_fraction=1.5), seed=1)


def test_template_must_have_one_slot():
    with pytest.raises(DataUnavailableError, match="exactly one"):
        prepare_dataset(Synthetic(), DataOptions(template="a photo"), seed=1)


def test_missing_cifar10_offline_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setattr("fedur.data.cifar.reachable", lambda host: False)
    with pytest.raises(DataUnavailableError) as err:
        CIFAR10(str(tmp_path), download=True).check()
    assert "cifar-10-python.tar.gz" in str(err.value) and f"dataset.root={tmp_path}" in str(err.value)
    with pytest.raises(DataUnavailableError, match="needs dataset.root"):
        CIFAR10(None, download=True).check()
    with pytest.raises(DataUnavailableError, match="needs dataset.root"):
        ImageFolder().check()


# ---------------------------------------------------------------- plugins


class TwoShapes(Dataset):
    """A user's own dataset, defined outside fedur: circles and squares on a fixed seed.

    Args:
        per_class: Images per class and split.
    """

    key = "twoshapes"

    def __init__(self, per_class: int = 4):
        self.per_class = per_class

    def load(self, seed: int) -> ImageDataset:
        splits = [ImageSplit(labels, arrays=images) for images, labels in
                  (synthetic.generate(2, self.per_class, 8, seed=(seed, stream)) for stream in (0, 1))]
        return ImageDataset("twoshapes", ["circle", "square"], "a drawing of a {}.", *splits)


class BigCUB(CUB):
    """A variant of a built-in dataset: it keeps its parent's key and is not listed on its own."""


def test_every_dataset_is_registered_under_its_own_key_with_documented_options():
    registry = dataset_classes()
    own = {cls.__dict__["key"]: cls for cls in plugins.builtin("dataset") if "key" in cls.__dict__}  # fedur's (its modules')
    assert {key: cls for key, cls in registry.items() if cls.__module__.startswith("fedur.")} == own and len(own) > 5
    assert all(cls.key == key and key == key.lower() for key, cls in registry.items())
    assert registry["cub"] is CUB and registry["twoshapes"] is TwoShapes
    for cls in registry.values():
        options = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        # the class's Args section or its __init__'s (jsonargparse's help reads both; examples/ use the second)
        documented = [param.arg_name for doc in (cls.__doc__, cls.__init__.__doc__)
                      for param in docstring_parser.parse(doc or "").params]
        assert documented == options, f"{cls.__name__}: every option in its Args section, in order"


def test_two_datasets_with_one_key_are_refused():
    class Clash(Dataset):
        key = "cub"

    with pytest.raises(PluginError, match="CUB and .*Clash both have the key 'cub'"):
        dataset_classes()
    del Clash
    gc.collect()  # a class lives on in __subclasses__ until collected
    assert dataset_classes()["cub"] is CUB


def test_a_users_dataset_loads_through_prepare_dataset_and_parses_on_the_command_line():
    prepared = prepare_dataset(TwoShapes(per_class=6), DataOptions(train_fraction=0.5, template="a {}"), seed=2)
    assert prepared.name == "twoshapes" and prepared.template == "a {}" and prepared.classnames == ["circle", "square"]
    assert np.bincount(prepared.train.labels).tolist() == [3, 3] and len(prepared.test) == 12
    assert repr(TwoShapes(per_class=6)) == "TwoShapes(per_class=6)" and TwoShapes().cache_key == "twoshapes:"

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--dataset", type=Dataset, default=lazy_instance(ImageFolder))
    parsed = parser.instantiate(parser.parse_args(["--dataset", "TwoShapes", "--dataset.per_class", "3"]))
    assert isinstance(parsed.dataset, TwoShapes) and parsed.dataset.per_class == 3
    parsed = parser.instantiate(parser.parse_args(["--dataset", "CUB", "--dataset.root", "~/birds"]))
    assert isinstance(parsed.dataset, CUB) and not parsed.dataset.root.startswith("~")
    assert parser.instantiate(parser.parse_args(["--dataset.root", "/y"])).dataset.root == "/y"


def test_a_load_that_names_its_dataset_otherwise_is_refused():
    class Misnamed(TwoShapes):
        key = "misnamed"

    with pytest.raises(PluginError, match="named 'twoshapes'; name it 'misnamed'"):
        prepare_dataset(Misnamed(), DataOptions(), seed=1)
    del Misnamed
    gc.collect()


def test_root_is_expanded_and_the_cache_key_is_the_one_from_before_plugins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert CUB("~/birds").root == str(Path.home() / "birds")
    assert CUB("birds").cache_key == f"cub:{tmp_path}/birds"  # "<data.name>:<abspath(data.root)>", as before
    assert CUB("~/birds").cache_key == f"cub:{tmp_path}/~/birds"  # the root as given, not expanded, as before
    assert ImageFolder().cache_key == "imagefolder:" and Synthetic().cache_key == "synthetic:"
    assert Synthetic().root is None and repr(ImageFolder("/d")) == "ImageFolder(root='/d')"


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(
    "options, seed, train, test",  # sha256 prefixes of (arrays, labels) from make_synthetic before plugins
    [
        ((4, 5, 2, 16), 3, ("ef08ef99ba381dc3", "3e6f255870bae597"), ("420ac8406c27c9aa", "180941be1558d749")),
        ((10, 60, 20, 32), 1, ("5793af5f5b44854e", "cab70c4e3ef902db"), ("cf5bc2d008156df1", "e939e099c3608c93")),
        ((2, 3, 1, 8), 500, ("4de9bc40200ce69f", "0020bd656ca1c80c"), ("fba3b742edc22283", "9d34149fbd1fe777")),
    ],
)
def test_synthetic_load_is_what_make_synthetic_gave(options, seed, train, test):
    ds = Synthetic(*options).load(seed)
    assert (digest(ds.train.arrays), digest(ds.train.labels)) == train
    assert (digest(ds.test.arrays), digest(ds.test.labels)) == test
    classes, train_per_class, test_per_class, size = options
    images, labels = synthetic.generate(classes, train_per_class, size, seed=(seed, 0))
    assert np.array_equal(ds.train.arrays, images) and np.array_equal(ds.train.labels, labels)
    assert ds.train.arrays.shape == (classes * train_per_class, size, size, 3) and len(ds.test) == classes * test_per_class
    assert ds.name == "synthetic" and ds.classnames == synthetic.CLASSNAMES[:classes] and ds.template == "a photo of a {}."
