"""How much can any classifier on tiny-clip's frozen image features beat its zero-shot prediction?

Fits a multinomial logistic regression (a linear probe) on tiny-clip's normalised image features with
the TRUE labels of a CIFAR-10 train subset and compares it with zero-shot CLIP on a test subset. A
probe that barely beats zero-shot means the features, not the text side, limit every prompt method
that shares one image representation across clients (see learning_check.py).

    python benchmarks/tiny_clip_headroom.py            # ~1 min on 2 CPU cores

`--data-root DIR` reads an extracted CIFAR-10 folder (any subset of it) instead of extracting the archive;
`--out FILE` also writes the figures as Markdown.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.learning_check import extract  # noqa: E402
from fedur.data.datasets import DataOptions, ImageFolder, prepare_dataset  # noqa: E402
from fedur.model.clip import load_clip, zero_shot_weights  # noqa: E402


def features(clip, split) -> torch.Tensor:
    images = torch.stack([clip.preprocess(split.load(i)) for i in range(len(split))])
    with torch.no_grad():
        return F.normalize(clip.model.encode_image(images), dim=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared-dir", type=Path, default=Path(os.environ.get("FEDUR_SHARED_DIR", REPO.parent / "shared")))
    parser.add_argument("--data-root", type=Path, help="an extracted CIFAR-10 folder (default: the shared archive, "
                                                        "extracted into --workdir)")
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "results" / "learning_check")
    parser.add_argument("--train-fraction", type=float, default=0.2)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the figures here (Markdown)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    root = args.data_root or extract(args.shared_dir / "data" / "cifar10-jpg.tar.gz", args.workdir / "cifar10-jpg")
    tiny = args.shared_dir / "assets" / "tiny-clip"
    clip = load_clip("tinyclip-teacher-a", str(tiny / "tinyclip-teacher-a.pt"), str(tiny / "tinyclip-teacher-a.json"))
    data = prepare_dataset(ImageFolder(str(root)), DataOptions(train_fraction=args.train_fraction,
                                                               test_fraction=args.test_fraction), seed=1)
    train_x, test_x = features(clip, data.train), features(clip, data.test)
    train_y, test_y = torch.from_numpy(data.train.labels), torch.from_numpy(data.test.labels)

    text = zero_shot_weights(clip, data.classnames, data.template, torch.device("cpu"))
    zero_shot = float(((test_x @ text.t()).argmax(dim=1) == test_y).float().mean())

    weight = torch.zeros(train_x.shape[1], data.num_classes, requires_grad=True)
    bias = torch.zeros(data.num_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=500)

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(train_x @ weight * 10 + bias, train_y) + 1e-4 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        probe_test = float(((test_x @ weight * 10 + bias).argmax(dim=1) == test_y).float().mean())
        probe_train = float(((train_x @ weight * 10 + bias).argmax(dim=1) == train_y).float().mean())
    lines = [f"CIFAR-10 subset: {len(train_y)} train / {len(test_y)} test images, tiny-clip image features",
             f"zero-shot CLIP test accuracy:          {100 * zero_shot:.2f}%",
             f"linear probe (true labels) test:       {100 * probe_test:.2f}%   (train {100 * probe_train:.2f}%)"]
    print("\n".join(lines))
    if args.out:
        command = "python benchmarks/tiny_clip_headroom.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(["# tiny-clip: a linear probe against zero-shot", "", f"`{command.strip()}`", "",
                                        "| | test accuracy | train accuracy |", "| --- | --- | --- |",
                                        f"| zero-shot CLIP | {100 * zero_shot:.2f}% | |",
                                        f"| linear probe (true labels) | {100 * probe_test:.2f}% | {100 * probe_train:.2f}% |",
                                        "", f"{len(train_y)} train / {len(test_y)} test images.", ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
