"""sglang-prorsa's own command-line flags: one frozen dataclass, added to SGLang's parser as a separate group."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ProrsaFlags:
    pd_adaptive: bool = False
    prorsa_instances: int = 2
    prorsa_initial_prefill: int = 1
    prorsa_horizon_s: float = 10.0
    prorsa_control_interval_s: float = 0.0  # 0: once per horizon, as the paper refreshes every S seconds
    prorsa_manual_switch: bool = False
    prorsa_min_dwell_s: float = 30.0
    prorsa_hysteresis: float = 0.1
    prorsa_kv_store: str = "file"
    prorsa_kv_store_path: str = ""
    prorsa_mooncake_master: str = ""
    prorsa_log_dir: str = ""


_HELP = {
    "pd_adaptive": "Run the adaptive PD front: a router and the Prorsa control plane over --prorsa-instances engine "
    "instances that switch between prefill and decode roles.",
    "prorsa_instances": "Engine instances started under --pd-adaptive (default: 2).",
    "prorsa_initial_prefill": "How many of them start as prefill instances (default: 1).",
    "prorsa_horizon_s": "Forecast horizon S in seconds (paper Appendix B; default: 10).",
    "prorsa_control_interval_s": "Seconds between allocation decisions (default: the horizon).",
    "prorsa_manual_switch": "Do not switch roles automatically; switches happen only through POST /prorsa/switch.",
    "prorsa_min_dwell_s": "Anti-flapping: seconds an instance keeps a new role before it may switch again (default: 30).",
    "prorsa_hysteresis": "Anti-flapping: relative coverage gain a new ratio must bring before switching (default: 0.1).",
    "prorsa_kv_store": "Where switched requests' KV pages persist: 'file' (one machine) or 'mooncake' (Mooncake Store).",
    "prorsa_mooncake_master": "HOST:PORT of a mooncake_master for --prorsa-kv-store mooncake (the adaptive front "
    "starts one on 127.0.0.1 when this is empty).",
    "prorsa_kv_store_path": "Directory of the file KV store (default: a folder in the cache).",
    "prorsa_log_dir": "Where the adaptive front writes its instances' logs (default: a temporary folder).",
}


def _option(name: str) -> str:
    # Field names carry units (…_s); flags read naturally without them: --prorsa-horizon, --prorsa-control-interval.
    base = name[:-2] if name.endswith("_s") else name
    return "--" + base.replace("_", "-")


def add_prorsa_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sglang-prorsa")
    defaults = ProrsaFlags()
    for f in fields(ProrsaFlags):
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            group.add_argument(_option(f.name), dest=f.name, action="store_true", help=_HELP[f.name])
        elif f.name == "prorsa_kv_store":
            group.add_argument(_option(f.name), dest=f.name, default=default, choices=("file", "mooncake"),
                               help=_HELP[f.name])
        else:
            group.add_argument(_option(f.name), dest=f.name, type=type(default), default=default, help=_HELP[f.name])


def split_prorsa_flags(argv: list[str]) -> tuple[ProrsaFlags, list[str]]:
    """Separate our flags from SGLang's: returns (ours, the argv to hand to SGLang)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_prorsa_flags(parser)
    ns, rest = parser.parse_known_args(argv)
    flags = ProrsaFlags(**{f.name: getattr(ns, f.name) for f in fields(ProrsaFlags)})
    if flags.pd_adaptive:
        if flags.prorsa_instances < 2:
            raise SystemExit("--prorsa-instances: the adaptive front needs at least 2 instances (one per role)")
        if not 1 <= flags.prorsa_initial_prefill < flags.prorsa_instances:
            raise SystemExit("--prorsa-initial-prefill must be between 1 and --prorsa-instances - 1")
    return flags, rest
