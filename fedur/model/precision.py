"""Sections that must compute in true float32 whatever the run's precision: logits, transport plans, caches.

Under `fabric.precision bf16-mixed` autocast runs the towers' matmuls in bf16; the few places where bf16's
coarse steps would change a decision (logits of ~30 move in steps of ~0.2, tying samples at the filters'
medians; exp(-cost / eps) of a transport plan) leave autocast for plain float32. Plain float32 is not enough
on its own: `torch.set_float32_matmul_precision('high')` (which Lightning's Tensor Core hint invites) makes
float32 matmuls TF32 on a GPU and bf16 passes on a CPU with AMX. `full_precision` pins both for its section
and restores what was set before; `ieee_float32_matmuls` does the same around the backward pass, where the
gradients of those sections are computed (bf16 matmuls there stay bf16).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def full_precision(device: torch.device | str) -> Iterator[None]:
    """Autocast off (where `device`'s type has autocast) and float32 matmuls in full IEEE float32 inside."""
    device_type = torch.device(device).type
    autocast = torch.autocast(device_type, enabled=False) if torch.amp.is_autocast_available(device_type) \
        else contextlib.nullcontext()
    with autocast, ieee_float32_matmuls():
        yield


@contextlib.contextmanager
def ieee_float32_matmuls() -> Iterator[None]:
    """Float32 matmuls in full IEEE float32 inside (no TF32, no bf16 passes), whatever was set; restored after.
    Around a backward pass too: the backward of a float32 section runs there, outside `full_precision`."""
    try:  # the legacy switch, torch.set_float32_matmul_precision, the one users and Lightning's hint set
        before = torch.get_float32_matmul_precision()
    except RuntimeError:  # torch >= 2.9 refuses the legacy getter once the per-backend switches were used
        before = None
    if before == "highest":  # the default: nothing to change
        yield
        return
    if before is not None:
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)
        return
    backends = [b for b in (torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None))
                if b is not None and hasattr(b, "fp32_precision")]
    saved = [b.fp32_precision for b in backends]
    for backend in backends:
        backend.fp32_precision = "ieee"
    try:
        yield
    finally:
        for backend, value in zip(backends, saved):
            backend.fp32_precision = value
