"""Devices: which one a run uses, and what each can run.

``"auto"`` picks CUDA, then MPS, then the CPU; a named device that this machine lacks is
an error that names what to use instead.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["DEVICES", "resolve_device", "check_device_support"]

#: The device names a :class:`~perflab.core.config.RunConfig` accepts (``"cuda:N"`` too).
DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(device: str) -> torch.device:
    """``"auto"`` -> CUDA if available, then MPS, then CPU; other names pass through.

    Raises:
        ValueError: the named device type is not available on this machine.
    """
    kind = device.split(":")[0]
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here; "
                         "use device='auto' or 'cpu'")
    if kind == "mps" and not (getattr(torch.backends, "mps", None)
                              and torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r} but MPS is not available here; "
                         "use device='auto' or 'cpu'")
    return torch.device(device)


def check_device_support(config: Any, dev: torch.device) -> None:
    """Combinations of a :class:`~perflab.core.config.RunConfig`'s fields that the resolved
    device ``dev`` cannot run.

    Raises:
        ValueError: naming the field and what to use on this device instead.
    """
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(msg)

    need(not config.pin_memory or dev.type == "cuda",
         f"pin_memory=True needs a CUDA device; on {dev.type} set pin_memory=False")
    need(config.amp != "fp16" or dev.type == "cuda",
         f"amp='fp16' needs a CUDA device; on this {dev.type} use amp='bf16' or 'off'")
    if config.amp == "bf16" and dev.type == "cuda":
        need(torch.cuda.is_bf16_supported(),
             "amp='bf16' needs compute capability >= 8.0; on this GPU use amp='fp16'")
    need(not (config.amp == "bf16" and dev.type == "mps"),
         "amp='bf16' is not supported by perflab on MPS; use amp='off'")
    need(config.compile not in ("reduce-overhead", "max-autotune") or dev.type == "cuda",
         f"compile={config.compile!r} uses CUDA graphs and needs a CUDA device; on "
         f"{dev.type} use compile='default' or 'max-autotune-no-cudagraphs'")
