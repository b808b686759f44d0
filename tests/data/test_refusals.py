"""Inputs that fedur refuses in one line naming the file, line or folder and saying what to do, instead of a
traceback or a silent change: client and class folders (names that are not UTF-8, symlinks that lead nowhere,
unreadable folders, a root that is a file), the class-names file (empty, a blank line among the names, one
class, a name twice, a folder, not UTF-8, unreadable), the split file (a folder, unreadable; every message in
the `<path>:<line>: <message>` form) and the image cache's folder. Each on a layout generated in tmp_path."""

import builtins
import hashlib
import io
import json
import os
import re
import shutil

import numpy as np
import open_clip
import PIL
import pytest
import torch

from fedur.data.benchmarks import DTD
from fedur.data.cache import CacheOptions, prepare_splits, split_key
from fedur.data.clients import ClientFolders
from fedur.data.datasets import DataOptions, DataUnavailableError, ImageFolder, Synthetic, prepare_dataset
from fedur.data.images import ImageDataset, ImageSplit
from fedur.data.partition import PartitionError
from fedur.data.split_file import count_clients, read_split_file

from ..own_data import write_client_folders, write_images
from .test_layouts import write_dtd

IMAGE = np.zeros((1, 8, 8, 3), dtype=np.uint8)


def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def load(root, classnames):
    return prepare_dataset(ClientFolders(str(root)), DataOptions(classnames_file=str(classnames)), seed=0)


def image_folder(root, classes=("cat", "dog")):
    for split in ("train", "test"):
        for name in classes:
            write_images(root / split / name, IMAGE)
    return root


def deny(monkeypatch, path):
    """Reading or listing `path` fails as it does without the permission (fedur's tests may run as root, which
    chmod does not stop)."""
    denied = os.fspath(path)
    real_open, real_listdir = builtins.open, os.listdir

    def guarded_open(file, *args, **kwargs):
        if os.fspath(file) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return real_open(file, *args, **kwargs)

    def guarded_listdir(folder="."):
        if os.fspath(folder) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return real_listdir(folder)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    monkeypatch.setattr(os, "listdir", guarded_listdir)


# ---------------------------------------------------------------- client and class folders


def test_a_client_folder_whose_name_is_not_utf8_is_refused_naming_it(tmp_path):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    clients = os.fsencode(tmp_path / "clients")
    os.mkdir(clients + b"/client\xff")
    write_images(tmp_path / "clients" / os.fsdecode(b"client\xff") / "train", IMAGE)
    bad = os.fsdecode(clients + b"/client\xff")
    with pytest.raises(DataUnavailableError) as err:
        ClientFolders(str(tmp_path)).check()  # what the entry point checks before anything is loaded
    assert f"client folder {bad!r} has a name that is not valid UTF-8 (b'client\\xff'); rename it" in one_line(err)
    with pytest.raises(DataUnavailableError, match="not valid UTF-8"):
        load(tmp_path, names)


def test_class_folders_and_images_whose_names_are_not_utf8_are_refused(tmp_path):
    root = image_folder(tmp_path / "classes")
    write_images(tmp_path / "classes" / "train" / os.fsdecode(b"caf\xe9"), IMAGE)
    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(ImageFolder(str(root)), DataOptions(), seed=0)
    bad = str(root / "train" / os.fsdecode(b"caf\xe9"))
    assert f"class folder {bad!r} has a name that is not valid UTF-8 (b'caf\\xe9')" in one_line(err)
    names = write_client_folders(tmp_path / "own", clients=2, classes=3, train_per_client=4, test="none")
    train = tmp_path / "own" / "clients" / "site_01" / "train"
    image = train / os.fsdecode(b"img\xff.png")
    (train / "img_0000.png").rename(image)
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path / "own", names)
    assert f"image {str(image)!r} has a name that is not valid UTF-8 (b'img\\xff.png')" in one_line(err)


def test_the_cache_key_takes_any_file_name_and_keeps_its_value_for_utf8_ones(tmp_path):
    paths = [str(tmp_path / "é.png"), os.fsdecode(os.fsencode(tmp_path) + b"/\xff.png")]
    split = ImageSplit(np.zeros(2, dtype=np.int64), paths=paths)
    key = split_key(split, "train", "imagefolder:/x", None, None)  # no UnicodeEncodeError
    assert key != split_key(ImageSplit(np.zeros(2, dtype=np.int64), paths=paths[:1] * 2), "train", "imagefolder:/x",
                            None, None)
    digest = hashlib.sha256()  # the key before: a cache built then keeps its files
    digest.update(json.dumps([1, "imagefolder:/x", "train", "None", None, PIL.__version__, 1]).encode())
    digest.update(f"{paths[0]}\0missing\n".encode())
    assert split_key(ImageSplit(np.zeros(1, dtype=np.int64), paths=paths[:1]), "train", "imagefolder:/x", None,
                     None) == digest.hexdigest()


