"""Benchmarks of JAX against PyTorch on the same work; ``functional-gan bench`` runs :mod:`.bench`.

Installed as ``functional_gan.benchmarks`` (the folder is ``benchmarks/`` in the repository);
results of full runs are kept in ``benchmarks/results/``.
"""
