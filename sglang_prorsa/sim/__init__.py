"""Cluster-scale rollout simulator (issues 7, 11): the real control plane (lifecycle tracker, predictor, θ model,
Eq. 1 allocator, guarded switch planner) driven on a ManualClock against modelled engine instances.

config.py (model / rollout / cluster configs, parameter sources), perf_model.py (per-iteration costs, DP-rank
synchronisation, KV transfer), instance.py (one engine instance: slots, KV, retraction), regime.py (its iterations,
stepped in regimes; idle split), prefix_cache.py (per-rank LRU prefix cache), trainer.py (trainer + agent
environment), workloads.py (tasks and mixed batches), cluster.py (routing, PD transfer over NIC queues, role switch
with regrouping, weight update), adaptive.py (control-plane driver, g(x) for the predictor), runner.py (one run),
metrics.py, plots.py, report.py, fit.py (fit a model config from measurements), __main__.py (CLI).
"""
