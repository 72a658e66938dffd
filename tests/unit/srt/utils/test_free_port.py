"""``free_port`` hands out ports that nobody else is handed while our server starts: below the kernel's ephemeral
range, outside SGLang's and Mooncake's own bands, never twice from one process."""

import socket

from sglang_prorsa.srt.utils import processes


def _in_bands(port: int) -> bool:
    return any(low <= port <= high for low, high in processes.PORT_BANDS)


def test_ports_lie_in_the_bands_below_the_ephemeral_range_and_never_repeat():
    ports = [processes.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(_in_bands(p) for p in ports), [p for p in ports if not _in_bands(p)]
    assert max(ports) < processes._ephemeral_low()
    assert not any(22000 <= p <= 29999 or 15000 <= p <= 17000 for p in ports)


def test_a_port_bound_by_another_socket_is_never_handed_out(monkeypatch):
    with socket.socket() as probe:
        probe.bind((processes.LOOPBACK, 0))
        other = probe.getsockname()[1]  # free again once the probe closes
    with socket.socket() as held:
        held.bind((processes.LOOPBACK, 0))
        taken = held.getsockname()[1]
        # Only two candidates: the held one and one other; the held one must be skipped however the sample falls.
        monkeypatch.setattr(processes, "PORT_BANDS", ((taken, taken), (other, other)))
        monkeypatch.setattr(processes, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(processes, "_HANDED_OUT", set())
        assert processes.free_port() == other
        # Both are now out of reach (one bound, one handed out): the kernel chooses.
        assert processes.free_port() not in (taken, other)
