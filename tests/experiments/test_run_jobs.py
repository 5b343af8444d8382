"""``run_jobs``: runs side by side in worker processes, results in job order, threads per run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_gap.experiments.grid import Job, run_jobs
from rl_gap.experiments.runner import Runner


class ThreadsRunner(Runner):
    """Reports the seed and the torch threads the run would train with (no training)."""

    def run(self, recipe, run_dir, seed, overrides=(), job_type="train"):
        import os

        import torch

        if seed == 99:
            raise RuntimeError(f"run {run_dir} failed")
        return {"seed": float(seed), "threads": float(torch.get_num_threads()),
                "pid": float(os.getpid())}  # fmt: skip


def _jobs(seeds):
    return [Job("r.yaml", Path(f"/tmp/x/seed_{s}"), s) for s in seeds]


@pytest.mark.parametrize("workers", [1, 2])
def test_results_in_job_order_with_the_threads_asked(workers):
    done = []
    out = run_jobs(ThreadsRunner(), _jobs([3, 1, 2, 0]), workers=workers, threads=1,
                   done=lambda job, m: done.append(job.seed))  # fmt: skip
    assert [m["seed"] for m in out] == [3.0, 1.0, 2.0, 0.0]
    assert all(m["threads"] == 1.0 for m in out)
    assert sorted(done) == [0, 1, 2, 3]
    if workers == 2:  # the runs ran in worker processes, not here
        import os

        assert all(m["pid"] != os.getpid() for m in out)


def test_a_failed_run_fails_the_batch_and_bad_settings_are_refused():
    with pytest.raises(RuntimeError, match="seed_99 failed"):
        run_jobs(ThreadsRunner(), _jobs([0, 99]), workers=2, threads=1)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        run_jobs(ThreadsRunner(), _jobs([0]), workers=0)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        run_jobs(ThreadsRunner(), _jobs([0]), threads=0)
