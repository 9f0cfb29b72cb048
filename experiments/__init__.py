"""Entry points: quickstart, train, generate, evaluate, bench, sweep (each `python -m experiments.X --help`)."""
