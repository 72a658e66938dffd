"""The forecast horizon S's default, declared once: 10 s (paper Appendix B.1).

S is the forecast's window, Eq. 1's period, the planner's lookahead unit and, unless ``--prorsa-control-interval``
says otherwise, the control interval. Each process takes it from one place and hands it to all of them: the
launcher's servers from ``--prorsa-horizon`` (``ProrsaConfig.prorsa_horizon_s``; ``POST /lifecycle/config`` cannot
move it there, see ``LifecycleControlPlane.configure``), the standalone control plane from ``--horizon``, the
simulator from ``ClusterConfig.horizon_s``. Every default of those, and of the policy's own configs, is this constant.
"""

DEFAULT_HORIZON_S = 10.0
