"""kNN and linear-probe commands keep features on the requested (fake CUDA) device; values
equal the CPU run."""

from __future__ import annotations

import pytest
import torch

from rl_gap.commands.knn import extract_features
from rl_gap.commands.linear_probe import train_linear_probe
from rl_gap.metrics.knn import weighted_knn_accuracy


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(12, 6)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images.flatten(1))


def dataset(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)
    images = torch.randn(n, 3, 2, 2, generator=g) + labels.view(-1, 1, 1, 1).float()
    return [{"image": images[i], "label": int(labels[i])} for i in range(n)]


def run(device: str):
    module = Encoder().to(device).eval()
    bank, bank_labels = extract_features(module, dataset(40, 1), batch_size=16, device=device)
    queries, query_labels = extract_features(module, dataset(20, 2), batch_size=16, device=device)
    knn = weighted_knn_accuracy(queries, query_labels, bank, bank_labels, k=5, temperature=0.1)
    probe = train_linear_probe(
        bank, bank_labels, queries, query_labels, epochs=3, batch_size=8, num_classes=3
    )
    return bank, knn, probe


def test_knn_and_probe_on_cuda_equal_cpu(fake_cuda):
    cpu_bank, cpu_knn, cpu_probe = run("cpu")
    bank, knn, probe = run("cuda")
    assert bank.is_cuda  # scored where the model ran, not copied back to the host
    assert probe.weight.is_cuda
    torch.testing.assert_close(bank.cpu(), cpu_bank)
    assert knn == pytest.approx(cpu_knn)
    torch.testing.assert_close(probe.weight.cpu(), cpu_probe.weight, rtol=1e-5, atol=1e-6)
    assert probe.metrics == pytest.approx(cpu_probe.metrics)
    assert 0.0 < cpu_knn["top1"] <= 1.0
