"""A client's peak memory estimated before any compute (fedur/train/memory.py) and activation checkpointing
(model.checkpointing): the counter on hand-written tensors, the fake-tensor estimate equal to the same step counted on
real tensors, checkpointing that keeps every value and gradient and lowers the training peak, and a run that prints its
estimate and writes it to summary.json."""

import json

import pytest
import torch
import torch.nn.functional as F

from fedur.methods import FedMaPLe, FedOTP, FedUR
from fedur.methods.pieces import initial_values
from fedur.model.classifier import PromptedCLIP
from fedur.train.memory import LiveBytes, ModelSpec, Workload, estimate_memory, measure

CLASSES = ("circle", "square", "a red wave")


def test_live_bytes_counts_each_storage_once_while_it_lives():
    tracker = LiveBytes()
    with tracker:
        a = torch.zeros(10, 10)  # 400 bytes
        view = a[:5]  # the same storage
        b = torch.ones(25, dtype=torch.float64)  # 200 bytes
        assert tracker.now == 600 and tracker.peak == 600
        del b
        assert tracker.now == 400
        c = a.view(100).clone()  # 400 more
        assert tracker.now == 800 and tracker.peak == 800
        del a, c
        assert tracker.now == 400  # the view keeps its storage alive
        del view
    assert tracker.now == 0 and tracker.peak == 800


@pytest.mark.parametrize("method", [FedUR(), pytest.param(FedMaPLe(), marks=pytest.mark.slow)], ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_estimate_is_the_same_step_counted_on_real_tensors(tiny_clip, method, checkpointing):
    estimate = estimate_memory(ModelSpec("fedur-tiny", CLASSES, 2, 2, None, checkpointing=checkpointing), method, 4, 8)
    model = PromptedCLIP(tiny_clip, list(CLASSES), 2, 2, None, 0.02, 1)
    model.checkpointing = checkpointing
    real = measure(model, method, initial_values(method.pieces(), model, 1), Workload(1, 4, 8, tiny_clip.image_size), "32-true")
    assert estimate.forward == f"{type(method).__name__}'s forward" and estimate.checkpointing == checkpointing
    assert estimate.weights_bytes == real.weights_bytes
    # the fake kernels' temporaries are not always the CPU kernels' (a few KiB of scratch): within 0.1%
    assert estimate.train_bytes == pytest.approx(real.train_bytes, rel=1e-3)
    assert estimate.eval_bytes == pytest.approx(real.eval_bytes, rel=1e-3)
    assert estimate.weights_bytes < estimate.train_bytes and estimate.peak_bytes == max(estimate.train_bytes, estimate.eval_bytes)


SPEC = ModelSpec("fedur-tiny", CLASSES, 2, 2, None)


def test_checkpointing_lowers_the_training_peak():
    plain = estimate_memory(SPEC, FedUR(), 32, 8)
    checkpointed = estimate_memory(ModelSpec(**{**vars(SPEC), "checkpointing": True}), FedUR(), 32, 8)
    assert checkpointed.train_bytes < plain.train_bytes and checkpointed.eval_bytes == plain.eval_bytes
    assert "peak memory per client (estimated before any compute, FedUR's forward)" in plain.describe()


@pytest.mark.slow  # three estimates: 3-6 s
def test_bf16_halves_the_activations_and_a_unit_of_two_clients_doubles_the_batch():
    plain = estimate_memory(SPEC, FedUR(), 32, 8)
    bf16 = estimate_memory(SPEC, FedUR(), 32, 8, precision="bf16-mixed")
    assert bf16.weights_bytes == plain.weights_bytes and bf16.train_bytes < plain.train_bytes
    two = estimate_memory(SPEC, FedUR(), 32, 8, clients_per_step=2)  # a unit of two clients: twice the images
    assert two.batch == 64 and two.train_bytes > plain.train_bytes


@pytest.mark.slow  # two forwards on fake tensors
def test_a_forward_that_reads_values_is_estimated_by_the_base_forward_and_says_so():
    estimate = estimate_memory(ModelSpec("fedur-tiny", CLASSES, 2, 2, None), FedOTP(), 4, 8)
    assert estimate.forward.startswith("the base forward with FedOTP's pieces") and estimate.train_bytes > 0


def grads(model, method, pieces, images):
    pieces = {k: v.clone().requires_grad_(True) for k, v in pieces.items()}
    model.train()
    logits = method.logits(model, images, pieces, method.text_side(model, pieces), None)
    F.cross_entropy(logits, torch.arange(len(images)) % len(CLASSES)).backward()
    model.eval()
    return logits.detach(), {k: v.grad for k, v in pieces.items() if v.grad is not None}


@pytest.mark.parametrize("method", [FedUR(), FedMaPLe()], ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("shared_prefix", [True, False])
def test_checkpointing_keeps_every_value_and_gradient(tiny_clip, method, shared_prefix):
    model = PromptedCLIP(tiny_clip, list(CLASSES), 2, 2, None, 0.02, 1)
    model.shared_prefix_text = shared_prefix
    pieces = initial_values(method.pieces(), model, 1)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    plain = grads(model, method, pieces, images)
    model.checkpointing = True
    checkpointed = grads(model, method, pieces, images)
    assert torch.equal(plain[0], checkpointed[0]) and plain[1].keys() == checkpointed[1].keys() and plain[1]
    assert all(torch.equal(plain[1][k], checkpointed[1][k]) for k in plain[1])


TINY_RUN = ["--config", "configs/tiny.yaml", "--federation.rounds", "1", "--federation.local_epochs", "1",
            "--federation.num_clients", "2", "--run.progress", "false"]


@pytest.mark.slow  # two whole runs
def test_a_run_shows_its_estimate_and_checkpointing_changes_no_result(tmp_path, run_main):
    plain = run_main(*TINY_RUN, "--run.output_dir", str(tmp_path / "plain"), "--run.memory_estimate", "on")
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "peak memory per client (estimated before any compute, FedUR's forward)" in plain.stdout
    memory = json.loads((tmp_path / "plain" / "summary.json").read_text())["memory"]
    assert memory["batch"] == 32 and memory["peak_bytes"] >= memory["train_bytes"] > memory["weights_bytes"] > 0
    checkpointed = run_main(*TINY_RUN, "--run.output_dir", str(tmp_path / "checkpointed"), "--model.checkpointing", "true")
    assert checkpointed.returncode == 0 and "peak memory" not in checkpointed.stdout  # auto: on a GPU only

    def results(run):
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]

    assert results("plain") == results("checkpointed")
