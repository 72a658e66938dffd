"""Cluster-scale rollout simulator (issue 7): the real control plane (lifecycle tracker, predictor, Eq. 1 allocator,
switch planner) driven on a ManualClock against modelled engine instances.

config.py (model / rollout / cluster configs), perf_model.py (per-iteration costs, DP-rank synchronisation, KV,
transfer, switch), instance.py (one engine instance, stepped in regimes), trainer.py (trainer + agent environment),
cluster.py (routing, PD transfer, role switch, weight update), adaptive.py (control-plane driver), runner.py (one run),
metrics.py, plots.py, fit.py (fit a model config from measurements), __main__.py (CLI).
"""
