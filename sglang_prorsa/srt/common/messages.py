"""Typed messages between an engine instance's two sides, and the typed codes our processes answer with.

An instance runs SGLang's tokenizer manager (with our engine extension, ``srt/engine``) in its main process and
SGLang's scheduler (with our scheduler extension, ``srt/scheduler``) in a child. They talk over a private channel
(``srt/common/channel.py``): the engine sends one request message at a time and gets one reply; the scheduler also *pushes*
a ``MigratedRequest`` record for every request it takes off the instance, before it aborts that request, so the
engine can continue the request elsewhere.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

# HTTP headers between our processes (and on the front's answers).
ROLE_HEADER = "X-Prorsa-Role"  # which half of a PD pair a request is (our front and resumes send it)
ROUTE_HEADER = "X-Prorsa-Route"  # on a front's answer: the instances it sent the request to ("P/D", or "I")
RESUME_HEADER = "X-Prorsa-Resume"  # a continuation, not a new request (the lifecycle must not count it again)
# How many instances died while serving this request so far (a retry's or continuation's count, issue 29).
LOST_HEADER = "X-Prorsa-Lost"
# A request on which this many instances died is a suspected poison request: answered with SUSPECTED_POISON instead
# of being sent again, so it reaches at most one instance after the first it killed.
MAX_DEATHS = 2


class Code(str, enum.Enum):
    """Typed refusal and failure codes: in HTTP bodies (``{"error": ..., "code": ...}``) and in abort reasons."""

    # Abort reasons the scheduler extension writes into a request's finish reason (``err_type``).
    MIGRATED = "prorsa_migrated"  # taken off a switching instance with its tokens (and KV) kept: continue elsewhere
    HANDED_ON = "prorsa_handed_on"  # a prefill half whose request moved to another pair: answer, nothing to do
    # Refusals.
    SWITCHING = "switching"  # the instance is switching roles
    ALREADY_IN_ROLE = "already_in_role"
    LAST_OF_ROLE = "last_of_role"  # switching it would leave a role with no instance
    NOT_ACTIVE = "not_active"  # the instance is not serving (draining, switching, unhealthy, dead)
    CONTROL_OPERATION = "control_operation"  # a weight update / pause / memory release holds switches
    PAUSED = "paused"
    UNKNOWN_INSTANCE = "unknown_instance"
    STARTED_HERE = "started_here"  # the front started this instance (and restarts it): it cannot be removed by id
    NO_INSTANCE = "no_instance"  # no routable instance of a role
    UNAUTHORIZED = "unauthorized"
    INVALID = "invalid"  # a malformed request (the message names the field)
    FIXED_SETTING = "fixed_setting"  # a setting fixed by a flag at start-up (the horizon S): restart to change it
    UPSTREAM = "upstream"  # an instance answered with an error
    TIMEOUT = "timeout"
    RESUME_FAILED = "resume_failed"
    UNSUPPORTED = "unsupported"  # the operation cannot run on this instance's device (e.g. memory release on CPU)
    SUSPECTED_POISON = "suspected_poison"  # MAX_DEATHS instances died serving this request: not sent again
    # A control tick that cannot be decided (role_switch/capacity.CannotDecide carries the same values).
    TOO_FEW_INSTANCES = "too_few_instances"  # the healthy instances cannot hold one per role
    NO_DECODE_CAPACITY = "no_decode_capacity"  # no KV pool known to size decode with


# An instance's exit status when its HTTP port was bound by another process before it could bind it (EX_TEMPFAIL):
# the front that started it starts it again on fresh ports.
PORT_TAKEN_EXIT = 75


class Stage(str, enum.Enum):
    """Where a request was when it was taken off an instance."""

    RUNNING = "running"  # decode with complete KV: persisted, continue from its tokens
    QUEUED = "queued"  # not started here (prefill not begun, or KV not yet received): start again elsewhere


# -- engine -> scheduler requests ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Inventory:
    """List what the scheduler holds, touching nothing: requests with KV, and queued ones with their rooms."""


@dataclass(frozen=True)
class MigrateOut:
    """Take requests off this instance (paper Appendix C): decode role: every request whose KV is complete, plus the
    queued ones named in ``queued_rids`` (their prefill halves were released first); prefill role: the not-started
    requests named in ``queued_rids``. Requests already computing a prefill or transferring its KV are left to finish.
    """

    queued_rids: frozenset[str] = frozenset()
    reason: str = "role switch"


@dataclass(frozen=True)
class ReleaseRooms:
    """The other half of these PD pairs (by bootstrap room) moved elsewhere: take this half off the instance.

    On a prefill instance, ``only_not_started`` keeps halves whose prefill already began: the prefill side decides,
    atomically, which requests move, so none is prefilled twice. The rooms taken are remembered for ``ttl_s`` so a
    half that arrives late is released on arrival."""

    rooms: frozenset[int]
    only_not_started: bool = False
    ttl_s: float = 60.0


@dataclass(frozen=True)
class ForgetPrefill:
    """These bootstrap addresses (host, port) changed role or restarted: a decode instance drops what it cached
    about them (parallel info, connection endpoints), or its next handshake with them would use stale endpoints and
    time out. An address under a new epoch is live again: halves bound to it are no longer released on arrival
    (``PeerLost.ttl_s``)."""

    addresses: frozenset[tuple[str, int]]


@dataclass(frozen=True)
class PeerLost:
    """The prefill instance at this bootstrap address died (``dead``) or stopped answering: take off every half still
    waiting for its KV (their holder continues them elsewhere) and forget its endpoints. A dead one's death is
    counted against each of those requests (a poison request's count), and halves bound to it that arrive within
    ``ttl_s`` are released too -- until it is back under a new epoch (``ForgetPrefill``). One that only stopped
    answering (slow, loaded) is not a death and holds nothing back: its next answer makes it routable again."""

    host: str
    port: int
    dead: bool = True
    ttl_s: float = 60.0


@dataclass(frozen=True)
class LoadPrefix:
    """Load a persisted prefix from the KV store into this instance's prefix cache, and keep it from eviction until
    the request ``hold_for_rid`` has been scheduled here or ``hold_s`` passed (issue 14: a loaded prefix is locked).

    ``layout``: the source's parallel KV layout (``kv_persist.layout_of``). Given, each tensor-parallel rank here
    recomputes its own keys from ``token_ids`` and ``block_tokens`` (``keys`` are then unused), and a layout other
    than this instance's is refused: nothing is loaded and the prefix is recomputed. Empty (a sender that predates
    it): ``keys`` are loaded as they are."""

    token_ids: list[int]
    keys: list[str]
    block_tokens: int
    hold_for_rid: str = ""
    hold_s: float = 30.0
    layout: str = ""


@dataclass(frozen=True)
class Status:
    """Counters, loads, whether the scheduler is idle, and the busy intervals completed after ``since`` (a seq)."""

    since: int = -1


# -- scheduler -> engine ---------------------------------------------------------------------------------------------

@dataclass
class MigratedRequest:
    """One request taken off an instance (paper Appendix C: cancelled with its tokens kept, KV persisted).

    ``kv_tokens`` leading tokens of ``input_ids + output_ids`` have their KV in the store under ``keys``; a request
    with ``kv_tokens == 0`` had not started here and is sent again from ``input_ids + output_ids``.
    ``weight_versions``: [(version, start, end)] spans over ``output_ids``, as SGLang reports them.
    ``layout``: the source's parallel KV layout (``kv_persist.layout_of``); each of its tensor-parallel ranks
    persisted its shard under its own keys (``keys`` are rank 0's), and the destination loads only under an equal
    layout. Empty when no KV was persisted (or from a source that predates it).
    """

    rid: str
    role: str  # the instance's role when the request was taken: "decode" continues it, "prefill" hands it on
    stage: Stage
    input_ids: list[int]
    output_ids: list[int]
    sampling_params: dict[str, Any]
    kv_tokens: int = 0
    keys: list[str] = field(default_factory=list)
    block_tokens: int = 0
    bootstrap_room: int | None = None
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    weight_versions: list[tuple[str, int, int]] = field(default_factory=list)
    deaths: int = 0  # instances that died serving it (its prefill instance died: 1); see MAX_DEATHS
    layout: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage"] = self.stage.value
        return d


@dataclass(frozen=True)
class Decoding:
    """Requests that began decoding on this instance since the last report, and when the scheduler saw them.

    The engine side reports the lifecycle's prefill_end from this: a non-streamed request otherwise gives the
    tokenizer manager no output before it finishes, so its prefill would seem to last its whole decode."""

    rids: tuple[str, ...]
    ts: float


@dataclass(frozen=True)
class QueuedItem:
    rid: str
    bootstrap_room: int | None
    bootstrap_host: str | None
    bootstrap_port: int | None
    input_ids: tuple[int, ...] = ()
    waited_s: float = 0.0  # how long it has been queued here (first seen by our extension)
    # Where it waits. Prefill: "bootstrapping" (for its decode half's handshake) or "waiting" (for compute); decode:
    # "prealloc" (handshake, KV allocation) or "transfer" (its KV indices sent, waiting for the KV).
    stage: str = ""


@dataclass
class InventoryResult:
    role: str
    with_kv: list[str]  # decode: running or received (continue from KV); prefill: computing or transferring
    queued: list[QueuedItem]  # not started here


@dataclass
class MigrateOutResult:
    role: str
    rids: list[str]  # records were pushed for each, before its abort
    rooms: list[int]  # the bootstrap rooms of the queued requests taken off
    persist_s: float
    persisted_bytes: int
    persisted_blocks: int
    left_running: int  # prefill: computing or transferring, left to finish


@dataclass
class ReleaseResult:
    rids: list[str]
    rooms: list[int]


@dataclass
class LoadPrefixResult:
    loaded_tokens: int
    already_cached_tokens: int
    missing_blocks: int
    checksum_failures: int
    load_s: float
    held: bool = False
    # Why nothing was loaded when the request was refused: LAYOUT_REFUSED (the source's parallel layout is not this
    # instance's). Empty otherwise.
    refused: str = ""
    # The data-parallel rank that loaded it (its resumed request must be routed there: ``routed_dp_rank``), and how
    # many this instance has; None on an instance without data parallelism.
    dp_rank: int | None = None
    dp_size: int = 1


LAYOUT_REFUSED = "layout_mismatch"


@dataclass(frozen=True)
class BusyInterval:
    """One completed busy interval of the scheduler (idle -> busy -> idle), the input of θ (paper §4.2)."""

    seq: int
    role: str
    seconds: float
    new_tokens: int  # prompt tokens the model computed in extend passes (cache and store hits excluded)
    cached_tokens: int  # prompt tokens matched in the prefix cache
    requests: int  # prefills completed in the interval


@dataclass
class StatusResult:
    role: str
    idle: bool
    running: int
    queued: int
    counters: dict[str, float]
    kv_footprint_tokens: int
    kv_capacity_tokens: int
    prefix_cache_tokens: int = 0
    busy_intervals: list[BusyInterval] = field(default_factory=list)  # completed after Status.since


class ChannelError(Exception):
    """The scheduler failed a request message; the scheduler itself keeps running."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (ChannelError, (self.message,))
