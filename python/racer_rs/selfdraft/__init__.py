"""Self-drafts: the target's first layers as a draft model, their checkpoints, and offline
distillation (``racer distill-draft``).
"""
