from tests.models.clip_helpers import saved_checkpoint  # noqa: F401  (a fixture of the CLIP tests)
