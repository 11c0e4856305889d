"""The measured roofline: per-dtype matmul roofs, copy bandwidth, and what they explain.

The sentences and ratios are tested on hand-built :class:`Roofline` values (no timing
asserts); the live measurement is tested for its shape and its cache only.
"""
from __future__ import annotations

import pytest

from perflab.analysis.peak import measured_peak, peak_flops
from perflab.analysis.roofline import (
    ROOFLINE_DTYPES, MatmulRoof, Roofline, measure_matmul, measure_roofline,
)


def _roof(fp32=100.0, bf16=2.0, fp16=None, bw=10.0, device="cpu") -> Roofline:
    def r(d, g):
        return MatmulRoof(d, g, 256 if g else 0, "" if g else "not run here")
    return Roofline(device=device, device_name="test", threads=2,
                    matmul=(r("fp32", fp32), r("bf16", bf16), r("fp16", fp16)),
                    bandwidth_gb_s=bw, copy_mib=64)


def test_ratio_ridge_and_attainable():
    roof = _roof()
    assert roof.ratio("bf16") == pytest.approx(0.02)
    assert roof.ratio("fp16") is None and roof.gflops("fp16") is None
    assert roof.ridge_flops_per_byte("fp32") == pytest.approx(10.0)
    assert roof.attainable_gflops("fp32", 2.0) == pytest.approx(20.0)     # memory-bound
    assert roof.attainable_gflops("fp32", 50.0) == pytest.approx(100.0)   # compute-bound
    assert not roof.accelerated("bf16")
    assert [row["dtype"] for row in roof.table()] == list(ROOFLINE_DTYPES)


def test_explain_says_what_the_measurement_shows():
    slow = _roof(bf16=30.0)
    assert slow.explain("bf16") == ("bf16 matmul runs at 0.3x of fp32 here (30 vs 100 "
                                    "GFLOP/s): this CPU's bf16 path is not accelerated")
    fast = _roof(fp32=50_000.0, bf16=700_000.0, device="cuda:0")
    assert "14x of fp32" in fast.explain("bf16") and "GPU's bf16 path is accelerated" \
        in fast.explain("bf16") and fast.accelerated("bf16")
    even = _roof(bf16=95.0)
    assert "about fp32's speed" in even.explain("bf16")
    assert "not measured here (not run here)" in slow.explain("fp16")
    assert "fp32 matmul: 100 GFLOP/s" == slow.explain("fp32")
    text = repr(slow)
    assert "bf16    matmul 30 GFLOP/s" in text and "0.3x fp32" in text
    assert "copy 10.0 GB/s" in text and "fp16    not measured: not run here" in text


def test_a_noisy_roof_says_so():
    roof = _roof(bf16=30.0)
    noisy = Roofline(device="cpu", device_name="test", threads=2,
                     matmul=(MatmulRoof("fp32", 100.0, 256, noisy=True), *roof.matmul[1:]),
                     bandwidth_gb_s=10.0, copy_mib=64)
    assert "noisy measurement" not in roof.explain("bf16")
    assert "noisy measurement: other programs competed" in noisy.explain("bf16")
    assert "FLOP/byte)  noisy" in repr(noisy)


@pytest.mark.parametrize("call, message", [
    (lambda: _roof().roof("fp8"), "dtype must be one of"),
    (lambda: _roof().attainable_gflops("fp32", 0.0), "flops_per_byte must be > 0"),
    (lambda: measure_matmul("cpu", "int8"), "dtype must be one of"),
    (lambda: measure_roofline("tpu"), "device must be one of|device="),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError):
        call()


def test_live_measurement_is_positive_and_cached():
    roof = measure_roofline("cpu")
    assert roof.device == "cpu" and roof.threads >= 1 and roof.bandwidth_gb_s > 0
    assert [r.dtype for r in roof.matmul] == list(ROOFLINE_DTYPES)
    assert roof.gflops("fp32") > 0 and roof.roof("fp32").n >= 256
    again = measure_roofline("cpu")
    assert again == roof  # cached per process: the same numbers, no new measurement
    # the CPU MFU peak is this same measurement, per dtype, labelled "measured"
    p = peak_flops("cpu", "bf16")
    assert p.flops_per_s == pytest.approx(roof.gflops("bf16") * 1e9)
    assert p.source.startswith("measured:") and "bf16 matmul" in p.source
    assert measured_peak("cpu", "fp32").flops_per_s == pytest.approx(roof.gflops("fp32") * 1e9)
