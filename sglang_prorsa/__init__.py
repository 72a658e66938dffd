"""sglang-prorsa: adaptive prefill-decode disaggregation for agentic RL rollouts, built on SGLang."""

__version__ = "0.1.0"
