"""ResNet-18 is torchvision's, key for key and shape for shape."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from perflab.models import build_model, resnet18, tiny_cnn


def _torchvision_resnet18_layout(num_classes: int) -> dict[str, tuple[int, ...]]:
    """The state_dict layout of torchvision.models.resnet18, written from its definition
    (He et al. 2016, table 1), independent of perflab's code."""
    out: dict[str, tuple[int, ...]] = {}

    def bn(prefix: str, c: int) -> None:
        for k in ("weight", "bias", "running_mean", "running_var"):
            out[f"{prefix}.{k}"] = (c,)
        out[f"{prefix}.num_batches_tracked"] = ()

    out["conv1.weight"] = (64, 3, 7, 7)
    bn("bn1", 64)
    cin = 64
    for layer, c in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            p = f"layer{layer}.{block}"
            out[f"{p}.conv1.weight"] = (c, cin if block == 0 else c, 3, 3)
            bn(f"{p}.bn1", c)
            out[f"{p}.conv2.weight"] = (c, c, 3, 3)
            bn(f"{p}.bn2", c)
            if block == 0 and layer > 1:
                out[f"{p}.downsample.0.weight"] = (c, cin, 1, 1)
                bn(f"{p}.downsample.1", c)
        cin = c
    out["fc.weight"] = (num_classes, 512)
    out["fc.bias"] = (num_classes,)
    return out


def test_parameter_count_matches_torchvision():
    assert sum(p.numel() for p in resnet18(1000).parameters()) == 11_689_512


@pytest.mark.parametrize("num_classes", [1000, 10])
def test_state_dict_layout(num_classes):
    sd = resnet18(num_classes).state_dict()
    expected = _torchvision_resnet18_layout(num_classes)
    assert list(sd) == list(expected)  # same keys in the same order
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected


def test_loads_a_torchvision_style_checkpoint():
    src = resnet18(10)
    dst = resnet18(10)
    dst.load_state_dict(src.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64)
    src.eval(), dst.eval()
    torch.testing.assert_close(src(x), dst(x))


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="torchvision is not installed (it cannot import with CPU-only torch)")
def test_matches_torchvision_when_present():
    try:
        import torchvision
    except Exception as e:  # installed but broken (e.g. CUDA wheel on CPU torch)
        pytest.skip(f"torchvision does not import here: {e}")
    tv = torchvision.models.resnet18(num_classes=10).state_dict()
    ours = resnet18(10).state_dict()
    assert list(tv) == list(ours)
    assert all(tv[k].shape == ours[k].shape for k in tv)
    resnet18(10).load_state_dict(tv)


@pytest.mark.parametrize("size", [32, 64])
def test_forward_shapes(size):
    model = resnet18(10)
    assert model(torch.randn(2, 3, size, size)).shape == (2, 10)
    assert tiny_cnn(7)(torch.randn(2, 3, size, size)).shape == (2, 7)


def test_stages_cover_the_network():
    m = resnet18(10).eval()
    x = torch.randn(2, 3, 64, 64)
    h = x
    for s in m.stages():
        h = s(h)
    h = m.fc(torch.flatten(m.avgpool(h), 1))
    torch.testing.assert_close(h, m(x))


def test_errors():
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        build_model("vgg", 10)
    with pytest.raises(ValueError, match="num_classes must be >= 1"):
        resnet18(0)
    with pytest.raises(ValueError, match="num_classes must be >= 1"):
        tiny_cnn(0)


@pytest.mark.parametrize("mode", ["per_stage", 1, 2, 3, 5])
def test_checkpointing_keeps_gradients(mode):
    torch.manual_seed(0)
    ref = resnet18(10)
    ckpt = resnet18(10)
    ckpt.load_state_dict(ref.state_dict())
    ckpt.set_checkpointing(mode)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for m in (ref, ckpt):
        torch.nn.functional.cross_entropy(m(x), y).backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=f"gradient of {name} differs")