@pytest.mark.parametrize("target", ["loop", "nowhere"])
def test_a_client_folder_that_is_a_symlink_loop_or_broken_is_refused_naming_it(tmp_path, target):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    link = tmp_path / "clients" / "loop"
    os.symlink(target, link)  # "loop" points at itself
    with pytest.raises(DataUnavailableError) as err:
        ClientFolders(str(tmp_path)).client_names()
    why = "loops back on itself" if target == "loop" else "leads nowhere"
    assert f"client folder {link} is a symlink to {target!r} that {why}" in one_line(err)
    with pytest.raises(DataUnavailableError):
        load(tmp_path, names)


def test_a_symlink_to_a_real_client_folder_is_a_client(tmp_path):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    os.symlink(tmp_path / "clients" / "site_01", tmp_path / "clients" / "site_02")
    assert ClientFolders(str(tmp_path)).client_names() == ["site_00", "site_01", "site_02"]
    assert np.bincount(load(tmp_path, names).train.clients).tolist() == [4, 4, 4]


def test_a_class_folder_that_is_a_symlink_loop_is_refused(tmp_path):
    root = image_folder(tmp_path, ("cat", "dog", "emu"))
    for split in ("train", "test"):
        os.symlink("loop", root / split / "loop")
    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(ImageFolder(str(root)), DataOptions(), seed=0)
    assert f"class folder {root / 'train' / 'loop'} is a symlink to 'loop' that loops back on itself" in one_line(err)


def test_unreadable_folders_are_one_line(tmp_path, monkeypatch):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    deny(monkeypatch, tmp_path / "clients" / "site_01" / "train")
    with pytest.raises(DataUnavailableError) as err:
        ClientFolders(str(tmp_path)).check()
    assert f"cannot list {tmp_path / 'clients' / 'site_01' / 'train'} (Permission denied)" in one_line(err)
    deny(monkeypatch, tmp_path / "clients")
    with pytest.raises(DataUnavailableError) as err:
        ClientFolders(str(tmp_path)).check()
    assert f"cannot list {tmp_path / 'clients'} (Permission denied); check its permissions" in one_line(err)


def test_a_dataset_root_that_is_a_file_says_so(tmp_path):
    archive = tmp_path / "data.tar"
    archive.write_text("not a folder")
    for dataset in (ImageFolder(str(archive)), ClientFolders(str(archive))):
        with pytest.raises(DataUnavailableError) as err:
            dataset.check()
        assert f"{archive} is a file, not a folder" in one_line(err) and "does not exist" not in one_line(err)
    root = image_folder(tmp_path / "split_is_a_file")
    shutil.rmtree(root / "train")
    (root / "train").write_text("x")
    with pytest.raises(DataUnavailableError) as err:
        ImageFolder(str(root)).check()
    assert f"{root / 'train'} is a file, not a folder" in one_line(err)


# ---------------------------------------------------------------- the class-names file


def test_an_empty_class_names_file_is_refused_naming_it(tmp_path):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    for content in ("", "\n  \n"):
        empty = tmp_path / "empty.txt"
        empty.write_text(content)
        with pytest.raises(DataUnavailableError) as err:
            load(tmp_path, empty)
        assert f"data.classnames_file={empty} names no class; give one class name per line" in one_line(err)
    root = image_folder(tmp_path / "folders")
    with pytest.raises(DataUnavailableError, match="names no class"):
        prepare_dataset(ImageFolder(str(root)), DataOptions(classnames_file=str(empty)), seed=0)


def test_a_blank_line_among_the_class_names_is_refused_with_its_number(tmp_path):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    names = tmp_path / "names.txt"
    for content, line in (("circle\n\nsquare\ntriangle\n", 2), ("\ncircle\nsquare\ntriangle\n", 1),
                          ("circle\nsquare\n  \r\ntriangle\n", 3)):
        names.write_text(content)
        with pytest.raises(DataUnavailableError) as err:
            load(tmp_path, names)
        assert one_line(err).startswith(f"{names}:{line}: blank line among the class names")
        assert "every class after it would take the wrong label" in one_line(err)


def test_trailing_blank_lines_spaces_crlf_and_a_byte_order_mark_are_cleaned(tmp_path):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    names = tmp_path / "names.txt"
    names.write_bytes("\ufeffcircle  \r\nsquare\t\r\ntriangle\r\n\r\n\n".encode())  # as Windows Notepad saves it
    assert load(tmp_path, names).classnames == ["circle", "square", "triangle"]


