"""The cluster link presets come from the shipped nccl-tests tables.

``perflab.core.simulated.LINK_PRESETS`` says where each cluster link's alpha and beta come
from; these tests recompute them from ``perflab/recordings/nccl/`` and its SOURCES.md, so a
preset cannot drift back to a figure no table supports (issue 44: an ``nvlink`` that charged
42 us for the 8-byte all-reduce that the shipped 8 x H100 table does in 12.9 us, and a
100 Gb/s network where H100 clusters have 400 Gb/s per GPU).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from perflab.analysis.recordings import read_nccl_tests
from perflab.core.simulated import LINK_PRESETS, LinkModel

SOURCES = Path(__file__).resolve().parents[2] / "perflab" / "recordings" / "nccl" / "SOURCES.md"

#: preset -> the table its alpha is derived from (the 8-byte all-reduce at the table's n)
ALPHA_FROM = {"nvlink": "aws-p5-1node-8gpu", "efa400": "aws-p5-2node-16gpu-efa",
              "ib100": "aws-p4d-2node-16gpu-efa"}


@pytest.mark.parametrize("preset", sorted(ALPHA_FROM))
def test_the_ring_model_charges_the_tables_8_byte_all_reduce_at_its_rank_count(preset):
    table = read_nccl_tests(ALPHA_FROM[preset])
    n, first = table.attrs["nranks"], table.iloc[0]
    assert first.size_bytes == 8
    modelled_us = LinkModel(LINK_PRESETS[preset], world_size=n).duration_s(8) * 1e6
    # within 2 % of what the table printed (out-of-place; the bandwidth term adds ~0)
    assert modelled_us == pytest.approx(first.time_us, rel=0.02), (preset, modelled_us)


def test_nvlink_latency_is_not_the_old_guess():
    """The old nvlink preset (3 us per hop) charged 42 us at 8 ranks; the table shows 12.9."""
    table = read_nccl_tests("aws-p5-1node-8gpu")
    modelled = LinkModel(LINK_PRESETS["nvlink"], world_size=8).duration_s(8) * 1e6
    assert modelled < 1.5 * table.time_us.iloc[0] < 42


def test_nvlink_bandwidth_is_the_one_node_tables_largest_busbw():
    """Inside one node every ring hop is NVLink, so the table's busbw is the link's beta."""
    table = read_nccl_tests("aws-p5-1node-8gpu")
    assert LINK_PRESETS["nvlink"].beta_bytes_per_s / 1e9 == pytest.approx(
        table.busbw_GBps.max(), abs=0.01)


def test_the_network_presets_are_the_per_gpu_line_rates_the_sources_give():
    sources = " ".join(SOURCES.read_text().split())
    # AWS p5.48xlarge: 3,200 Gbps of EFA for 8 H100 -> 400 Gb/s per GPU
    assert "3,200 Gbps of EFA" in sources and "3,200 / 8 = 400 Gbps on a p5" in sources
    assert "backed with 4x100 Gbps EFA" in sources   # the p4d's interfaces (aws-efa-eks)
    assert LINK_PRESETS["efa400"].beta_bytes_per_s * 8 == pytest.approx(3200e9 / 8)
    # ib100: 100 Gb/s, the line rate of one of a p4d's EFA interfaces (and of IB EDR/HDR100)
    assert LINK_PRESETS["ib100"].beta_bytes_per_s * 8 == pytest.approx(100e9)
    assert LINK_PRESETS["efa400"].beta_bytes_per_s == 4 * LINK_PRESETS["ib100"].beta_bytes_per_s


def test_a_two_node_tables_busbw_is_not_the_per_gpu_network():
    """What Lab 06 teaches with these presets: fitted over all sizes, the two-node p5
    table's busbw is several times efa400's per-GPU network (NCCL keeps most ring hops
    inside the nodes and spreads what crosses over all the node's interfaces)."""
    table = read_nccl_tests("aws-p5-2node-16gpu-efa")
    big = table[table.size_bytes >= 2 ** 30]
    ratio = big.busbw_GBps.min() * 1e9 / LINK_PRESETS["efa400"].beta_bytes_per_s
    assert 6 < ratio < 12


def test_every_preset_describes_itself_with_its_numbers():
    for name, link in LINK_PRESETS.items():
        assert link.name == name
        assert str(link).startswith(f"simulated link {name}: alpha=")
