"""Batch-splitting trainer settings are refused for a ranking loss, unless opted in.

``trainer.accumulate_grad_batches: k`` hands the loss k parts of each batch: gSAP would
rank k lists of B/k instead of one list of B. ``rl-gap fit`` refuses it at parse time
(one line naming what would change and ``micro_batch_size``); the module refuses it at
``setup`` for Python users (also a ``GradientAccumulationScheduler``);
``--model.allow_split_batch true`` lets it through.
"""

from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import GradientAccumulationScheduler

from rl_gap.training.cli import run_lightning_cli
from tests.modules.micro_batch_cases import make_module

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "mnist_gsap.yaml")


def _parse(*extra):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", RECIPE, *extra, "--print_config"])
    return exit_info.value.code


def test_accumulation_is_refused_at_start_up_with_one_line(capsys):
    assert _parse("--trainer.accumulate_grad_batches", "4") == 2
    out, err = capsys.readouterr()
    assert "trainer:" not in out  # refused before anything is printed or built
    (line,) = [line for line in err.splitlines() if line.strip()]  # one line, no usage block
    for words in ("accumulate_grad_batches=4", "4 lists of B/4 instead of one list of B",
                  "--model.micro_batch_size", "--model.allow_split_batch true"):  # fmt: skip
        assert words in line, line


def test_accumulation_with_the_opt_in_and_micro_batches_parse(capsys):
    assert (
        _parse("--trainer.accumulate_grad_batches", "4", "--model.allow_split_batch", "true") == 0
    )
    assert "accumulate_grad_batches: 4" in capsys.readouterr().out
    assert _parse("--trainer.accumulate_grad_batches", "1", "--model.micro_batch_size", "16") == 0
    assert "micro_batch_size: 16" in capsys.readouterr().out


@pytest.mark.parametrize(
    "trainer_args",
    [{"accumulate_grad_batches": 2}, {"callbacks": [GradientAccumulationScheduler({0: 1, 1: 3})]}],
)
def test_module_refuses_split_batches_at_setup(trainer_args):
    trainer = L.Trainer(logger=False, enable_checkpointing=False, **trainer_args)
    module = make_module("metric", "gsap")
    module.trainer = trainer
    with pytest.raises(ValueError, match="would split each batch into .*micro_batch_size"):
        module.setup("fit")
    make_module("metric", "gsap", allow_split_batch=True).setup("fit")  # opted in


# ------------------------------------------- BatchNorm and a one-sample micro-batch
def _moco_with_batchnorm(n_micro):
    import warnings as _w

    import torch

    from rl_gap.modules.moco_v3 import MoCoV3Module
    from tests.modules.micro_batch_cases import SGD, TINY_VIT

    torch.manual_seed(0)
    with _w.catch_warnings():
        _w.simplefilter("ignore")
        module = MoCoV3Module(
            backbone="vit_tiny_patch16_224", backbone_kwargs={**TINY_VIT, "in_chans": 1},
            hidden_dim=16, embed_dim=6, mlp_batchnorm=True, loss={"name": "infonce"},
            micro_batch_size=n_micro, **SGD,
        )  # fmt: skip
    return module.double().train()


def test_one_sample_remainder_joins_the_previous_micro_batch_under_batchnorm():
    import torch

    from rl_gap.modules.grad_cache import micro_batches

    # 7 = 3 + 3 + 1: BatchNorm would see a micro-batch of one sample ("Expected more than
    # 1 value per channel when training"); it joins the one before it
    assert micro_batches(7, 3, no_single=True) == [slice(0, 3), slice(3, 7)]
    assert micro_batches(7, 3) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert micro_batches(8, 3, no_single=True) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    module = _moco_with_batchnorm(3)
    calls = []
    module.momentum_encoder.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    views = torch.randn(2, 7, 1, 8, 8, generator=torch.Generator().manual_seed(1),
                        dtype=torch.float64)  # fmt: skip
    loss = module.training_step({"views": [views[0], views[1]]}, 0)
    loss.backward()
    assert torch.isfinite(loss)
    assert calls == [3, 3, 4, 4]  # two views per micro-batch: 3 rows, then 3 + 1


def test_micro_batches_of_one_sample_with_batchnorm_are_refused():
    module = _moco_with_batchnorm(1)
    with pytest.raises(ValueError, match="micro_batch_size 1 with BatchNorm"):
        module.setup("fit")


def test_micro_batches_of_one_sample_with_batchnorm_are_refused_at_start_up(run_dir, capsys):
    moco = str(Path(RECIPE).with_name("mnist_moco_gsap.yaml"))
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli([
            "fit", "--config", moco, "--output_dir", str(run_dir), "--wandb", "off",
            "--data.init_args.num_train", "64", "--data.init_args.batch_size", "16",
            "--model.init_args.micro_batch_size", "1", "--trainer.max_steps", "1",
        ])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rl-gap: error: --model.init_args.micro_batch_size 1 with BatchNorm")
    assert not any("Traceback" in line for line in err)
