"""Lab 06's reading of nccl-tests tables: which rows to fit for a prediction, and the
table's own time at a size it did not print.

NCCL picks its algorithm (ring, tree, NVLS, ...) and protocol (LL, LL128, Simple) per
call from a tuning model of the number of nodes, GPUs per node, message size and intra- and
inter-node bandwidth, moving from one combination to another as the size grows (NCCL's
maintainer in https://github.com/NVIDIA/nccl/issues/754: "tree/LL -> ring/LL ->
tree/LL128 -> ring/LL128 -> tree/simple -> ring/simple. Or any other combination"), so one
alpha-beta line fitted from 8 B to GiB averages regimes that do not hold at the size
being predicted. The rule this lab teaches: fit, or read, a table only over the size range
you predict. :func:`size_window` gives the rows to fit; :func:`read_between` reads the
table at a size between two of its rows. Both take the frames of
:func:`perflab.analysis.recordings.read_nccl_tests` (``size_bytes`` and a time column in
microseconds).
"""
from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

__all__ = ["size_window", "read_between"]


def _sizes(table: pd.DataFrame, size_bytes: float) -> np.ndarray:
    if "size_bytes" not in table or len(table) < 2:
        raise ValueError("table needs a size_bytes column and at least 2 rows (an nccl-tests "
                         "table from perflab.analysis.recordings.read_nccl_tests)")
    if (isinstance(size_bytes, (bool, np.bool_)) or not isinstance(size_bytes, numbers.Real)
            or not size_bytes > 0):
        raise ValueError(f"size_bytes must be a number of bytes > 0, got {size_bytes!r}")
    sizes = table["size_bytes"].to_numpy(dtype=float)
    if not sizes.min() <= size_bytes <= sizes.max():
        raise ValueError(f"size_bytes={size_bytes:g} is outside the table's sizes "
                         f"({sizes.min():g} to {sizes.max():g} bytes): that would be an "
                         "extrapolation, which no rule about fitted ranges makes safe")
    return sizes


def size_window(table: pd.DataFrame, size_bytes: float, factor: float = 4.0) -> pd.DataFrame:
    """The rows of ``table`` whose message size lies within ``factor`` of ``size_bytes``
    (``size_bytes / factor <= size <= size_bytes * factor``): the rows an alpha-beta fit
    should use to predict ``size_bytes``.

    Args:
        table: an nccl-tests table (:func:`perflab.analysis.recordings.read_nccl_tests`).
        size_bytes: the message size to predict, bytes, within the table's sizes.
        factor: how far either side to look (> 1). 4 takes two rows either side of a
            size between rows of a factor-2 sweep (nccl-tests' ``-f 2``).

    Returns:
        The selected rows, in the table's order (a copy).

    Raises:
        ValueError: ``size_bytes`` not > 0 or outside the table's sizes, ``factor`` not
            > 1, or fewer than 2 rows in the window (an alpha-beta line needs 2).
    """
    sizes = _sizes(table, size_bytes)
    if isinstance(factor, (bool, np.bool_)) or not isinstance(factor, numbers.Real) or not factor > 1:
        raise ValueError(f"factor must be a number > 1, got {factor!r}")
    keep = (sizes >= size_bytes / factor) & (sizes <= size_bytes * factor)
    if keep.sum() < 2:
        raise ValueError(f"only {int(keep.sum())} row(s) within a factor {factor:g} of "
                         f"{size_bytes:g} bytes: an alpha-beta fit needs 2; widen factor")
    return table[keep].copy()


def read_between(table: pd.DataFrame, size_bytes: float, column: str = "time_us") -> float:
    """The table's ``column`` at ``size_bytes``, read on the straight line through the two
    rows that bracket it (a row of that size exactly: its own value).

    A straight line in size through two rows is the alpha-beta line ``T = alpha + n / beta``
    that fits those two rows exactly: the narrowest fitted range there is.

    Args:
        table: an nccl-tests table, sizes increasing.
        size_bytes: bytes, within the table's sizes.
        column: the column to read (``"time_us"``, ``"time_us_inplace"``).

    Returns:
        The interpolated value, in ``column``'s unit.

    Raises:
        ValueError: ``size_bytes`` outside the table's sizes or not > 0, sizes not
            increasing, or no such column.
    """
    sizes = _sizes(table, size_bytes)
    if column not in table:
        raise ValueError(f"no column {column!r}; the table has {list(table.columns)}")
    if not np.all(np.diff(sizes) > 0):
        raise ValueError("the table's sizes must increase row by row, as nccl-tests prints them")
    return float(np.interp(size_bytes, sizes, table[column].to_numpy(dtype=float)))
