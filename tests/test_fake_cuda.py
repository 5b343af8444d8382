"""The fake CUDA device itself: it must raise where a GPU raises and compute like the CPU.

These use ``fake_cuda_device`` (never the real device: they check the fake one's types).
"""

from __future__ import annotations

import pytest
import torch
from fake_cuda import FakeCudaGenerator, FakeCudaTensor


def test_factories_and_transfers(fake_cuda_device):
    x = torch.arange(6.0, device="cuda").reshape(2, 3)
    assert isinstance(x, FakeCudaTensor) and x.is_cuda and x.device == torch.device("cuda", 0)
    assert torch.zeros(2, device=x.device).is_cuda
    assert torch.zeros_like(x).is_cuda and x.new_ones(3).is_cuda
    assert not torch.zeros(2).is_cuda  # no device: the CPU, as on a GPU machine
    y = (x * 2).sum(dim=0)
    assert y.is_cuda
    host = y.cpu()
    assert type(host) is torch.Tensor and host.device.type == "cpu"
    assert host.tolist() == [6.0, 10.0, 14.0]
    back = x.to("cpu")
    assert type(back) is torch.Tensor
    back[0, 0] = 100.0  # a device-to-host copy, not a view of the device tensor
    assert x[0, 0].item() == 0.0
    assert torch.ones(3).to("cuda").is_cuda and torch.ones(3).cuda().is_cuda
    assert (
        torch.ones(3).to(x).is_cuda and torch.ones(3, device="cuda").to(host).device.type == "cpu"
    )
    assert x.to(torch.float64).is_cuda and x.double().dtype == torch.float64


def test_mixing_devices_raises(fake_cuda_device):
    x = torch.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([x, torch.ones(3)])
    with pytest.raises(RuntimeError, match="same device"):
        x.index_select(0, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="same device"):
        x.index_add_(0, torch.tensor([0]), torch.ones(1, device="cuda"))
    assert (x + torch.tensor(2.0)).is_cuda  # a 0-d CPU tensor is a scalar to CUDA
    assert x[torch.tensor([0, 2])].is_cuda  # CPU indices are moved by CUDA indexing
    host = torch.zeros(3)
    host.copy_(x)  # copies cross devices
    assert host.tolist() == [1.0, 1.0, 1.0] and not host.is_cuda


def test_numpy_raises_item_works(fake_cuda_device):
    x = torch.ones(2, device="cuda")
    with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
        x.numpy()
    assert x.sum().item() == 2.0 and x.cpu().numpy().tolist() == [1.0, 1.0]


def test_generators(fake_cuda_device):
    g = torch.Generator(device="cuda")
    assert isinstance(g, FakeCudaGenerator) and g.device.type == "cuda"
    g.manual_seed(0)
    a = torch.rand(4, device="cuda", generator=g)
    assert a.is_cuda
    cpu = torch.Generator().manual_seed(0)
    assert torch.equal(a.cpu(), torch.rand(4, generator=cpu))
    with pytest.raises(RuntimeError, match="'cuda' device type for generator"):
        torch.randperm(4, device="cuda", generator=torch.Generator())
    with pytest.raises(RuntimeError, match="'cpu' device type for generator"):
        torch.rand(4, generator=g)


def test_autograd_and_modules(fake_cuda_device):
    lin = torch.nn.Linear(3, 2).to("cuda")
    assert lin.weight.is_cuda and isinstance(lin.weight, torch.nn.Parameter)
    x = torch.randn(4, 3, device="cuda", requires_grad=True)
    loss = lin(x).square().sum()
    assert loss.is_cuda
    loss.backward()
    assert x.grad is not None and x.grad.is_cuda and lin.weight.grad.is_cuda
    with pytest.raises(RuntimeError, match="same device"):
        lin(torch.randn(4, 3))
    ref = 2 * (x.detach().cpu() @ lin.weight.detach().cpu().T + lin.bias.detach().cpu())
    torch.testing.assert_close(x.grad.cpu(), ref @ lin.weight.detach().cpu())


def test_availability_is_opt_in(fake_cuda_device):
    with fake_cuda_device.available():
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1


def test_device_tests_also_run_on_a_real_gpu(monkeypatch):
    from tests.conftest import _cuda_kinds

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _cuda_kinds() == ["fake_cuda"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _cuda_kinds() == ["fake_cuda", "real_cuda"]
