"""Offline distillation of a self-draft from its target (``racer distill-draft``).

The target generates text from a prompt set (not the benchmark's), keeping its top-k next-token
distributions; a self-draft (:mod:`racer_rs.selfdraft.model`) is trained to match them (KL), within a
time budget, resumably, and saved as a checkpoint (:mod:`racer_rs.selfdraft.checkpoint`).
"""

from racer_rs.selfdraft.distillation.run import DistillError, DistillResult, distill_self_draft
from racer_rs.selfdraft.distillation.settings import DistillSettings

__all__ = ["DistillError", "DistillResult", "DistillSettings", "distill_self_draft"]
