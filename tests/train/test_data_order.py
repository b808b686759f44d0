"""A client's local data order does not depend on data.num_workers, and is the order fedur's runs always had.

fedur once trained each client from a `DataLoader(shuffle=True, generator=<the client's stream>)`, with
`persistent_workers=True` when data.num_workers > 0. A persistent DataLoader draws its workers' base seed from the
generator only at its first epoch, so from the second epoch on the stream was one draw behind and the order (and
every result after it) changed with the number of workers. Now every pass goes through one `ImageLoader` whose
workers only read the rows the main process planned, and a local epoch's order is `epoch_order`'s draws: those
of the single-process DataLoader, epoch after epoch, so runs keep their bits with any number of workers.
"""

import json

import numpy as np
import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from fedur.data.datasets import ImageSplit
from fedur.data.loaders import ImageLoader, Pixels
from fedur.data.synthetic import generate
from fedur.federated.client import ClientState
from fedur.federated.streams import client_generator
from fedur.labels.base import PseudoLabels
from fedur.train.local import epoch_plan

EPOCHS, BATCH, SEED, CLIENT, ROUND = 3, 8, 1, 2, 3


def a_client() -> tuple[ImageSplit, ClientState]:
    """A train split of 40 decoded 16-px shapes; a client holding 30 of them (not in row order) with 27
    pseudo-labelled, so the last batch of an epoch is short (27 = 3 x 8 + 3)."""
    images, labels = generate(5, 8, 16, seed=0)
    split = ImageSplit(labels, arrays=images)
    rng = np.random.default_rng(0)
    train_indices = rng.permutation(len(split))[:30]  # the client's rows of the train split
    positions = torch.from_numpy(np.sort(rng.permutation(30)[:27]))  # its selection: positions in train_indices
    pseudo = PseudoLabels(positions, torch.from_numpy(labels[train_indices[positions.numpy()]]),
                          torch.zeros(27, 5, dtype=torch.bool))
    client = ClientState(CLIENT, train_indices, np.arange(4), {}, pseudo_labels=pseudo)
    return split, client


def planned_epochs(split: ImageSplit, client: ClientState, num_workers: int) -> tuple[list[Tensor], list[list[np.ndarray]]]:
    """What train_unit does for one client over EPOCHS local epochs: the images of every batch, and the batches
    of positions (into the client's selection) of every epoch."""
    loader = ImageLoader({"train": split}, Pixels(), num_workers=num_workers)
    generator = client_generator(SEED, CLIENT, ROUND)
    selected = client.train_indices[client.pseudo_labels.indices.numpy()]  # rows of the train split
    images, epochs = [], []
    try:
        for _ in range(EPOCHS):
            plan = epoch_plan([client], [generator], BATCH)
            assert all(len(step) == 1 and step[0][0] == 0 for step in plan)  # one client: one batch a step
            epochs.append([b.numpy() for step in plan for _, b in step])
            images.extend(loader.batches("train", [selected[b] for b in epochs[-1]]))
    finally:
        loader.close()
    return images, epochs


class Positions(Dataset):
    """Item i is i: a DataLoader over it yields its sampler's order."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def dataloader_order(n: int, **kwargs) -> list[list[int]]:
    """The order fedur's old DataLoader gave over EPOCHS epochs (one iter() per epoch, each to the end), from a
    fresh copy of the client's stream."""
    loader = DataLoader(Positions(n), batch_size=BATCH, shuffle=True, generator=client_generator(SEED, CLIENT, ROUND),
                        drop_last=False, **kwargs)
    return [torch.cat(list(loader)).tolist() for _ in range(EPOCHS)]


def test_the_batch_order_is_the_same_with_0_and_2_workers_and_is_the_old_single_process_dataloaders():
    split, client = a_client()
    images0, epochs0 = planned_epochs(split, client, num_workers=0)
    images2, epochs2 = planned_epochs(split, client, num_workers=2)
    assert [[b.tolist() for b in e] for e in epochs0] == [[b.tolist() for b in e] for e in epochs2]
    assert [len(b) for b in epochs0[0]] == [8, 8, 8, 3]
    assert len(images0) == len(images2) == EPOCHS * 4
    for a, b in zip(images0, images2):
        assert a.dtype == b.dtype == torch.uint8 and torch.equal(a, b)
    # ... and they are the pixels of the planned rows, in the planned order
    selected = client.train_indices[client.pseudo_labels.indices.numpy()]
    batches = [b for epoch in epochs0 for b in epoch]
    for got, positions in zip(images0, batches):
        assert torch.equal(got, torch.stack([Pixels()(split.arrays[row]) for row in selected[positions]]))

    # the order is exactly the one fedur's DataLoader(shuffle=True, generator=the client's stream) gave, epoch
    # after epoch: runs keep the bits they had before
    ours = [np.concatenate(epoch).tolist() for epoch in epochs0]
    assert all(sorted(epoch) == list(range(27)) for epoch in ours)
    assert len({tuple(epoch) for epoch in ours}) == EPOCHS  # a new shuffle each epoch
    assert ours == dataloader_order(27, num_workers=0)


def test_a_persistent_worker_dataloader_drew_another_order_from_the_second_epoch_on():
    """The old bug, and why fedur no longer shuffles through a DataLoader with persistent workers: it draws its
    workers' base seed from the shuffling generator at the first epoch only, so from the second epoch on the
    permutations are shifted by one draw against num_workers=0's."""
    single = dataloader_order(27, num_workers=0)
    persistent = dataloader_order(27, num_workers=2, persistent_workers=True)
    assert persistent[0] == single[0]  # the first epoch draws the same (seed, permutation)
    if persistent[1:] == single[1:]:
        pytest.skip(f"torch {torch.__version__}: a persistent-worker DataLoader redraws its base seed every epoch "
                    "here, so the old loader's order did not depend on the workers on this torch")
    assert persistent[1] != single[1] and persistent[2] != single[2]


def test_the_order_is_a_pure_function_of_the_clients_stream():
    """Another round or client draws another order; the same (seed, client, round) the same one."""
    split, client = a_client()
    first = epoch_plan([client], [client_generator(SEED, CLIENT, ROUND)], BATCH)
    again = epoch_plan([client], [client_generator(SEED, CLIENT, ROUND)], BATCH)
    other = epoch_plan([client], [client_generator(SEED, CLIENT, ROUND + 1)], BATCH)
    flat = lambda plan: torch.cat([b for step in plan for _, b in step]).tolist()  # noqa: E731
    assert flat(first) == flat(again) and flat(first) != flat(other)


@pytest.mark.slow
def test_the_demo_gives_the_same_bits_with_0_and_2_workers(tmp_path):
    """The README's smoke run with data.num_workers 0 and 2: bitwise the same results, and the README's 72.91%."""
    from fedur.app.cli import parse_config
    from fedur.app.run import run

    from ..conftest import assert_same_results

    runs = {}
    for workers in (0, 2):
        runs[workers] = tmp_path / f"workers-{workers}"
        cfg = parse_config(["--config", "configs/smoke.yaml", "--run.progress", "false",
                                         "--data.num_workers", str(workers), "--run.output_dir", str(runs[workers])])
        run(cfg)
    assert_same_results(runs[0], runs[2], num_clients=4)
    for workers, run_dir in runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["settings"]["data"]["num_workers"] == workers
        assert round(summary["final_mean_accuracy"], 2) == 72.91, summary["final_mean_accuracy"]
