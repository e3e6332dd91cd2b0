"""Test-Time Speculation: online distillation of a draft model from the target's verification logits.

* :mod:`racer_rs.tts.online_loss` - the canvas loss and one optimiser step.
* :mod:`racer_rs.tts.update_worker` - the update worker that runs those steps off the decoding critical
  path (a thread on the CPU, a side stream on CUDA) and publishes new weights at round boundaries.

This package imports torch; ``import racer_rs`` never imports it.
"""
