"""The ``perflab`` command (also ``python -m perflab``): doctor, data, run, profile,
ladder, plan, results, labs, kernel, course.

One module per command (:mod:`perflab.cli.run`, :mod:`perflab.cli.ladder`, ...), each
with ``add_parser(subparsers)`` and its handler; :mod:`perflab.cli.app` builds the top
parser from them and runs a command line (:func:`main`, the ``perflab`` entry point).
``perflab run`` has one flag per :class:`~perflab.core.config.RunConfig` field, generated
from the dataclass by :mod:`perflab.core.config_flags`, which ``python -m
perflab.distributed`` shares.
"""
from perflab.cli.app import build_parser, main

__all__ = ["main", "build_parser"]
