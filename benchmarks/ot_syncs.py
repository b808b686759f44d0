"""Host synchronisations and time of FedOTP's transport plan (fedur/methods/fedotp_math.py), per call.

For each solver ('COT', 'Sinkhorn') and stop rule (per problem, batch-wide), on FedOTP-sized similarities
(B images x C classes problems of M patches x N = 2 prompts, CLIP-like positive cosines): the reads of
device values back to the host (counted at the dispatcher: item / bool / ... all end in
aten._local_scalar_dense) and the median time of `ot_plan`, with the stop state read after every
iteration (check_every=1, the former behaviour) and with the default schedule (reads after iterations
1, 2, 4, 8 and every 16th). Both must give the same bits: the script exits non-zero where they do not.

    python benchmarks/ot_syncs.py                       # CPU (there check_every's default is 1: forced to 16)
    python benchmarks/ot_syncs.py --device cuda --b 64 --c 100 --m 196
    python benchmarks/ot_syncs.py --device cpu --b 1 --c 2 --m 4 --d 8 --repeats 1 --out /tmp/ot.md   # a smoke

The table is printed, and written to --out when given.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedur.methods import fedotp_math
from fedur.methods.fedotp_math import ot_plan


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


def similarities(b, c, m, n, d, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=g)
    p = torch.nn.functional.normalize(base + 0.8 * torch.randn(b, m, d, generator=g), dim=-1)
    t = torch.nn.functional.normalize(base + 0.8 * torch.randn(n, c, d, generator=g), dim=-1)
    return torch.einsum("bmd,ncd->bcmn", p, t).to(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--b", type=int, default=32)
    ap.add_argument("--c", type=int, default=100)
    ap.add_argument("--m", type=int, default=196)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = ap.parse_args(argv)
    # The module's schedule is switched below; put back as found, so that a caller in the same process (the test
    # suite's smoke) sees fedur's own defaults afterwards.
    check_every, no_sync = fedotp_math.CHECK_EVERY, fedotp_math._NO_SYNC_DEVICES
    try:
        lines, different = measure(args, check_every)
    finally:
        fedotp_math.CHECK_EVERY, fedotp_math._NO_SYNC_DEVICES = check_every, no_sync
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/ot_syncs.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.write_text(f"`{command.strip()}`\n\n" + "\n".join(lines) + "\n")
    if different:
        print(f"ot_syncs: the plans differ between the schedules: {', '.join(different)}", file=sys.stderr)
        return 1
    return 0


def measure(args: argparse.Namespace, default_every: int) -> tuple[list[str], list[str]]:
    """The table's lines (printed as they come) and the settings whose two schedules gave other bits."""
    device = torch.device(args.device)
    sim = similarities(args.b, args.c, args.m, 2, args.d, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fedotp_math._NO_SYNC_DEVICES = frozenset()  # the accelerator default, also on the CPU
    lines, different = [], []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"device {device}, sim {tuple(sim.shape)}, default check_every {default_every}")
    say("| ot | stop | thresh | reads, every iteration | reads, default | ms, every iteration | ms, default | same bits |")
    say("|---|---|---|---|---|---|---|---|")
    for ot in ("COT", "Sinkhorn"):
        for per_problem_stop in (True, False):
            for thresh in (1e-3, 0.0):
                kw = dict(ot=ot, thresh=thresh, per_problem_stop=per_problem_stop)
                fedotp_math.CHECK_EVERY = 1
                with SyncCounter() as c1:
                    T1 = ot_plan(sim, **kw)
                fedotp_math.CHECK_EVERY = default_every
                with SyncCounter() as c2:
                    T2 = ot_plan(sim, **kw)
                same = torch.equal(T1.view(torch.int32), T2.view(torch.int32))
                times = {1: [], default_every: []}
                for _ in range(args.repeats):  # alternate, so that load falls on both
                    for every in times:
                        fedotp_math.CHECK_EVERY = every
                        sync()
                        t0 = time.perf_counter()
                        ot_plan(sim, **kw)
                        sync()
                        times[every].append(1e3 * (time.perf_counter() - t0))
                fedotp_math.CHECK_EVERY = default_every
                ms1, ms2 = (statistics.median(times[k]) for k in (1, default_every))
                stop = "per problem" if per_problem_stop else "batch"
                say(f"| {ot} | {stop} | {thresh:g} | {c1.n} | {c2.n} | {ms1:.2f} | {ms2:.2f} | {same} |")
                if not same:
                    different.append(f"{ot} {stop} thresh {thresh:g}")
    return lines, different


if __name__ == "__main__":
    sys.exit(main())