def test_a_class_names_file_under_home_is_found(tmp_path, monkeypatch):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    monkeypatch.setenv("HOME", str(tmp_path))  # a YAML's '~/classnames.txt' reaches fedur unexpanded
    assert load(tmp_path, "~/classnames.txt").classnames == ["circle", "square", "triangle"]


def test_one_class_is_no_recognition_task(tmp_path):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    one = tmp_path / "one.txt"
    one.write_text("circle\n")
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, one)
    assert f"data.classnames_file={one} names one class ('circle'); recognition needs at least two" in one_line(err)
    root = image_folder(tmp_path / "folders", ("cat",))
    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(ImageFolder(str(root)), DataOptions(), seed=0)
    assert f"{root / 'train'} has one class folder ('cat'); recognition needs at least two" in one_line(err)

    class OneShape(Synthetic):  # any dataset, e.g. a user's (a variant keeps its parent's key: not registered)
        def load(self, seed):
            split = ImageSplit(np.zeros(2, dtype=np.int64), arrays=np.zeros((2, 8, 8, 3), dtype=np.uint8))
            return ImageDataset(self.key, ["thing"], "a photo of a {}.", split, split)

    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(OneShape(), DataOptions(), seed=0)
    assert "dataset OneShape has 1 class ('thing'); recognition needs at least two" in one_line(err)


def test_a_class_named_twice_is_refused_for_any_dataset(tmp_path):
    root = image_folder(tmp_path)
    names = tmp_path / "names.txt"
    names.write_text("red_panda\nred panda\n")
    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(ImageFolder(str(root)), DataOptions(classnames_file=str(names)), seed=0)
    assert f"{names}:2: class 'red panda' is named again (first at line 1, '_' read as a space)" in one_line(err)


def test_a_class_names_file_that_is_a_folder_not_utf8_or_unreadable(tmp_path, monkeypatch):
    write_client_folders(tmp_path, clients=2, classes=3, train_per_client=4, test="none")
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, tmp_path / "clients")
    assert f"data.classnames_file={tmp_path / 'clients'} is a folder; give a text file" in one_line(err)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("circle\nsquare\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, latin)
    assert f"{latin}:3: not UTF-8 text (byte 0xe9); save the file as UTF-8" in one_line(err)
    names = tmp_path / "classnames.txt"
    deny(monkeypatch, names)
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, names)
    assert f"cannot read data.classnames_file={names} (Permission denied); check its permissions" in one_line(err)


def test_a_datasets_own_class_names_file_and_lists_give_the_real_line(tmp_path):
    root = write_dtd(tmp_path / "dtd")
    (root / "class_names.txt").write_text("banded\n\npolka-dotted\nzig_zag\n")
    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(DTD(str(root)), DataOptions(), seed=0)
    assert one_line(err).startswith(f"{root / 'class_names.txt'}:2: blank line among the class names")
    write_dtd(root)
    (root / "test.txt").write_text("\n\nbanded/banded_test0.jpg 0\nno label here\n")
    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(DTD(str(root)), DataOptions(), seed=0)
    assert one_line(err).startswith(f"{root / 'test.txt'}:4: expected '<image path> <integer label>'")


# ---------------------------------------------------------------- the split file


def split_data(root):
    train = ImageSplit(np.zeros(4, dtype=np.int64), paths=[str(root / f"img_{i}.png") for i in range(4)])
    test = ImageSplit(np.zeros(0, dtype=np.int64), paths=[])
    return train, test


def test_a_partition_file_that_is_a_directory_says_so(tmp_path):
    run = tmp_path / "earlier-run"
    run.mkdir()
    with pytest.raises(PartitionError) as err:
        count_clients(str(run))
    assert f"{run}: federation.partition_file is a directory; give a JSON or CSV split file" in one_line(err)
    assert "does not exist" not in one_line(err)
    (run / "partition.json").write_text(json.dumps({"train_ids": [[0]]}))
    with pytest.raises(PartitionError) as err:
        count_clients(str(run))
    assert f"(it holds partition.json: {run / 'partition.json'})" in one_line(err)


