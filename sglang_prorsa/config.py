"""sglang-prorsa's configuration: parsed once from the command line, frozen, handed down whole.

``ProrsaConfig`` holds our flags (the ``sglang-prorsa`` group of ``--help``); SGLang's own flags stay SGLang's and
travel as the validated argv SGLang parses itself. Processes we start (engine instances under a front) receive an
``InstanceSpec``: the same ``ProrsaConfig`` plus the few typed fields the front chooses for that instance (port,
role, bootstrap port). Nothing is re-parsed from argv strings or read back from environment variables.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from sglang_prorsa.policy.horizon import DEFAULT_HORIZON_S


class Mode(str, enum.Enum):
    SINGLE = "single"  # one plain SGLang server with the Prorsa routes (its own control plane)
    INSTANCE = "instance"  # one engine instance registered with a controller (--prorsa-controller URL)
    ADAPTIVE = "adaptive"  # front + controller over instances that switch roles (--pd-adaptive)
    STATIC = "static"  # front + controller, fixed P:D, no switching (--pd-static P:D)
    COLOCATED = "colocated"  # front over N ordinary (non-PD) instances (--pd-colocated N)


@dataclass(frozen=True)
class ProrsaConfig:
    pd_adaptive: bool = False
    pd_static: str = ""  # "P:D"
    pd_colocated: int = 0
    prorsa_instances: int = 3
    prorsa_initial_prefill: int = 1
    prorsa_horizon_s: float = DEFAULT_HORIZON_S  # S: the one horizon of this process (policy/horizon.py)
    prorsa_control_interval_s: float = 0.0  # 0: once per horizon, as the paper refreshes every S seconds
    prorsa_manual_switch: bool = False
    prorsa_min_dwell_s: float = 30.0
    prorsa_hysteresis: float = 0.1
    prorsa_dwell_switch_costs: float = 6.0
    prorsa_wait_rule: bool = False
    prorsa_kv_store: str = "file"
    prorsa_kv_store_path: str = ""
    prorsa_mooncake_master: str = ""
    prorsa_log_dir: str = ""
    prorsa_controller: str = ""  # URL of the controller this instance registers with
    prorsa_router: str = ""  # URL of an external sglang-router whose worker pools the controller keeps in sync
    prorsa_instance_id: str = ""
    prorsa_advertise_url: str = ""  # how others reach this instance (default http://--host:--port)
    prorsa_instance_host: str = "127.0.0.1"  # where a front starts its instances
    prorsa_share_gpus: bool = False  # a front's instances share the visible devices (no placement: tests, one GPU)
    prorsa_cpu_threads: int = 0  # torch threads per instance without CUDA (0: the host's cores shared out)
    prorsa_test_crash_on_tokens: str = ""  # TESTING ONLY: "7,8,9" makes a scheduler raise on a prompt holding them

    @property
    def crash_marker(self) -> tuple[int, ...]:
        """The token sequence of --prorsa-test-crash-on-tokens (validated by ``validate``)."""
        text = self.prorsa_test_crash_on_tokens.strip()
        return tuple(int(t) for t in text.split(",")) if text else ()

    @property
    def mode(self) -> Mode:
        if self.pd_adaptive:
            return Mode.ADAPTIVE
        if self.pd_static:
            return Mode.STATIC
        if self.pd_colocated:
            return Mode.COLOCATED
        if self.prorsa_controller:
            return Mode.INSTANCE
        return Mode.SINGLE

    @property
    def static_ratio(self) -> tuple[int, int]:
        p, d = self.pd_static.split(":")
        return int(p), int(d)

    @property
    def instance_count(self) -> int:
        """How many engine instances a front starts in this mode."""
        if self.mode is Mode.STATIC:
            return sum(self.static_ratio)
        if self.mode is Mode.COLOCATED:
            return self.pd_colocated
        return self.prorsa_instances

    @property
    def initial_prefill(self) -> int:
        return self.static_ratio[0] if self.mode is Mode.STATIC else self.prorsa_initial_prefill

    @property
    def control_interval_s(self) -> float:
        return self.prorsa_control_interval_s or self.prorsa_horizon_s

    @property
    def switching(self) -> bool:
        """Whether roles move automatically (only the adaptive mode, and not under --prorsa-manual-switch)."""
        return self.mode is Mode.ADAPTIVE and not self.prorsa_manual_switch

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the flag for a bad combination (called once, by the launcher)."""
        chosen = [f for f, on in (("--pd-adaptive", self.pd_adaptive), ("--pd-static", bool(self.pd_static)),
                                  ("--pd-colocated", bool(self.pd_colocated))) if on]
        if len(chosen) > 1:
            raise ConfigError(chosen[1], f"cannot be combined with {chosen[0]}")
        if self.pd_static:
            if not re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", self.pd_static):
                raise ConfigError("--pd-static", f"expected P:D with P, D >= 1, got {self.pd_static!r}")
        if self.pd_colocated < 0:
            raise ConfigError("--pd-colocated", "must be >= 1")
        if self.mode is Mode.ADAPTIVE:
            if self.prorsa_instances == 1 or self.prorsa_instances < 0:
                raise ConfigError("--prorsa-instances", "the adaptive front needs at least 2 instances (one per role), "
                                                        "or 0 to serve only instances that register by URL")
            if self.prorsa_instances and not 1 <= self.prorsa_initial_prefill < self.prorsa_instances:
                raise ConfigError("--prorsa-initial-prefill", "must be between 1 and --prorsa-instances - 1")
        if self.prorsa_test_crash_on_tokens.strip() and not re.fullmatch(
                r"\s*\d{1,9}(\s*,\s*\d{1,9})*\s*", self.prorsa_test_crash_on_tokens):
            raise ConfigError("--prorsa-test-crash-on-tokens", "expected token ids separated by commas, e.g. 7,8,9")
        if self.prorsa_cpu_threads < 0:
            raise ConfigError("--prorsa-cpu-threads", "must be >= 0 (0: automatic)")
        if self.prorsa_horizon_s <= 0:
            raise ConfigError("--prorsa-horizon", "must be > 0 seconds")
        if self.prorsa_control_interval_s < 0:
            raise ConfigError("--prorsa-control-interval", "must be >= 0 seconds (0: the horizon)")
        if self.prorsa_min_dwell_s < 0:
            raise ConfigError("--prorsa-min-dwell", "must be >= 0 seconds")
        if not 0 <= self.prorsa_hysteresis < 1:
            raise ConfigError("--prorsa-hysteresis", "must be in [0, 1)")
        if not (math.isfinite(self.prorsa_dwell_switch_costs) and self.prorsa_dwell_switch_costs >= 0):
            raise ConfigError("--prorsa-dwell-switch-costs", "must be a finite number >= 0")
        for flag, url in (("--prorsa-controller", self.prorsa_controller), ("--prorsa-router", self.prorsa_router),
                          ("--prorsa-advertise-url", self.prorsa_advertise_url)):
            if url and not re.fullmatch(r"https?://[^/\s]+", url.rstrip("/")):
                raise ConfigError(flag, f"expected http://HOST:PORT, got {url!r}")
        if self.prorsa_controller and self.mode is not Mode.INSTANCE:
            raise ConfigError("--prorsa-controller", "is for engine instances; a front is itself the controller")
        if self.prorsa_kv_store == "mooncake" and self.mode is Mode.INSTANCE and not self.prorsa_mooncake_master:
            raise ConfigError("--prorsa-mooncake-master", "is required with --prorsa-kv-store mooncake on an "
                                                          "instance (the front starts a master itself)")


LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "", "::", "[::]"})


def url_host(url: str) -> str:
    """The host part of ``http://HOST[:PORT][/...]`` (an IPv6 host without its brackets)."""
    netloc = url.split("://", 1)[-1].split("/", 1)[0]
    if netloc.startswith("["):
        return netloc[1:netloc.index("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc


# Read by SGLang's PD bootstrap and KV transfer (SGLANG_HOST_IP) and Mooncake's transfer engine (MC_TCP_BIND_ADDRESS):
# the only way those two learn the address a process advertises. Set from the flags, never read back by our code.
ADDRESS_VARIABLES = ("SGLANG_HOST_IP", "MC_TCP_BIND_ADDRESS")


def address_variables(host: str) -> dict[str, str]:
    """The address variables for a process that advertises ``host``."""
    return dict.fromkeys(ADDRESS_VARIABLES, host)


def advertise_host(host: str, advertise_url: str = "", *, required_by: str = "") -> str:
    """The address others use to reach an instance's HTTP server, its PD bootstrap server and its Mooncake
    endpoints: the host of ``--prorsa-advertise-url`` when given, else ``--host`` when it names one address.
    ``--host`` 0.0.0.0 (or ``::``) binds every address but names none: with ``required_by`` set (the instance
    registers, or serves a PD role, so others must reach it) that is refused naming ``--prorsa-advertise-url``;
    otherwise (nothing outside this machine looks it up) loopback, as by default."""
    if advertise_url:
        return url_host(advertise_url.rstrip("/"))
    if host not in WILDCARD_HOSTS:
        return host
    if required_by:
        raise ConfigError("--prorsa-advertise-url", f"is required with --host {host or '0.0.0.0'} {required_by}: "
                                                    "that binds every address of this machine but names none others "
                                                    "can reach (e.g. --prorsa-advertise-url http://10.0.0.5:30000), "
                                                    "or give --host this machine's address")
    return LOOPBACK


class ConfigError(ValueError):
    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"argument {flag}: {message}")
        self.flag = flag


_HELP = {
    "pd_adaptive": "Serve through the adaptive PD front: a thin router and the Prorsa controller over "
    "--prorsa-instances engine instances that switch between prefill and decode roles while busy.",
    "pd_static": "Serve through the front over P prefill and D decode instances that never switch (P:D).",
    "pd_colocated": "Serve through the front over N ordinary (non-PD) instances, least-loaded with trajectory "
    "affinity.",
    "prorsa_instances": "Engine instances started under --pd-adaptive (default: 3; 0: none here, only instances that "
    "register with --prorsa-controller).",
    "prorsa_initial_prefill": "How many of them start as prefill instances (default: 1).",
    "prorsa_horizon_s": f"Forecast horizon S in seconds (paper Appendix B; default: {DEFAULT_HORIZON_S:g}): the one S "
    "of the forecast, the allocation and the planner, and the control interval unless --prorsa-control-interval is "
    "given. POST /lifecycle/config cannot change it while the server runs.",
    "prorsa_control_interval_s": "Seconds between allocation decisions (default: the horizon).",
    "prorsa_manual_switch": "Do not switch roles automatically; switches happen only through POST /prorsa/switch.",
    "prorsa_min_dwell_s": "Anti-flapping: seconds an instance keeps a new role before it may switch again (default: 30).",
    "prorsa_hysteresis": "Anti-flapping: coverage margin a new ratio must bring before switching (default: 0.1).",
    "prorsa_dwell_switch_costs": "Anti-flapping: an instance also keeps a new role at least this many times its "
    "last measured switch duration (default: 6; 0 together with --prorsa-min-dwell 0 turns the dwell guard off).",
    "prorsa_wait_rule": "While either stage holds a queue, move one instance at a time when the move shortens a "
    "turn's summed measured wait (prefill's plus decode's, queued work over its measured rate) instead of following "
    "Eq. 1's target; see docs/controller.md (default: off).",
    "prorsa_kv_store": "Where switched requests' KV pages persist: 'file' (one machine) or 'mooncake' (Mooncake "
    "Store, across machines).",
    "prorsa_kv_store_path": "Directory of the file KV store (default: a folder in the cache).",
    "prorsa_mooncake_master": "HOST:PORT of a mooncake_master for --prorsa-kv-store mooncake (a front starts one on "
    "127.0.0.1 when this is empty).",
    "prorsa_log_dir": "Where a front writes its instances' logs (default: a temporary folder).",
    "prorsa_controller": "URL of a Prorsa controller (a --pd-adaptive front) this engine instance registers with; "
    "the instance then serves whatever role the controller gives it.",
    "prorsa_router": "URL of an sglang-router in PD mode whose prefill/decode worker pools the controller keeps in "
    "step with every role switch.",
    "prorsa_instance_id": "Name of this instance in the controller's registry (default: its URL).",
    "prorsa_advertise_url": "URL others use to reach this instance (default: http://--host:--port). Its host is also "
    "the address its PD bootstrap and Mooncake endpoints advertise; required with --host 0.0.0.0 on an instance that "
    "registers with --prorsa-controller or serves a PD role.",
    "prorsa_instance_host": "Address a front binds the instances it starts to, and the one they advertise (their URL, "
    "PD bootstrap and Mooncake endpoints; loopback when it is 0.0.0.0). Default: 127.0.0.1; give this machine's "
    "address when instances on other machines must reach them.",
    "prorsa_share_gpus": "The instances a front starts share the visible GPUs instead of each getting its own "
    "(--base-gpu-id, tp x pp x dp devices each, refused when too few): for small models several instances fit on "
    "one GPU; size each with --mem-fraction-static.",
    "prorsa_test_crash_on_tokens": "TESTING ONLY: every prefill or colocated scheduler raises (and its instance dies) "
    "when it receives a prompt holding these token ids in a row (e.g. 7,8,9): how the poison-request containment is "
    "tested. Never set it in production.",
    "prorsa_cpu_threads": "Torch intra-op threads of each engine instance on a host without CUDA (default 0: a "
    "front shares the host's cores among the instances it starts, at least 1 each; a single server or a "
    "registering instance keeps torch's default, all cores). Instances that each run an OpenMP team over the same "
    "cores slow each other down many times over.",
}


def _option(name: str) -> str:
    # Field names carry units (…_s); flags read naturally without them: --prorsa-horizon, --prorsa-min-dwell.
    base = name[:-2] if name.endswith("_s") else name
    return "--" + base.replace("_", "-")


def add_prorsa_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sglang-prorsa")
    defaults = ProrsaConfig()
    for f in fields(ProrsaConfig):
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            group.add_argument(_option(f.name), dest=f.name, action="store_true", help=_HELP[f.name])
        elif f.name == "prorsa_kv_store":
            group.add_argument(_option(f.name), dest=f.name, default=default, choices=("file", "mooncake"),
                               help=_HELP[f.name])
        else:
            metavar = "P:D" if f.name == "pd_static" else None
            group.add_argument(_option(f.name), dest=f.name, type=type(default), default=default, metavar=metavar,
                               help=_HELP[f.name])


def split_prorsa_flags(argv: list[str]) -> tuple[ProrsaConfig, list[str]]:
    """Separate our flags from SGLang's: (our frozen config, the argv SGLang parses). Raises ``ConfigError``."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_prorsa_flags(parser)
    ns, rest = parser.parse_known_args(argv)
    config = ProrsaConfig(**{f.name: getattr(ns, f.name) for f in fields(ProrsaConfig)})
    config.validate()
    return config, rest


@dataclass(frozen=True)
class InstanceSpec:
    """Everything one engine instance process needs, chosen by whoever starts it (a front, or the launcher).

    ``sglang_argv`` are the user's SGLang flags exactly as given (already validated by the launcher); the typed
    fields below are applied to SGLang's parsed record, so a flag the front owns (port, role) cannot be shadowed.
    """

    instance_id: str
    host: str
    port: int
    role: str  # "prefill" | "decode" | "null" (colocated: no PD)
    bootstrap_port: int | None
    sglang_argv: tuple[str, ...]
    prorsa: ProrsaConfig
    controller_url: str = ""  # register here at start-up ("" for a single server)
    advertise_url: str = ""
    switchable: bool = False  # a PD instance whose role a controller may switch (role switching on, prefix cache on)
    cpu_threads: int = 0  # torch threads of its scheduler on CPU (0: torch's default); cpu_recipe.instance_threads

    @property
    def advertise_host(self) -> str:
        """Where others reach this instance, its PD bootstrap and Mooncake endpoints (``advertise_host``): the one
        value its registration's ``bootstrap_host``, a front's registry and the ``SGLANG_HOST_IP`` /
        ``MC_TCP_BIND_ADDRESS`` its process is started with all come from."""
        return advertise_host(self.host, self.advertise_url)

    @property
    def url(self) -> str:
        return self.advertise_url or f"http://{self.advertise_host}:{self.port}"

    def dump(self, path: Path) -> Path:
        d = asdict(self)
        path.write_text(json.dumps(d, indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> InstanceSpec:
        d = json.loads(Path(path).read_text())
        d["prorsa"] = ProrsaConfig(**d["prorsa"])
        d["sglang_argv"] = tuple(d["sglang_argv"])
        return cls(**d)

    def with_role(self, role: str) -> InstanceSpec:
        return replace(self, role=role)
