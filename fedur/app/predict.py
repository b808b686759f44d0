"""fedur-predict: label new images with one client's model of a finished run.

    fedur-predict RUN IMAGES... --client K [--model personal|server|zero-shot|chosen] [--round N] [--out FILE.csv]

IMAGES are image files or folders (searched recursively for .jpg, .jpeg, .png, .bmp, .gif, .webp, .tif, .tiff). The
model is the one `fedur-export` writes (fedur/methods/export.py), built from the run directory in memory; the images go
through its preprocess and its logits in batches (--batch-size), with a progress bar, on the GPU when there is one
(--device). The CSV (--out, else standard output) has one line per image: image, class (index), name, confidence (the
top-1 softmax probability). An image that cannot be read stops the command with its path, or with --corrupt-images skip
(default: the run's data.corrupt_images) is left out and listed on standard error.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from fedur.errors import FedurError
from fedur.methods.export import ExportedModel, from_export

EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


class PredictError(FedurError, ValueError):
    """The images cannot be labelled as asked; the message says why and what to do."""


def image_paths(given: list[Path]) -> list[Path]:
    """The image files named, a folder's image files (recursively, sorted), in the order given."""
    found = []
    for path in given:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in EXTENSIONS)
        elif path.is_file():
            found.append(path)
        else:
            raise PredictError(f"{path}: no such file or folder; give image files or folders of images")
    if not found:
        raise PredictError(f"no image file in {', '.join(map(str, given))} (looked for {', '.join(sorted(EXTENSIONS))})")
    return found


def batches(paths: list[Path], preprocess, batch_size: int, corrupt: str, skipped: list[str]) -> Iterator[tuple[list[Path], torch.Tensor]]:
    """(paths, (b, 3, S, S) preprocessed images) in batches; an unreadable image stops (`corrupt` "stop") or is
    left out and listed in `skipped`."""
    for start in range(0, len(paths), batch_size):
        kept, images = [], []
        for path in paths[start:start + batch_size]:
            try:
                with Image.open(path) as image:
                    images.append(preprocess(image.convert("RGB")))
            except (OSError, UnidentifiedImageError, ValueError) as err:
                if corrupt == "stop":
                    raise PredictError(f"{path}: cannot be read as an image ({type(err).__name__}: {err}); fix or remove "
                                       "it, or pass --corrupt-images skip") from err
                skipped.append(str(path))
                continue
            kept.append(path)
        if kept:
            yield kept, torch.stack(images)


@torch.no_grad()
def predict(model: ExportedModel, paths: list[Path], batch_size: int, corrupt: str, progress: bool = True
            ) -> tuple[list[tuple[str, int, str, float]], list[str]]:
    """(image, class, name, confidence) of every readable image, and the images left out."""
    device = next(model.buffers()).device
    rows, skipped = [], []
    steps = batches(paths, model.preprocess, batch_size, corrupt, skipped)
    total = -(-len(paths) // batch_size)
    for kept, images in tqdm(steps, total=total, desc="batches", disable=not progress, file=sys.stderr):
        probabilities = torch.softmax(model(images.to(device)).float(), dim=-1).cpu()
        confidence, predicted = probabilities.max(dim=-1)
        rows += [(str(p), int(c), model.classnames[int(c)], float(v)) for p, c, v in zip(kept, predicted, confidence)]
    return rows, skipped


def write_csv(rows: list[tuple[str, int, str, float]], out) -> None:
    writer = csv.writer(out)
    writer.writerow(["image", "class", "name", "confidence"])
    writer.writerows([image, k, name, f"{confidence:.6f}"] for image, k, name, confidence in rows)


def main(argv: list[str] | None = None) -> int:
    from fedur.app.export import MODELS, exported

    parser = argparse.ArgumentParser(prog="fedur-predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished fedur run (its run.output_dir)")
    parser.add_argument("images", type=Path, nargs="+", help="image files or folders of images")
    parser.add_argument("--client", type=int, required=True, help="whose model labels them (0 .. K-1)")
    parser.add_argument("--model", choices=MODELS, default="personal",
                        help="personal (default), the server's, zero-shot CLIP, or the one chosen without labels")
    parser.add_argument("--round", type=int, default=None, help="after this round (a kept checkpoint; default: the last)")
    parser.add_argument("--out", type=Path, default=None, help="the CSV file (default: standard output)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: the GPU when there is one")
    parser.add_argument("--corrupt-images", choices=("stop", "skip"), default=None,
                        help="an unreadable image stops the command or is left out (default: the run's data.corrupt_images)")
    parser.add_argument("--weights", default=None, help="the backbone's weights file, where it lies elsewhere than in the run")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else "cpu" if args.device == "auto" else args.device
    try:
        if device == "cuda" and not torch.cuda.is_available():
            raise PredictError("--device cuda: no CUDA device is visible here; use --device cpu or auto")
        if args.batch_size < 1:
            raise PredictError(f"--batch-size {args.batch_size}: give a positive number")
        paths = image_paths(args.images)
        content = exported(args.run_dir, args.client, args.model, args.round)
        corrupt = args.corrupt_images or run_corrupt_setting(args.run_dir)
        model = from_export(content, device, args.weights)
        rows, skipped = predict(model, paths, args.batch_size, corrupt, progress=not args.no_progress)
    except FedurError as err:
        print(f"fedur-predict: error: {err.one_line()}", file=sys.stderr)
        return 2
    if args.out is None:
        write_csv(rows, sys.stdout)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            write_csv(rows, f)
    if skipped:
        print(f"fedur-predict: {len(skipped)} unreadable image(s) left out: {', '.join(skipped[:5])}"
              + (" ..." if len(skipped) > 5 else ""), file=sys.stderr)
    where = "" if args.out is None else f" to {args.out}"
    print(f"fedur-predict: {len(rows)} image(s) labelled with client {args.client}'s {content['kind'].replace('_', '-')} "
          f"model after round {content['round']} on {device}{where}", file=sys.stderr)
    return 0


def run_corrupt_setting(run_dir: Path) -> str:
    """The run's data.corrupt_images (stop when its config.yaml does not say)."""
    import yaml

    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
    return (config.get("data") or {}).get("corrupt_images", "stop")


if __name__ == "__main__":
    sys.exit(main())
