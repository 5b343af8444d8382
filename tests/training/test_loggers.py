"""Which W&B run a command logs to, W&B settings, and count keys kept off the charts."""

from rl_gap.training.loggers import _wandb_settings, is_count_key, wandb_run_for


def test_fresh_fit_gets_a_new_id_every_time(tmp_path):
    (tmp_path / "wandb_id").write_text("0badc0de\n")  # an earlier run in this folder
    ids = {wandb_run_for("fit", tmp_path).id for _ in range(5)}
    assert len(ids) == 5 and "0badc0de" not in ids
    run = wandb_run_for("fit", tmp_path)
    assert (run.resume, run.job_type, run.config) == (False, "train", {})


def test_resumed_fit_continues_the_checkpoint_id(tmp_path):
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt")
    run = wandb_run_for("fit", tmp_path, ckpt, "1234abcd", group="sweep")
    assert (run.id, run.resume, run.group) == ("1234abcd", True, "sweep")
    # a checkpoint without an id, in this folder: the folder's record
    (tmp_path / "wandb_id").write_text("0badc0de\n")
    assert wandb_run_for("fit", tmp_path, ckpt, None).id == "0badc0de"
    # a checkpoint from elsewhere without an id: a new run
    other = str(tmp_path.parent / "elsewhere" / "last.ckpt")
    assert wandb_run_for("fit", tmp_path, other, None).id != "0badc0de"


def test_evaluation_commands_log_to_their_own_run(tmp_path):
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt")
    for sub, job in (("validate", "eval"), ("test", "eval"), ("predict", "predict")):
        run = wandb_run_for(sub, tmp_path, ckpt, "1234abcd")
        assert run.id != "1234abcd" and not run.resume
        assert (run.job_type, run.group) == (job, "1234abcd")
        assert run.config == {
            "eval.subcommand": sub, "eval.ckpt_path": ckpt, "eval.training_run_id": "1234abcd",
        }  # fmt: skip


def test_evaluation_with_a_training_id_and_a_group_of_the_users_own(tmp_path):
    """The user's ``--wandb_group`` wins over the training run's group; the training run
    stays findable through the config, whatever group the evaluation lands in."""
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt")
    (tmp_path / "wandb_group").write_text("train-group\n")
    mine = wandb_run_for("validate", tmp_path, ckpt, "1234abcd", group="ablation-7")
    assert mine.group == "ablation-7" and mine.id != "1234abcd" and not mine.resume
    assert mine.config["eval.training_run_id"] == "1234abcd"
    # without one, the evaluation joins the group the training run recorded
    assert wandb_run_for("validate", tmp_path, ckpt, "1234abcd").group == "train-group"


def test_system_metrics_and_console_stay_on():
    settings = _wandb_settings()
    assert settings.x_disable_stats is False
    assert settings.console != "off"


def test_count_keys():
    assert is_count_key("val/num_pairs") and is_count_key("test/num_queries")
    assert not is_count_key("val/gap") and not is_count_key("val/r@1")
    assert not is_count_key("val/protocol_threshold_f1")
