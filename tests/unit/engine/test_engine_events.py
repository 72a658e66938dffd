"""The engine's lifecycle reports: prefill_end when the scheduler starts decoding a request (its Decoding note), not
at a non-streamed request's only output; once per request; the rid map stays bounded."""

import time

from sglang_prorsa.srt.common.channel import ChannelAddresses, EngineChannel, SchedulerChannel
from sglang_prorsa.srt.common.messages import Decoding, MigratedRequest, Stage
from sglang_prorsa.srt.engine import events as events_module
from sglang_prorsa.srt.engine.events import EngineEvents


def local_events() -> EngineEvents:
    ev = EngineEvents("", client=None)
    ev.local = lambda batch: None  # a single server's own control plane: enabled, nothing sent here
    return ev


def kinds(ev: EngineEvents) -> list[tuple[str, str]]:
    return [(e["trajectory_id"], e["event"]) for e in ev._buffer]


def test_prefill_end_comes_from_the_decoding_note_with_its_time():
    ev = local_events()
    ev.arrived("rid-1", "traj-a", 100, "p0")
    ev.arrived("rid-2", "traj-b", 50, "p0")
    ev.decoding(Decoding(rids=("rid-2", "unknown"), ts=123.5))
    assert kinds(ev)[-1] == ("traj-b", "prefill_end") and ev._buffer[-1]["ts"] == 123.5
    assert ev._buffer[-1]["instance"] == "p0"
    ev.prefilled("rid-2")  # its first (and only) output: already reported
    ev.prefilled("rid-1")  # no note came (a 1-token request never joins the decode batch): reported now
    assert kinds(ev) == [("traj-a", "request_arrived"), ("traj-a", "prefill_start"), ("traj-b", "request_arrived"),
                         ("traj-b", "prefill_start"), ("traj-b", "prefill_end"), ("traj-a", "prefill_end")]
    assert not ev._prefilling


def test_the_rid_map_is_bounded(monkeypatch):
    monkeypatch.setattr(events_module, "MAX_BUFFERED", 10)
    ev = local_events()
    for i in range(50):
        ev.arrived(f"rid-{i}", f"t{i}", 10, "p0")
    assert len(ev._prefilling) == 10 and "rid-49" in ev._prefilling


def test_the_channel_hands_decoding_notes_to_their_own_callback():
    addresses = ChannelAddresses.fresh()
    sched = SchedulerChannel(addresses, handler=lambda msg: None)
    engine = EngineChannel(addresses)
    try:
        record = MigratedRequest(rid="r1", role="decode", stage=Stage.RUNNING, input_ids=[1, 2], output_ids=[3],
                                 sampling_params={})
        sched.push(Decoding(rids=("r0",), ts=1.0))
        sched.push(record)
        notes = []
        engine._on_decoding = notes.append
        got, deadline = [], time.monotonic() + 5
        while (not got or not notes) and time.monotonic() < deadline:
            got += engine.drain()
            time.sleep(0.01)
        assert [r.rid for r in got] == ["r1"]  # the book only ever sees migrated requests
        assert notes == [Decoding(rids=("r0",), ts=1.0)]
    finally:
        sched.control.close()
        sched.records.close()
        engine._records.close()


def test_an_instance_without_a_controller_follows_the_one_the_peer_push_names():
    ev = local_events()
    ev.client = object()  # an instance's peer client (never used here: nothing is flushed)
    ev.follow("http://front:30000/")
    assert ev.url == "http://front:30000/lifecycle" and ev.local is None and ev.enabled
    ev.follow("http://other:1")  # a controller already known stays
    assert ev.url == "http://front:30000/lifecycle"
    flagged = EngineEvents("http://ctl:9", client=object())
    flagged.follow("http://front:30000")
    assert flagged.url == "http://ctl:9/lifecycle"
    alone = local_events()  # a single server without a peer client has nowhere to send: it keeps its own
    alone.follow("http://front:30000")
    assert alone.url == "" and alone.local is not None
