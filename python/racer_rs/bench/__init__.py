"""``racer bench``: the interleaved benchmark runner, its report and plots, the prompt sets,
transformers' decoding as peers, and the half-precision near-tie rule.

From Python, :mod:`racer_rs.bench.api` runs method configurations side by side on the same prompts
(interleaved, with ``ar``) and summarises them; acceptance per generation-position bucket is in
:mod:`racer_rs.bench.position_buckets`; serving at a steady concurrency (``racer bench
--concurrency``, :func:`racer_rs.bench.api.run_serving`) in :mod:`racer_rs.bench.serving`. The
benchmark scripts in ``benches/`` are thin layers over this package.
"""
