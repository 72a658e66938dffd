"""An instance's peer view and record book (srt/engine/peers.py, book.py)."""

from __future__ import annotations

import pytest

from sglang_prorsa.srt.common.messages import MigratedRequest, Stage
from sglang_prorsa.srt.engine.book import RecordBook
from sglang_prorsa.srt.engine.peers import NoPair, Peer, PeerView


def peer(iid, role, status="active", epoch=0, port=None):
    return Peer(iid, f"http://{iid}", role, status, "127.0.0.1", port, epoch)


def test_pairs_avoid_this_instance_inactive_peers_and_busy_ones():
    view = PeerView("me")
    view.update([peer("me", "decode"), peer("p1", "prefill"), peer("p2", "prefill"), peer("d1", "decode"),
                 peer("d2", "decode", status="draining")])
    p, d = view.pick_pair()
    assert d.instance_id == "d1" and p.instance_id == "p1"
    view.acquire(p)
    assert view.pick("prefill").instance_id == "p2"  # p1 has a continuation of ours in flight
    view.mark("d1", "unhealthy")
    with pytest.raises(NoPair):
        view.pick("decode")


def test_this_instance_is_the_decode_half_only_when_allowed_and_no_other_decode_peer_is_active():
    """The only decode instance of a small deployment restarts a request whose KV transfer was lost on itself; with
    another decode peer active, or while it is not itself listed active as decode, it never picks itself."""
    view = PeerView("me")
    view.update([peer("me", "decode"), peer("p1", "prefill"), peer("d1", "decode", status="switching")])
    with pytest.raises(NoPair):
        view.pick_pair()  # not allowed: it waits for another decode peer, as a switching holder must
    p, d = view.pick_pair(decode_here=True)
    assert (p.instance_id, d.instance_id) == ("p1", "me")
    with pytest.raises(NoPair):
        view.pick("decode", exclude={"me"}, self_last=True)  # a failed attempt here is avoided like any other
    view.update([peer("me", "decode"), peer("d1", "decode", status="switching")])
    with pytest.raises(NoPair):
        view.pick("prefill", self_last=True)  # never a role it does not serve
    view.update([peer("me", "decode"), peer("p1", "prefill"), peer("d1", "decode")])
    view.acquire(view.peers["d1"], view.peers["d1"])
    assert view.pick_pair(decode_here=True)[1].instance_id == "d1"  # another decode peer first, however busy
    view.update([peer("me", "decode", status="draining"), peer("p1", "prefill")])
    with pytest.raises(NoPair):
        view.pick_pair(decode_here=True)  # listed draining: not itself either


def test_a_restart_from_the_prompt_prefers_its_old_prefill_while_it_still_serves_as_prefill():
    view = PeerView("me")
    view.update([peer("p1", "prefill"), peer("p2", "prefill", port=7), peer("d1", "decode")])
    view.acquire(view.peers["p2"])  # busier than p1, still preferred: its prefix cache holds the prompt
    old = view.by_bootstrap("127.0.0.1", 7)
    assert view.pick_pair(prefer_prefill=old)[0].instance_id == "p2"
    assert view.pick_pair(exclude={"p2"}, prefer_prefill=old)[0].instance_id == "p1"
    view.mark("p2", "switching")
    assert view.pick_pair(prefer_prefill=old)[0].instance_id == "p1"
    view.update([peer("p1", "prefill"), peer("p2", "decode", port=7), peer("d1", "decode")])
    assert view.pick_pair(prefer_prefill=old)[0].instance_id == "p1"  # it switched: no longer a prefill


def test_an_epoch_change_is_reported_so_decode_instances_forget_old_endpoints():
    view = PeerView("me")
    view.update([peer("p", "prefill", port=5)])
    assert view.update([peer("p", "prefill", port=5)]) == []
    changed = view.update([peer("p", "decode", epoch=1, port=5)])
    assert [c.instance_id for c in changed] == ["p"] and view.by_bootstrap("127.0.0.1", 5).role == "decode"


def test_records_are_claimed_once_drained_on_demand_and_expire():
    now = [0.0]
    pending = []
    book = RecordBook(drain=lambda: [book.put(pending.pop()) for _ in list(pending)], clock=lambda: now[0])
    rec = MigratedRequest("r1", "decode", Stage.RUNNING, [1], [2], {})
    pending.append(rec)
    assert book.claim("r1") is rec  # not put yet: claim drains the channel first
    assert book.claim("r1") is None
    book.put(MigratedRequest("old", "decode", Stage.QUEUED, [1], [], {}))
    now[0] = 10_000.0
    book.put(MigratedRequest("new", "decode", Stage.QUEUED, [1], [], {}))
    assert book.peek("old") is None and book.peek("new") is not None and book.expired_total == 1


def test_a_second_record_for_a_rid_keeps_the_instance_deaths_the_first_counted():
    book = RecordBook(drain=lambda: [], clock=lambda: 0.0)
    book.put(MigratedRequest("r", "decode", Stage.QUEUED, [1], [], {}, deaths=1))  # its prefill instance died
    book.put(MigratedRequest("r", "decode", Stage.QUEUED, [1], [], {}))  # taken again before the abort landed
    assert book.claim("r").deaths == 1
