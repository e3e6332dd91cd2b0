"""The target model as the engine, the drafters and the cost model all see it: its vocabulary and
window (``verifier``), tree verification against its KV cache for one row (``verifier``) and for a
ragged batch (``batch_verifier``, ``attention``), lossless sampling (``sampling``), and
half-precision CPU linear layers with their weights packed once (``packed_linear``).

It sits below every package that runs the target (``drafters``, ``loading``, ``autosize``,
``engine``) and imports none of them. It imports torch; ``import racer_rs`` never imports it.
"""
