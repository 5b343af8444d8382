"""Former name of ``from_scores`` (:func:`predict_map` on a full score matrix); import path kept."""

from rl_gap.metrics.tail.from_scores import predict_map, state_from_scores  # noqa: F401
