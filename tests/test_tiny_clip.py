"""Checks on real weights and real images (../shared): skipped unless FEDUR_SHARED_DIR is set."""

import tarfile

import pytest
import torch

from fedur.config import FabricConfig
from fedur.data.datasets import load_imagefolder
from fedur.data.loaders import ImageLoader, in_batches
from fedur.launch_env import LaunchEnv, make_fabric
from fedur.model.classifier import PromptedCLIP
from fedur.model.clip import load_clip, zero_shot_weights
from fedur.train.evaluate import confusion_matrix, correct_and_total, predict

PER_CLASS = 100


@pytest.fixture(scope="module")
def cifar_test_subset(shared_dir, tmp_path_factory):
    """The first 100 test images of every CIFAR-10 class, extracted from the shared archive."""
    root = tmp_path_factory.mktemp("cifar")
    taken: dict[str, int] = {}
    with tarfile.open(shared_dir / "data" / "cifar10-jpg.tar.gz") as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and parts[0] == "test" and taken.get(parts[1], 0) < PER_CLASS:
                taken[parts[1]] = taken.get(parts[1], 0) + 1
                archive.extract(member, root, filter="data")
                copy = root / "train" / parts[1] / parts[2]  # the loader wants a train split too
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes((root / member.name).read_bytes())
    return load_imagefolder(str(root))


@pytest.fixture(scope="module")
def tiny(shared_dir):
    folder = shared_dir / "assets" / "tiny-clip"
    return load_clip("tinyclip-teacher-a", str(folder / "tinyclip-teacher-a.pt"), str(folder / "tinyclip-teacher-a.json"))


def test_zero_shot_matches_the_model_card(tiny, cifar_test_subset):
    """The card reports 59.4% on the 10,000 test images; 1,000 of them land within a few points."""
    fabric = make_fabric(FabricConfig(accelerator="cpu", devices=1), LaunchEnv.read({}))
    ds = cifar_test_subset
    model = PromptedCLIP(tiny, ds.classnames, 0, 0, None, 0.02, seed=1)
    labels = torch.from_numpy(ds.test.labels)
    plan = in_batches(torch.arange(len(labels)).numpy(), 250)
    loader = list(zip(ImageLoader({"test": ds.test}, tiny.preprocess).batches("test", plan), (labels[p] for p in plan)))
    text = zero_shot_weights(tiny, ds.classnames, "a photo of a {}.", fabric.device)
    correct, total = correct_and_total(confusion_matrix(*predict(fabric, model.zero_shot_classifier(text), loader, 10))).tolist()
    assert total == 10 * PER_CLASS
    assert 0.54 < correct / total < 0.65
