"""Adapters that let a trainer's own hook points send sglang-prorsa's lifecycle hints, with the trainer unchanged:
``slime`` (its ``--custom-generate-function-path`` and ``--custom-rm-path``), ``areal`` (a wrapper around a
``RolloutWorkflow`` that also adds the trajectory id to AReaL's ``/generate`` bodies) and ``verl`` (an agent loop
around verl's own, whose requests carry the trajectory id in their sampling params for the engine to read). They use
``sglang_prorsa.client`` for every request and import no trainer code at module import time."""
