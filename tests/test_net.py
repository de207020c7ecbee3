"""asyncrl.net.free_port: a port outside the kernel's ephemeral range and at or above the floor, bindable on
every address of the host (IPv4 and IPv6), not given twice in a row, and a clear error when none is."""

from __future__ import annotations

import collections
import random
import socket
import threading

import pytest

from asyncrl import net


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6(), reason="this machine has no IPv6 loopback")


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch):
    """Each test starts with no remembered ports (the module's memory outlives a test)."""
    monkeypatch.setattr(net, "_recent", collections.deque(maxlen=net.RECENT_PORTS))


def _range_file(tmp_path, monkeypatch, text: str) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", str(path))


class _Picks(random.Random):
    """An rng whose ``randrange`` answers the given ports in turn (the last one from then on)."""

    def __init__(self, *ports: int):
        super().__init__()
        self.ports = list(ports)

    def randrange(self, lo, hi):  # type: ignore[override]
        return self.ports.pop(0) if len(self.ports) > 1 else self.ports[0]


def test_port_is_below_the_ephemeral_range_and_bindable():
    low = net.ephemeral_port_low()
    ports = [net.free_port() for _ in range(20)]
    assert len(set(ports)) == 20  # never the same port twice in a row of RECENT_PORTS calls
    for port in ports:
        assert net.PORT_FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("", port))  # free for the real server


def test_range_is_read_from_the_proc_file(tmp_path, monkeypatch):
    _range_file(tmp_path, monkeypatch, "20100\t60999\n")
    assert net.ephemeral_port_range() == (20100, 60999) and net.ephemeral_port_low() == 20100
    ports = {net.free_port(host="127.0.0.1", rng=random.Random(seed)) for seed in range(50)}
    assert all(net.PORT_FLOOR <= p < 20100 for p in ports), sorted(ports)


@pytest.mark.parametrize("text, lo, hi", [("15000 40000", 40001, 65535),   # no room below: above the range's end
                                          ("1024 19000", 20000, 65535),    # ...but never below the floor
                                          ("1025 60999", 61000, 65535)])
def test_a_range_starting_at_or_below_the_floor_uses_the_ports_above_its_end(tmp_path, monkeypatch, text, lo, hi):
    _range_file(tmp_path, monkeypatch, text)
    ports = [net.free_port(host="127.0.0.1", rng=random.Random(seed)) for seed in range(30)]
    assert all(lo <= p <= hi for p in ports), sorted(ports)  # never Ray's ports (6379, 8265, 10001-19999)


@pytest.mark.parametrize("text", ["1024 65535", "1025 65535", "15000 65535", "20000 65535"])
def test_no_room_outside_the_range_falls_back_to_the_kernel_with_a_warning(tmp_path, monkeypatch, caplog, text):
    _range_file(tmp_path, monkeypatch, text)
    with caplog.at_level("WARNING", logger="asyncrl.net"):
        port = net.free_port(host="127.0.0.1")
    assert 0 < port < 65536 and "leaves no port at or above 20000 outside it" in caplog.text


@pytest.mark.parametrize("text", ["", "not a range", "40000", "60999 32768", "70000 80000", "-5 10", "0 0",
                                  "32768 60999 extra"])
def test_missing_or_garbled_range_file_means_the_default(tmp_path, monkeypatch, text):
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", str(tmp_path / "absent"))
    assert net.ephemeral_port_range() == net.DEFAULT_EPHEMERAL_RANGE == (32768, 65535)
    _range_file(tmp_path, monkeypatch, text)
    assert net.ephemeral_port_range() == (32768, 65535) and net.ephemeral_port_low() == net.DEFAULT_EPHEMERAL_LOW
    assert net.PORT_FLOOR <= net.free_port() < 32768


def test_every_candidate_taken_raises_a_clear_error(monkeypatch):
    tried = []

    def taken(addrs, port: int) -> bool:
        tried.append(port)
        return False

    monkeypatch.setattr(net, "_bindable", taken)
    with pytest.raises(RuntimeError, match=r"no free TCP port on host '127.0.0.1': 7 random ports in 20000-"):
        net.free_port(host="127.0.0.1", attempts=7)
    assert len(tried) == 7
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        net.free_port(attempts=0)


def test_a_taken_port_is_skipped():
    with socket.socket() as held:
        held.bind(("", net.free_port()))
        taken, other = held.getsockname()[1], net.free_port()
        net._recent.clear()
        assert other != taken
        assert net.free_port(rng=_Picks(taken, taken, other)) == other


def test_a_port_is_not_returned_twice_in_a_row():
    first = net.free_port(host="127.0.0.1")
    other = net.free_port(host="127.0.0.1")
    net._recent.clear()
    net._recent.append(first)
    assert net.free_port(host="127.0.0.1", rng=_Picks(first, other)) == other  # first is free, but was given out


def test_concurrent_callers_never_get_the_same_port():
    got, lock = [], threading.Lock()

    def call():
        for _ in range(20):
            port = net.free_port()
            with lock:
                got.append(port)

    threads = [threading.Thread(target=call) for _ in range(25)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 500 and len(set(got)) == 500  # 500 < RECENT_PORTS: all remembered


def test_memory_never_uses_up_a_small_window(tmp_path, monkeypatch):
    _range_file(tmp_path, monkeypatch, "20008 60999")  # 8 ports: at most 2 remembered
    ports = [net.free_port(host="127.0.0.1") for _ in range(30)]
    assert all(20000 <= p < 20008 for p in ports)
    assert all(a != b for a, b in zip(ports, ports[1:]))


def test_an_unresolvable_or_foreign_host_is_a_clear_error():
    with pytest.raises(ValueError, match=r"cannot resolve host 'no-such-host\.invalid'"):
        net.free_port("no-such-host.invalid")
    with pytest.raises(ValueError, match=r"host '192\.0\.2\.1' has no address this machine can bind"):
        net.free_port("192.0.2.1")  # TEST-NET-1: never a local address


@needs_ipv6
@pytest.mark.parametrize("host, addr", [("::1", "::1"), ("[::1]", "::1"), ("::", "::")])
def test_ipv6_hosts_get_a_port_bindable_there(host, addr):
    port = net.free_port(host)
    assert net.PORT_FLOOR <= port < net.ephemeral_port_low()
    with socket.socket(socket.AF_INET6) as s:
        s.bind((addr, port))


@needs_ipv6
def test_ipv6_host_in_the_kernel_fallback(tmp_path, monkeypatch):
    _range_file(tmp_path, monkeypatch, "1024 65535")
    port = net.free_port("::1")
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", port))


@needs_ipv6
def test_a_port_held_only_by_an_ipv6_listener_is_taken_for_the_default_host():
    """A dual-stack server (Jupyter on localhost) also binds [::1]: a port held there must not be offered."""
    with socket.socket(socket.AF_INET6) as held:
        held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        held.bind(("::1", net.free_port()))
        held.listen()
        taken, other = held.getsockname()[1], net.free_port()
        net._recent.clear()
        assert net.free_port(host="127.0.0.1", rng=_Picks(taken)) == taken  # free on IPv4 alone
        net._recent.clear()
        assert net.free_port(rng=_Picks(taken, taken, other)) == other
