"""``racer bench``: the interleaved benchmark runner, its report and plots, the prompt sets,
transformers' decoding as peers, and the half-precision near-tie rule.

The benchmark scripts in ``benches/`` are thin layers over this package.
"""
