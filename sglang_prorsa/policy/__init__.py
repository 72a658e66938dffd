"""The pure policy, shared by the server, the tests and the simulator: lifecycle -> forecast -> allocation -> planning.

``lifecycle`` tracks each trajectory's phase from the trainer's hints; ``forecast`` turns the tracked population into
the next horizon's prefill and decode demand (SPEC.md, the paper's Eq. 1-5); ``role_switch`` allocates instances to
roles and plans the switches (Eq. 6-9); ``control_plane`` composes the three behind one object with an injectable
``clock``. Nothing here imports SGLang, torch, an HTTP library or the engine (tests/unit/test_layering.py).
"""
