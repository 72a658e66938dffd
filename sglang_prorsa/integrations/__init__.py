"""Adapters that let a trainer's own hook points send sglang-prorsa's lifecycle hints, with the trainer unchanged:
``slime`` (its ``--custom-generate-function-path`` and ``--custom-rm-path``) and ``areal`` (a wrapper around a
``RolloutWorkflow`` that also adds the trajectory id to AReaL's ``/generate`` bodies). They use
``sglang_prorsa.client`` for every request and import no trainer code at module import time."""
