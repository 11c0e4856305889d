"""Lab 06's reading of the shipped nccl-tests tables (``perflab.labs.lab06.tables``): the
fitted-range rule, and the numbers section 8 of the lab prints from it.

Issue 44: one alpha-beta line over 8 B to 16 GiB predicted a 25 MiB DDP bucket 23-46 %
too fast (NCCL changes protocol and algorithm with size), and the line fitted to the
two-node p5 table gave a busbw eight times the network per GPU. These tests keep the rule
(fit only the sizes you predict) and what the lab says of the tables true.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perflab.analysis.recordings import nccl_table_names, read_nccl_tests
from perflab.core.simulated import LINK_PRESETS
from perflab.labs.lab06.tables import read_between, size_window

BUCKET = 25 * 2 ** 20  # DDP's default bucket_cap_mb


def _fit(table: pd.DataFrame) -> tuple[float, float]:
    """(alpha_s, busbw_bytes_per_s): the lab's relative least squares (Exercise 1)."""
    n, p = table.size_bytes.to_numpy(float), table.attrs["nranks"]
    t = table.time_us.to_numpy() * 1e-6
    rows = np.stack([np.ones_like(n), 2 * (p - 1) / p * n], axis=1) / t[:, None]
    (alpha, inv_busbw), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    return float(alpha), float(1 / inv_busbw)


def _predict_us(fit: tuple[float, float], size: float, p: int) -> float:
    return (fit[0] + 2 * (p - 1) / p * size / fit[1]) * 1e6


@pytest.mark.parametrize("name", nccl_table_names())
def test_one_line_over_every_size_predicts_the_bucket_far_too_fast(name):
    table = read_nccl_tests(name)
    full = _predict_us(_fit(table), BUCKET, table.attrs["nranks"])
    assert full < 0.8 * read_between(table, BUCKET)   # > 20 % too fast on every shipped table


@pytest.mark.parametrize("name", nccl_table_names())
def test_a_fit_over_the_sizes_near_the_bucket_predicts_it(name):
    table = read_nccl_tests(name)
    window = size_window(table, BUCKET)
    window.attrs = table.attrs
    near = _predict_us(_fit(window), BUCKET, table.attrs["nranks"])
    assert near == pytest.approx(read_between(table, BUCKET), rel=0.12)


def test_the_window_is_the_rows_within_a_factor_of_the_size():
    table = read_nccl_tests("aws-p5-1node-8gpu")
    assert size_window(table, BUCKET).size_bytes.tolist() == [2 ** k for k in (23, 24, 25, 26)]
    assert size_window(table, BUCKET, factor=2).size_bytes.tolist() == [2 ** 24, 2 ** 25]
    assert size_window(table, 2 ** 20, factor=2).size_bytes.tolist() == [2 ** 19, 2 ** 20, 2 ** 21]
    assert size_window(table, 8, factor=4).size_bytes.tolist() == [8, 16, 32]


def test_reading_between_rows_is_the_straight_line_through_them():
    table = read_nccl_tests("aws-p5-2node-16gpu-efa")
    row16, row32 = (table[table.size_bytes == 2 ** k].iloc[0] for k in (24, 25))
    want = row16.time_us + (BUCKET - 2 ** 24) / 2 ** 24 * (row32.time_us - row16.time_us)
    assert read_between(table, BUCKET) == pytest.approx(want)
    assert read_between(table, 2 ** 24) == row16.time_us
    assert read_between(table, 2 ** 24, "busbw_GBps") == row16.busbw_GBps


def test_two_nodes_busbw_is_many_times_the_network_per_gpu():
    """Section 8's claim: the full-range fit to the two-node p5 table gives a busbw about
    eight times efa400's 400 Gb/s per GPU, as large as one node's NVSwitch fit."""
    two = _fit(read_nccl_tests("aws-p5-2node-16gpu-efa"))[1]
    one = _fit(read_nccl_tests("aws-p5-1node-8gpu"))[1]
    assert 7 < two / LINK_PRESETS["efa400"].beta_bytes_per_s < 9
    assert two == pytest.approx(one, rel=0.05)


def test_at_the_buckets_size_two_nodes_take_about_twice_one_nodes_time():
    one, two = (read_nccl_tests(n) for n in ("aws-p5-1node-8gpu", "aws-p5-2node-16gpu-efa"))
    assert 1.5 < read_between(two, BUCKET) / read_between(one, BUCKET) < 3
    # ... and the same time, within 10 %, at the largest size both printed
    top = min(one.size_bytes.max(), two.size_bytes.max())
    assert read_between(two, top) == pytest.approx(read_between(one, top), rel=0.1)


@pytest.mark.parametrize("call, match", [
    (lambda t: size_window(t, 2 ** 40), "outside the table's sizes"),
    (lambda t: size_window(t, 4), "outside the table's sizes"),
    (lambda t: size_window(t, 0), "must be a number of bytes > 0"),
    (lambda t: size_window(t, True), "must be a number of bytes > 0"),
    (lambda t: size_window(t, BUCKET, factor=1), "factor must be a number > 1"),
    (lambda t: size_window(t, 3 * 2 ** 20, factor=1.1), "an alpha-beta fit needs 2"),
    (lambda t: size_window(t.iloc[:1], 8), "at least 2 rows"),
    (lambda t: read_between(t, BUCKET, "time_ms"), "no column 'time_ms'"),
    (lambda t: read_between(t.iloc[::-1], BUCKET), "must increase row by row"),
    (lambda t: read_between(t, 2 ** 40), "extrapolation"),
])
def test_bad_input_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call(read_nccl_tests("aws-p5-1node-8gpu"))
