"""RunConfig's data-parallel fields and the SimulatedLink / Straggler specs: defaults,
validation (every raise), labels and the JSON round trip."""
from __future__ import annotations

import pytest

from perflab import RunConfig, RunResult
from perflab.core.simulated import LINK_PRESETS, SimulatedLink
from perflab.core.simulated import Straggler
from tests.synthetic import synthetic_result

ONE_GBE = SimulatedLink.preset("1gbe")


def test_defaults_mean_single_process():
    c = RunConfig()
    assert (c.world_size, c.bucket_cap_mb, c.gradient_as_bucket_view, c.comm_hook,
            c.accumulation_steps, c.link, c.straggler) == (1, 25.0, False, "none", 1,
                                                           None, None)


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0), "world_size must be an int in 1..64"),
    (dict(world_size=True), "world_size must be an int in 1..64"),
    (dict(world_size=2, bucket_cap_mb=0), "bucket_cap_mb must be a number of MiB"),
    (dict(world_size=2, gradient_as_bucket_view="yes"), "gradient_as_bucket_view must be"),
    (dict(world_size=2, comm_hook="int8"), "comm_hook must be one of"),
    (dict(world_size=2, accumulation_steps=0), "accumulation_steps must be an int in 1..1024"),
    (dict(world_size=2, link="1gbe"), r"link must be None or a SimulatedLink \(e.g. "
                                      r"SimulatedLink.preset\('1gbe'\)\)"),
    (dict(world_size=2, straggler=1), "straggler must be None or a Straggler"),
    (dict(comm_hook="fp16"), "comm_hook only apply to data-parallel runs; set world_size >= 2"),
    (dict(bucket_cap_mb=1, link=ONE_GBE), "bucket_cap_mb, link only apply to data-parallel"),
    (dict(accumulation_steps=0), "accumulation_steps must be an int in 1..1024"),
    (dict(straggler=Straggler(rank=0, delay_s=0.1)), "straggler only apply"),
    (dict(world_size=2, straggler=Straggler(rank=2, delay_s=0.1)),
     r"straggler.rank=2 but world_size=2; use a rank in 0..1"),
    (dict(world_size=2, link=ONE_GBE, comm_hook="powersgd"),
     "cannot be combined with comm_hook='powersgd'"),
])
def test_invalid_distributed_values_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="", alpha_s=0, beta_bytes_per_s=1), "name must be a non-empty string"),
    (dict(alpha_s=-1e-6, beta_bytes_per_s=1e9), "alpha_s must be >= 0 seconds"),
    (dict(alpha_s=0, beta_bytes_per_s=0), "beta_bytes_per_s must be > 0"),
])
def test_link_spec_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimulatedLink(**kwargs)


def test_link_presets_and_model():
    with pytest.raises(ValueError, match=r"unknown link preset 'wifi'; choose one of"):
        SimulatedLink.preset("wifi")
    assert set(LINK_PRESETS) == {"nvlink", "efa400", "ib100", "10gbe", "1gbe"}
    # 1 Gbit/s = 125e6 bytes/s: 25 MB take 0.2 s plus alpha
    assert ONE_GBE.message_time_s(25_000_000) == pytest.approx(50e-6 + 0.2)
    assert str(ONE_GBE) == "simulated link 1gbe: alpha=50 us, beta=0.125 GB/s"


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=-1, delay_s=0.1), "rank must be an int >= 0"),
    (dict(rank=0), "exactly one of delay_s"),
    (dict(rank=0, delay_s=0.1, delay_frac=0.2), "exactly one of delay_s"),
    (dict(rank=0, delay_s=-0.1), "delay_s must be a number >= 0"),
    (dict(rank=0, delay_frac=True), "delay_frac must be a number >= 0"),
    (dict(rank=0, delay_s=0.1, where="optimizer"), "where must be one of"),
])
def test_straggler_spec_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Straggler(**kwargs)


def test_labels_name_the_simulated_link_and_the_straggler():
    c = RunConfig(world_size=2, bucket_cap_mb=1, link=ONE_GBE,
                  straggler=Straggler(rank=1, delay_frac=0.2, where="before_backward"))
    assert c.display_label() == ("ranks=2 bucket_mb=1 simulated link 1gbe: alpha=50 us, "
                                 "beta=0.125 GB/s, straggler rank 1 +20 % of step "
                                 "before_backward")
    assert c.replace(label="slow rank").display_label() == (
        "slow rank (simulated link 1gbe: alpha=50 us, beta=0.125 GB/s, straggler rank 1 "
        "+20 % of step before_backward)")
    assert c.replace(label="1gbe link, straggler").display_label() == "1gbe link, straggler"


def test_round_trip_through_json(tmp_path):
    c = RunConfig(world_size=4, comm_hook="fp16", link=ONE_GBE, accumulation_steps=2,
                  straggler=Straggler(rank=3, delay_s=0.05, where="data"))
    assert RunConfig.from_dict(c.to_dict()) == c
    r = synthetic_result(c, {"forward": 10.0, "backward": 20.0})
    r = RunResult(**{**r.__dict__, "rank": 3, "extra": {"buckets": [{"index": 0}]}})
    saved = r.save(tmp_path)
    assert saved.path.endswith("-rank3.json")
    back = RunResult.load(saved.path)
    assert (back.config, back.rank, back.extra) == (c, 3, {"buckets": [{"index": 0}]})


def test_accumulation_applies_to_one_process_too():
    c = RunConfig(batch_size=8, accumulation_steps=4)
    assert c.samples_per_step == 32
    assert RunConfig(world_size=2, batch_size=8).samples_per_step == 8  # per rank
