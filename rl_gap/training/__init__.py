"""The training command layer, from a YAML recipe to a run folder and its loggers.

- ``cli``: the LightningCLI subclass behind ``rl-gap fit|validate|test|predict``
  (``rl_gap.cli`` stays the console entry point and loads it lazily).
- ``parser``, ``run_setup``, ``trainer_setup``: the command line's checks, the run it
  describes, the trainer parts the CLI adds.
- ``run_config``: a run's identity (folder name from the overrides' hash) and its flat config,
  compared on resume.
- ``loggers``: CSV and W&B loggers, the W&B run id, the end-of-run summary.
- ``fault_tolerance``: SIGTERM and step checkpoints, resume checks.
"""
