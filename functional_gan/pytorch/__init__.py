"""The PyTorch side, in one place: the tutorial's models and loop, the book's linear regressions,
FLOP and convolution counters, and the precision settings for parity.

Nothing in the JAX library imports this package; the lessons, the comparisons, the benchmarks and
the command line do. It needs the ``torch`` extra (``pip install 'functional-gan[torch]'``).
"""
