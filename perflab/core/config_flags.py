"""``RunConfig`` <-> command-line flags: one flag per
:class:`~perflab.core.config.RunConfig` field, generated from the dataclass, so a command
line and the config cannot drift apart.

``perflab run`` / ``perflab profile`` (:mod:`perflab.cli`) and ``python -m
perflab.distributed`` build their flags with :func:`add_config_flags` and turn the parsed
flags into a validated config with :func:`config_from_args` (bad values give RunConfig's
own errors). Kept beside the config, as torchtitan's ``config/manager.py`` is, so that
layers below the command line (``perflab.distributed``) can share it. Imports only
argparse and the standard library at import time; the config itself (and with it torch)
is imported when a parser is built.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

__all__ = ["DDP_FIELDS", "parse_straggler", "add_config_flags", "config_from_args"]

#: RunConfig fields that only data-parallel runs (world_size >= 2) use. ``perflab run``
#: shows them as a group of their own; ``perflab profile`` (one process) leaves them out.
DDP_FIELDS = ("world_size", "bucket_cap_mb", "gradient_as_bucket_view", "comm_hook",
              "link", "straggler")


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "off") else int(text)


def _parse_str_or_int(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def parse_straggler(text: str):
    """``"RANK:DELAY_S[:WHERE]"`` -> :class:`perflab.core.simulated.Straggler`.

    Raises:
        ValueError: not of that form (the message shows an example).
    """
    from perflab.core.simulated import Straggler

    parts = text.split(":")
    try:
        rank, delay = int(parts[0]), float(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"--straggler must be RANK:DELAY_S[:WHERE], e.g. "
                         f"1:0.05:before_forward; got {text!r}") from None
    if len(parts) > 3:
        raise ValueError(f"--straggler must be RANK:DELAY_S[:WHERE], got {text!r}")
    return Straggler(rank=rank, delay_s=delay, where=parts[2] if len(parts) == 3
                     else "before_forward")


def add_config_flags(parser: argparse.ArgumentParser, *, distributed: bool = True):
    """Add ``--preset`` and one flag per :class:`RunConfig` field to ``parser``.

    Flags are the field names with dashes (``--batch-size``); a flag not given keeps the
    preset's value. Booleans get ``--x/--no-x``, ``Literal`` fields their choices,
    ``int | None`` fields accept ``none``. ``--link`` takes a simulated-link preset name
    and ``--straggler`` takes ``RANK:DELAY_S[:WHERE]``; :func:`config_from_args` turns
    them into objects.

    Args:
        parser: the parser (or subparser) to extend.
        distributed: also add the data-parallel fields (:data:`DDP_FIELDS`), as a group
            of their own; False leaves them out (a command that runs one process).

    Returns:
        The data-parallel argument group (for more DDP-only flags), or None.
    """
    from perflab.core.config import PRESETS, RunConfig
    from perflab.core.simulated import LINK_PRESETS

    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                        help="start from a named preset (default: quick)")
    ddp = parser.add_argument_group(
        "data-parallel (DDP) flags", "used with --world-size N >= 2: N local ranks (gloo "
        "on CPU, NCCL on GPUs), one result per rank") if distributed else None
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in DDP_FIELDS and ddp is None:
            continue
        group = ddp if f.name in DDP_FIELDS else parser
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS,
                    "help": f"RunConfig.{f.name} (default {f.default!r})"}
        if f.name == "link":
            kw["help"] = (f"simulated interconnect: {', '.join(sorted(LINK_PRESETS))} or "
                          "none (default none)")
            group.add_argument(flag, metavar="PRESET|none", **kw)
        elif f.name == "straggler":
            kw["help"] = ("delay one rank every step, e.g. 1:0.05:before_forward (WHERE: "
                          "before_forward, before_backward or data; default none)")
            group.add_argument(flag, metavar="RANK:DELAY_S[:WHERE]", **kw)
        elif hint is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif hint is int:
            group.add_argument(flag, type=int, **kw)
        elif hint is float:
            group.add_argument(flag, type=float, **kw)
        elif hint == (int | None) or hint == typing.Optional[int]:
            group.add_argument(flag, type=_parse_optional_int, metavar="INT|none", **kw)
        elif hint == (str | int):
            group.add_argument(flag, type=_parse_str_or_int, metavar="NAME|INT", **kw)
        else:
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal \
                else None
            group.add_argument(flag, choices=choices, **kw)
    return ddp


def config_from_args(args: argparse.Namespace):
    """The :class:`RunConfig` for parsed :func:`add_config_flags` flags: the preset with
    every flag given applied; ``--link``/``--straggler`` text made into objects.

    Raises:
        ValueError: RunConfig's own validation, an unknown link preset, or a straggler
            not of the form ``RANK:DELAY_S[:WHERE]`` (each message names the fix).
    """
    from perflab.core.config import RunConfig
    from perflab.core.simulated import SimulatedLink

    names = {f.name for f in dataclasses.fields(RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if isinstance(values.get("link"), str):
        text = values["link"]
        values["link"] = None if text in ("none", "off") else SimulatedLink.preset(text)
    if isinstance(values.get("straggler"), str):
        text = values["straggler"]
        values["straggler"] = None if text in ("none", "off") else parse_straggler(text)
    return RunConfig.preset(args.preset, **values)
