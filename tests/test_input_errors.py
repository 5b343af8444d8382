"""Bad inputs to ``rl-gap evaluate`` / ``extrapolate``: one clear error naming the file or option,
never a silent wrong number (quantised embeddings, NaN labels, damaged .npy files,
``--exclude-self`` against another database file)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rl_gap.cli import main
from rl_gap.data.sampler import MPerClassBatchSampler
from rl_gap.metrics.retrieval import RetrievalMetrics
from rl_gap.training.cli import run_lightning_cli


def _extrapolate_inputs(tmp_path, d=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(6, d))
    p = q[[0, 1, 2, 3, 4, 4]] + 0.3 * rng.normal(size=(6, d))
    x = rng.normal(size=(400, d))
    for name, arr in (("q", q), ("p", p), ("x", x)):
        np.save(tmp_path / f"{name}.npy", arr.astype(np.float32))
    np.save(tmp_path / "owner.npy", np.array([0, 1, 2, 3, 4, 4]))
    return tmp_path


def _extrapolate(tmp_path, **files):
    paths = {n: str(tmp_path / f"{n}.npy") for n in ("q", "p", "x", "owner")}
    paths.update({k: str(v) for k, v in files.items()})
    argv = ["extrapolate", "--queries", paths["q"], "--positives", paths["p"],
            "--distractors", paths["x"], "--gallery-size", "4000", "--k", "10",
            "--n-boot", "20", "--no-progress", "--estimators", "count", "--json", str(tmp_path / "out.json")]  # fmt: skip
    if "ql" in paths:
        argv += ["--query-labels", paths["ql"], "--positive-labels", paths["pl"]]
    else:
        argv += ["--positive-query", paths["owner"]]
    return main(argv)


@pytest.mark.parametrize("which", ["q", "p", "x"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_extrapolate_refuses_integer_embeddings(tmp_path, which, dtype):
    _extrapolate_inputs(tmp_path)
    arr = np.load(tmp_path / f"{which}.npy")
    bad = tmp_path / f"{which}_int.npy"
    np.save(bad, np.clip(np.round(arr * 40), 0 if dtype == np.uint8 else -127, 127).astype(dtype))
    with pytest.raises(
        ValueError, match=rf"must be floating point embeddings, got dtype {np.dtype(dtype).name}"
    ):
        _extrapolate(tmp_path, **{which: bad})


def test_extrapolate_refuses_nan_labels(tmp_path, capsys):
    _extrapolate_inputs(tmp_path)
    np.save(tmp_path / "ql.npy", np.array([0.0, 1, 2, 3, 4, 5]))
    np.save(tmp_path / "pl.npy", np.array([0.0, 1, 2, 3, 4, 4]))
    assert _extrapolate(tmp_path, ql=tmp_path / "ql.npy", pl=tmp_path / "pl.npy") == 0
    np.save(tmp_path / "ql_nan.npy", np.array([0.0, np.nan, 2, 3, 4, 5]))
    with pytest.raises(ValueError, match=r"--query-labels holds 1 NaN/inf label"):
        _extrapolate(tmp_path, ql=tmp_path / "ql_nan.npy", pl=tmp_path / "pl.npy")
    np.save(tmp_path / "pl_nan.npy", np.array([0.0, 1, 2, np.nan, np.nan, 4]))
    with pytest.raises(ValueError, match=r"--positive-labels holds 2 NaN/inf label"):
        _extrapolate(tmp_path, ql=tmp_path / "ql.npy", pl=tmp_path / "pl_nan.npy")


def _evaluate_inputs(tmp_path):
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(5), 4)
    emb = (np.eye(5)[labels] + 0.4 * rng.normal(size=(20, 5))).astype(np.float32)
    np.save(tmp_path / "e.npy", emb)
    np.save(tmp_path / "l.npy", labels)
    return emb, labels


def test_evaluate_refuses_nan_labels(tmp_path):
    _evaluate_inputs(tmp_path)
    np.save(tmp_path / "l_nan.npy", np.r_[np.arange(19) // 4, np.nan])
    with pytest.raises(ValueError, match="query labels must be integer class ids, got nan"):
        main(["evaluate", "--queries", str(tmp_path / "e.npy"),
              "--query-labels", str(tmp_path / "l_nan.npy"), "--no-ceiling"])  # fmt: skip


def test_exclude_self_needs_the_database_to_be_the_queries_file(tmp_path):
    emb, labels = _evaluate_inputs(tmp_path)
    # a separate database file whose rows line up with the queries' labels
    np.save(tmp_path / "db.npy", emb[::-1].copy())
    np.save(tmp_path / "db_l.npy", labels[::-1].copy())
    common = ["evaluate", "--queries", str(tmp_path / "e.npy"), "--query-labels",
              str(tmp_path / "l.npy"), "--no-ceiling"]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"--exclude-self .* --database .*db\.npy is not the --queries"
    ):
        main([*common, "--database", str(tmp_path / "db.npy"), "--database-labels",
              str(tmp_path / "db_l.npy"), "--exclude-self"])  # fmt: skip
    # the same file as database: leave-one-out, equal to no --database at all
    out_same, out_loo = tmp_path / "same.json", tmp_path / "loo.json"
    assert main([*common, "--database", str(tmp_path / "e.npy"), "--exclude-self",
                 "--database-labels", str(tmp_path / "l.npy"),
                 "--output", str(out_same)]) == 0  # fmt: skip
    assert main([*common, "--output", str(out_loo)]) == 0
    same, loo = json.loads(out_same.read_text()), json.loads(out_loo.read_text())
    # 5 classes x 4 images: 4 x 3 other positives per class
    assert same["num_positive_pairs"] == loo["num_positive_pairs"] == 5 * 4 * 3
    assert same["gap"] == loo["gap"]


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", r"is empty \(0 bytes\)"),
        (b"label\n1\n2\n", r"is not a \.npy file \(it starts with b'label\\n'"),
        (None, r"is not a readable \.npy array \(truncated or damaged\?\)"),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "evaluate-labels", "extrapolate"])
def test_damaged_npy_is_one_error_naming_the_file(tmp_path, content, reason, command):
    _evaluate_inputs(tmp_path)
    _extrapolate_inputs(tmp_path)
    bad = tmp_path / "bad.npy"
    if content is None:  # cut short: header intact, half the data missing
        full = (tmp_path / "x.npy").read_bytes()
        bad.write_bytes(full[: len(full) // 2])
    else:
        bad.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{bad}.*{reason}"):
        if command == "evaluate":
            main(["evaluate", "--queries", str(bad), "--query-labels", str(tmp_path / "l.npy")])
        elif command == "evaluate-labels":
            main(["evaluate", "--queries", str(tmp_path / "e.npy"), "--query-labels", str(bad)])
        else:
            _extrapolate(tmp_path, x=bad)


RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "demo" / "mnist_gsap.yaml"


@pytest.mark.parametrize(
    "override, message",
    [
        (["--model.init_args.lr", "-1"], "--model.init_args: lr must be a finite number > 0, got -1.0"),
        (["--model.init_args.loss.temperature", "0"],
         "--model.loss: temperature must be a finite number > 0, got 0"),
        (["--model.init_args.optimizer", "adamx"],
         "--model.init_args: unknown optimizer 'adamx'; known: adamw, lars, sgd"),
        (["--model.init_args.scheduler", "cosin"],
         "--model.init_args: unknown scheduler 'cosin'; known: cosine, constant, none"),
    ],
)  # fmt: skip
def test_bad_recipe_values_are_one_line_not_a_union_traceback(tmp_path, capsys, override, message):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["--config", str(RECIPE), "--output_dir", str(tmp_path),
                           "--wandb", "off", *override], run=False)  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Expected a <class" not in err and "Given value" not in err


def test_bad_value_in_a_yaml_recipe_names_the_key(tmp_path, capsys):
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["model"]["init_args"]["lr"] = -1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit):
        run_lightning_cli(["--config", str(path), "--output_dir", str(tmp_path),
                           "--wandb", "off"], run=False)  # fmt: skip
    assert "lr must be a finite number > 0, got -1" in capsys.readouterr().err


def test_m_per_class_larger_than_a_class_warns_how_many():
    labels = torch.tensor([0] * 10 + [1] * 3 + [2] * 2 + [3] * 8)
    with pytest.warns(UserWarning, match=r"m_per_class 4 is larger than 2 of the 4 classes "
                      r"\(smallest: 2 images\)"):  # fmt: skip
        MPerClassBatchSampler(labels, batch_size=8, m_per_class=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MPerClassBatchSampler(labels, batch_size=8, m_per_class=2)  # every class has 2


@pytest.mark.parametrize("leave_one_out", [True, False])
def test_metric_refuses_an_embedding_dim_change_at_update(leave_one_out):
    metric = RetrievalMetrics(leave_one_out=leave_one_out)
    extra = {} if leave_one_out else {"is_query": True}
    metric.update(torch.randn(4, 8), torch.tensor([0, 0, 1, 1]), **extra)
    with pytest.raises(ValueError, match="embeddings of dim 6 after earlier updates of dim 8"):
        metric.update(torch.randn(4, 6), torch.tensor([0, 0, 1, 1]), **extra)
    metric.reset()
    metric.update(torch.randn(4, 6), torch.tensor([0, 0, 1, 1]), **extra)  # a new model: fine