@pytest.mark.parametrize("mode", ["all", 0, 6, True])
def test_checkpointing_bad_mode(mode):
    with pytest.raises(ValueError, match="checkpointing must be"):
        resnet18(10).set_checkpointing(mode)


@pytest.mark.parametrize("mode", ["per_stage", 2, 4])
def test_checkpointing_keeps_outputs_and_loss(mode):
    torch.manual_seed(0)
    ref, ckpt = resnet18(10), resnet18(10)
    ckpt.load_state_dict(ref.state_dict())
    ckpt.set_checkpointing(mode)
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(ckpt(x), ref(x), rtol=0, atol=0)  # the same ops, in order


def test_checkpointing_counts_batchnorm_twice_in_training():
    """The documented caveat: recomputation runs BatchNorm's forward again in train mode,
    so running statistics are updated twice per step (gradients are unaffected)."""
    torch.manual_seed(0)
    ref, ckpt = resnet18(10), resnet18(10)
    ckpt.load_state_dict(ref.state_dict())
    ckpt.set_checkpointing("per_stage")
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for m in (ref, ckpt):
        torch.nn.functional.cross_entropy(m(x), y).backward()
    assert int(ref.bn1.num_batches_tracked) == 1
    assert int(ckpt.bn1.num_batches_tracked) == 2
    assert not torch.equal(ref.bn1.running_mean, ckpt.bn1.running_mean)


def test_checkpointing_is_skipped_without_grad():
    m = resnet18(10).set_checkpointing("per_stage").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = m(x)
    assert out.grad_fn is None and out.shape == (2, 10)


def test_per_stage_checkpointing_halves_saved_activations():
    """The Lab 04 check's fact: per-stage checkpointing keeps only each stage's input."""
    from perflab.core.memory import saved_activation_bytes

    torch.manual_seed(0)
    m = resnet18(10)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    full = saved_activation_bytes(m, x, y).nbytes
    m.set_checkpointing("per_stage")
    assert saved_activation_bytes(m, x, y).nbytes <= 0.55 * full


# -- gpt-tiny --------------------------------------------------------------------------
def test_gpt_tiny_shapes_params_and_tied_head():
    from perflab.models import GPT_TINY, gpt_tiny
    m = gpt_tiny()
    x = torch.randint(0, 256, (2, 16))
    assert m(x).shape == (2, 16, 256) and m(x).dtype == torch.float32
    assert m.head.weight is m.tok_emb.weight
    assert sum(p.numel() for p in m.parameters()) == 858_880
    assert GPT_TINY["max_seq_len"] == 256
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 257, dtype=torch.int64))
    with pytest.raises(ValueError, match="d_model % n_head"):
        from perflab.models import GPT
        GPT(vocab_size=10, n_layer=1, n_head=3, d_model=8, max_seq_len=4)


def test_gpt_is_causal():
    """A position's logits do not depend on later tokens (is_causal=True)."""
    from perflab.models import gpt_tiny
    torch.manual_seed(0)
    m = gpt_tiny().eval()
    x = torch.randint(0, 256, (1, 12))
    y = x.clone()
    y[0, 8:] = (y[0, 8:] + 1) % 256
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-6)
    assert not torch.allclose(a[0, 8:], b[0, 8:])


@pytest.mark.parametrize("mode", ["per_stage", 2])
def test_gpt_checkpointing_keeps_gradients(mode):
    from perflab.models import gpt_tiny
    torch.manual_seed(0)
    m = gpt_tiny()
    x = torch.randint(0, 256, (2, 8))

    def grads(model):
        model.zero_grad()
        model(x).float().logsumexp(-1).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads(m)
    m.set_checkpointing(mode)
    for a, b in zip(plain, grads(m)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="1..4 segments"):
        m.set_checkpointing(5)


def test_build_model_names_gpt():
    from perflab.models import GPT, build_model
    assert isinstance(build_model("gpt-tiny", 256), GPT)
    with pytest.raises(ValueError, match="gpt-tiny"):
        build_model("gpt2", 10)
