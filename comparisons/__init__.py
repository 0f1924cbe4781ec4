"""The comparison suite: PyTorch reference runs and the checks of the JAX numbers against them.

Installed as ``functional_gan.comparisons`` (the folder is ``comparisons/`` in the repository);
``functional-gan compare`` runs it and writes a report. Needs the ``torch`` extra, except the
checks against the recorded runs in ``fixtures/``.
"""

# The suite's parts, in the order they run; `functional-gan compare --only ...` picks some.
GROUPS = ("layers", "gradient-stopping", "linreg", "trajectories", "teacher-forcing", "noise-floor", "fixtures", "quality")
