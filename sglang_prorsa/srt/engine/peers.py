"""This instance's view of the other instances (pushed by the controller): where a resumed request can go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Peer:
    instance_id: str
    url: str
    role: str  # prefill | decode | null
    status: str  # active | draining | switching | unhealthy | dead
    bootstrap_host: str = "127.0.0.1"
    bootstrap_port: int | None = None
    epoch: int = 0  # changes when the peer's transfer endpoints do (role rebuild, restart)

    @property
    def active(self) -> bool:
        return self.status == "active"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Peer:
        return cls(instance_id=str(d["instance_id"]), url=str(d["url"]).rstrip("/"), role=str(d["role"]),
                   status=str(d.get("status", "active")), bootstrap_host=str(d.get("bootstrap_host", "127.0.0.1")),
                   bootstrap_port=d.get("bootstrap_port"), epoch=int(d.get("epoch", 0)))

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


class NoPair(RuntimeError):
    pass


class PeerView:
    """Peers by id, with the continuations this instance has in flight on each (its own load signal)."""

    def __init__(self, self_id: str) -> None:
        self.self_id = self_id
        self.peers: dict[str, Peer] = {}
        self.inflight: dict[str, int] = {}
        self.version = 0

    def moved(self, peers: Iterable[Peer]) -> list[Peer]:
        """Those of ``peers`` whose transfer endpoints changed (new role or restart) since this view learnt them."""
        return [p for p in peers if p.instance_id in self.peers and self.peers[p.instance_id].epoch != p.epoch]

    def update(self, peers: Iterable[Peer], version: int | None = None) -> list[Peer]:
        """Replace the view; returns the peers whose transfer endpoints changed (new role or restart)."""
        new = {p.instance_id: p for p in peers}
        changed = self.moved(new.values())
        self.peers = new
        self.version = self.version + 1 if version is None else version
        return changed

    def mark(self, instance_id: str, status: str) -> None:
        """Our own observation (a peer refused or did not answer): avoid it until the next push."""
        p = self.peers.get(instance_id)
        if p is not None:
            self.peers[instance_id] = Peer(**{**vars(p), "status": status})

    def pick(self, role: str, exclude: set[str] = frozenset(), self_last: bool = False) -> Peer:
        """The least loaded active peer of ``role``, never this instance unless ``self_last`` and no other is active
        (this instance, listed active in that role, then serves the continuation itself)."""
        cands = [p for p in self.peers.values()
                 if p.role == role and p.active and p.instance_id not in exclude and p.instance_id != self.self_id]
        me = self.peers.get(self.self_id) if self_last and not cands else None
        if me is not None and me.role == role and me.active and me.instance_id not in exclude:
            cands = [me]
        if not cands:
            raise NoPair(f"no active {role} peer to continue on")
        return min(cands, key=lambda p: (self.inflight.get(p.instance_id, 0), p.instance_id))

    def pick_pair(self, exclude: set[str] = frozenset(), prefer_prefill: Peer | None = None,
                  decode_here: bool = False) -> tuple[Peer, Peer]:
        """The least loaded active pair; ``prefer_prefill`` (when it is still an active prefill peer) as its prefill;
        ``decode_here``: this instance may be the decode half when no other decode peer is active."""
        p = prefer_prefill
        if p is not None and p.instance_id not in exclude and p.instance_id != self.self_id:
            now = self.peers.get(p.instance_id)
            if now is not None and now.role == "prefill" and now.active:
                return now, self.pick("decode", exclude, decode_here)
        return self.pick("prefill", exclude), self.pick("decode", exclude, decode_here)

    def by_bootstrap(self, host: str | None, port: int | None) -> Peer | None:
        for p in self.peers.values():
            if p.bootstrap_port == port and p.bootstrap_host == host:
                return p
        return None

    def of_role(self, role: str) -> list[Peer]:
        return [p for p in self.peers.values() if p.role == role and p.instance_id != self.self_id]

    def acquire(self, *peers: Peer) -> None:
        for p in peers:
            self.inflight[p.instance_id] = self.inflight.get(p.instance_id, 0) + 1

    def release(self, *peers: Peer) -> None:
        for p in peers:
            n = self.inflight.get(p.instance_id, 0) - 1
            if n > 0:
                self.inflight[p.instance_id] = n
            else:
                self.inflight.pop(p.instance_id, None)
