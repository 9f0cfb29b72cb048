"""The experiment plots (`zarya_jax.experiment.plots`), under their former name."""
from zarya_jax.experiment.plots import MODE_COLORS, frontier_plot, sweep_plot  # noqa: F401