@pytest.mark.parametrize("name, content, where", [
    ("s.csv", "client,image\n0,img_0.png\nx,img_1.png\n", ":3: client 'x' is not a client id"),
    ("s.csv", "client,image,split\n0,img_0.png,val\n", ":2: split 'val' is none of train, test and validation"),
    ("s.csv", "client,image\n0,img_0.png\n0\n", ":3: expected 2 columns"),
    ("s.csv", "client,image\n0,img_0.png\n\n0,img_9.png\n", ":4: image 'img_9.png' is not a train image"),
    ("s.csv", "client,image\n0,img_0.png\n0,img_1.png\n0,img_1.png\n", ":4: image 'img_1.png' names a train image "
                                                                        "already listed at line 3"),
    ("s.csv", "client,image\n1,img_0.png\n", ": client 0 has no train image"),
    ("s.csv", "image\nimg_0.png\n", ":1: the first line must name the columns client and image"),
    ("s.csv", "", ": the file is empty; its first line must name the columns client and image"),
    ("s.csv", "client,image\n0,img_0.png\n0,caf\xe9.png\n".encode("latin-1"), ":3: not UTF-8 text (byte 0xe9)"),
    ("s.csv", "client,image\n", ": lists no train image"),
    ("s.csv", "client,image\n0,img_0.png\n0,img_1.png\n", ": 2 of the 4 train images are in no client"),
    ("s.json", '{"train_ids":\n  [[0, 1],', ":2: not valid JSON"),
    ("s.json", {"clients": []}, ": no 'train_ids' list"),
    ("s.json", {"train_ids": []}, ": 'train_ids' names no client"),
    ("s.json", {"train_ids": [["img_0.png", "img_1.png", "img_2.png"], ["img_3.png", 1]]},
     ": train_ids[1][1] = 1 is an index but train_ids[0][0] is a path"),
    ("s.json", {"train_ids": [[0, 1], [2, 3, 3]]}, ": train_ids[1][2] = 3 names a train image already listed at "
                                                   "train_ids[1][1]"),
    ("s.json", {"train_ids": [[0, 1, 2, 3], []]}, ": client 1 has no train image"),
    ("s.json", {"train_ids": [[0, 1, 2, 3]], "test_ids": [[], []]}, ": test ids name 2 clients but the train ids only 1"),
    ("s.json", {"train_ids": [[0, 1, 2, 3]], "skipped_ids": ["img_0.png"]}, ": 'skipped_ids' must map train and test"),
    ("s.json", {"train_ids": [[0, 1, 2, 3]], "test_ids": [[0]]}, ": the dataset has no test images"),
    ("missing.json", None, ": no such file (federation.partition_file)"),
])
def test_every_split_file_message_names_its_place_as_path_line(tmp_path, name, content, where):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(PartitionError) as err:
        read_split_file(str(path), *split_data(tmp_path), str(tmp_path))
    assert one_line(err).startswith(f"{path}{where}")  # <path>:<line>: <message>, or <path>: <message>
    assert "federation.partition_file=" not in one_line(err) and not re.search(r"[:,] line \d", one_line(err))


def test_a_json_split_file_with_a_byte_order_mark_reads(tmp_path):
    path = tmp_path / "s.json"
    path.write_bytes(json.dumps({"train_ids": [[0, 1], [2, 3]]}).encode("utf-8-sig"))  # as Windows editors save it
    parts, shared, _ = read_split_file(str(path), *split_data(tmp_path), str(tmp_path))
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3]] and shared is None


@pytest.mark.parametrize("name", ["s.json", "s.csv"])
def test_an_unreadable_split_file_is_one_line(tmp_path, monkeypatch, name):
    path = tmp_path / name
    path.write_text("client,image\n0,img_0.png\n" if name.endswith(".csv") else '{"train_ids": [[0]]}')
    deny(monkeypatch, path)
    with pytest.raises(PartitionError) as err:
        count_clients(str(path))
    assert one_line(err) == f"{path}: cannot read federation.partition_file (Permission denied); check its permissions"


# ---------------------------------------------------------------- the image cache


def test_a_cache_dir_that_is_a_file_or_unwritable_is_one_line(tmp_path, monkeypatch):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=2, test="none")
    data = load(tmp_path, names)
    preprocess = open_clip.image_transform(8, is_train=False)
    with pytest.raises(DataUnavailableError) as err:
        prepare_splits(data.train, data.test, preprocess, 8, "k", CacheOptions(True, str(names), workers=0))
    assert one_line(err) == (f"cannot write the image cache in {names} (it is a file, not a folder); set "
                             "data.cache_dir to a folder you can write")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro"))

    monkeypatch.setattr(type(tmp_path), "mkdir", refuse)
    with pytest.raises(DataUnavailableError) as err:
        prepare_splits(data.train, data.test, preprocess, 8, "k", CacheOptions(True, str(tmp_path / "ro"), workers=0))
    assert f"cannot write the image cache in {tmp_path / 'ro'} (Permission denied); set data.cache_dir" in one_line(err)


def test_a_text_prompt_without_class_names_says_so():
    from fedur.model.prompts import TextPrompt  # what an empty names file reached before it was refused when read

    embedding = torch.nn.Embedding(49408, 8)
    with pytest.raises(ValueError, match="a text prompt needs at least one class name, got none"):
        TextPrompt(embedding, open_clip.get_tokenizer("RN50"), [], 4, torch.zeros(4, 8))
