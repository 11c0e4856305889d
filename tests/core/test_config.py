"""RunConfig: every validation error names the field and the fix."""
from __future__ import annotations

import dataclasses

import pytest

from perflab.core.config import PRESETS, RunConfig
from perflab.core.devices import resolve_device


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), "batch_size must be an int in 2..4,096"),
    (dict(batch_size=1), "BatchNorm"),
    (dict(steps=0), "steps must be an int in 2..100,000"),
    (dict(steps=1), "statistics need two samples"),
    (dict(warmup_steps=-1), "warmup_steps must be an int in 0..100,000"),
    (dict(lr=0), r"lr must be a finite number in \(0, 100\]"),
    (dict(num_workers=-1), "num_workers must be an int in 0..64"),
    (dict(persistent_workers=True), "persistent_workers=True needs num_workers > 0"),
    (dict(prefetch_factor=2), "prefetch_factor needs num_workers > 0"),
    (dict(num_workers=1, prefetch_factor=0), "prefetch_factor must be an int in 1..64 or None"),
    (dict(threads=0), "threads must be an int in 1..1,024 or None"),
    (dict(image_size=8), "image_size must be an int in 16..1,024 pixels"),
    (dict(device="tpu"), "device must be one of"),
    (dict(model="vgg"), "model must be one of"),
    (dict(seed=1.5), "seed must be an int"),
    (dict(dataset="/no/such/folder"), "is not a directory"),
    (dict(amp="fp8"), "amp must be one of"),
    (dict(compile="fast"), "compile must be one of"),
    (dict(checkpointing="all"), "checkpointing must be 'none', 'per_stage' or an int"),
    (dict(checkpointing=0), "checkpointing must be 'none', 'per_stage' or an int"),
    (dict(checkpointing=True), "checkpointing must be 'none', 'per_stage' or an int"),
    (dict(checkpointing=6), "resnet18 has 5 stages"),
    (dict(checkpointing="per_stage", model="tiny"), "needs model='resnet18'"),
    (dict(storage_latency_ms=-1), "storage_latency_ms must be a number of milliseconds"),
    (dict(storage_latency_ms=5000), r"in 0\.\.\.1000 \(0 = off\)"),
    (dict(storage_latency_ms=True), "storage_latency_ms must be a number"),
    (dict(storage_latency_ms="5"), "storage_latency_ms must be a number"),
    (dict(decoded_cache="disk"), "decoded_cache must be one of"),
    (dict(device_prefetch=1), "device_prefetch must be True or False"),
    (dict(compute_only="yes"), "compute_only must be True or False"),
    # typos and wrong types that used to be accepted or crash later (issue 13)
    (dict(batch_size=32000), "batch_size must be an int in 2..4,096"),
    (dict(image_size=100_000), "image_size must be an int in 16..1,024"),
    (dict(num_workers=500), "num_workers must be an int in 0..64"),
    (dict(world_size=1000), "world_size must be an int in 1..64"),
    (dict(num_workers=True), "num_workers must be an int"),
    (dict(threads=True), "threads must be an int"),
    (dict(lr=True), "lr must be a finite number"),
    (dict(lr=float("inf")), "lr must be a finite number"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(label=5), "label must be a string"),
    (dict(dataset=123), "dataset must be None or a folder path"),
    (dict(seed=-1), "seed must be an int in 0..4,294,967,295"),
    (dict(channels_last="no"), "channels_last must be True or False"),
    (dict(pin_memory=1), "pin_memory must be True or False"),
    (dict(amp=["bf16"]), "amp must be one of"),
    (dict(checkpointing=["none"]), "checkpointing must be 'none', 'per_stage' or an int"),
    (dict(world_size=2, bucket_cap_mb=float("nan")), "bucket_cap_mb must be a number"),
    (dict(accumulation_steps=5000), "accumulation_steps must be an int in 1..1024"),
])
def test_invalid_values_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kwargs)


def test_pin_memory_needs_cuda(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="pin_memory=True needs a CUDA device; on cpu set "
                                         "pin_memory=False"):
        RunConfig(pin_memory=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(amp="fp16"), "amp='fp16' needs a CUDA device; on this cpu use amp='bf16' or 'off'"),
    (dict(compile="reduce-overhead"), "uses CUDA graphs and needs a CUDA device"),
    (dict(compile="max-autotune"), "compile='default' or 'max-autotune-no-cudagraphs'"),
])
def test_cpu_cannot_run(kwargs, match, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=match):
        RunConfig(**kwargs)


def test_bf16_needs_ampere(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match="compute capability >= 8.0; on this GPU use "
                                         "amp='fp16'"):
        RunConfig(amp="bf16", device="cuda")


def test_missing_cuda_named(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available here"):
        RunConfig(device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_auto_device_prefers_cuda_then_cpu(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"


def test_frozen_and_keyword_only():
    c = RunConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.batch_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        RunConfig("cpu")  # type: ignore[misc]


def test_replace_validates():
    c = RunConfig()
    assert c.replace(batch_size=8).batch_size == 8
    with pytest.raises(ValueError, match="batch_size"):
        c.replace(batch_size=0)


def test_presets():
    q = RunConfig.preset("quick")
    assert q.image_size == PRESETS["quick"]["image_size"]
    assert RunConfig.preset("quick", steps=5).steps == 5
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        RunConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        RunConfig.preset("quick", batchsize=3)


def test_every_field_documented():
    import ast
    import inspect
    src = inspect.getsource(RunConfig)
    tree = ast.parse(src).body[0]
    body = tree.body  # type: ignore[attr-defined]
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            nxt = body[i + 1]
            assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), \
                f"field {node.target.id} has no docstring"


def test_labels_and_round_trip():
    c = RunConfig(batch_size=64, num_workers=2)
    assert c.display_label() == "bs=64 workers=2"
    assert RunConfig(label="mine").display_label() == "mine"
    assert RunConfig().display_label() == "default"
    assert RunConfig.from_dict({**c.to_dict(), "future_field": 1}) == c


def test_lab02_fields_default_off_and_label():
    c = RunConfig()
    assert (c.storage_latency_ms, c.decoded_cache, c.device_prefetch, c.compute_only) == \
        (0.0, "off", False, False)
    slow = RunConfig(storage_latency_ms=4, num_workers=2)
    assert slow.display_label() == "workers=2 simulated storage +4 ms/file"
    assert RunConfig(label="slow", storage_latency_ms=2.5).display_label() == \
        "slow (simulated storage +2.5 ms/file)"
    assert RunConfig(label="simulated slow disk", storage_latency_ms=2).display_label() == \
        "simulated slow disk"
    assert RunConfig(compute_only=True).display_label() == "compute-only bound"
    assert RunConfig(decoded_cache="mmap", device_prefetch=True).display_label() == \
        "cache=mmap device_prefetch=True"
