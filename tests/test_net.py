"""asyncrl.net.free_port: a port below the kernel's ephemeral range, bindable, and a clear error when none is."""

from __future__ import annotations

import random
import socket

import pytest

from asyncrl import net


def _range_file(tmp_path, monkeypatch, text: str) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", str(path))


def test_port_is_below_the_ephemeral_range_and_bindable():
    low = net.ephemeral_port_low()
    for _ in range(20):
        port = net.free_port()
        assert net.PORT_FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("", port))  # free for the real server


def test_range_is_read_from_the_proc_file(tmp_path, monkeypatch):
    _range_file(tmp_path, monkeypatch, "20100\t60999\n")
    assert net.ephemeral_port_low() == 20100
    ports = {net.free_port(host="127.0.0.1", rng=random.Random(seed)) for seed in range(50)}
    assert all(net.PORT_FLOOR <= p < 20100 for p in ports), sorted(ports)
    # a range that starts below the floor: the window moves down to the unprivileged ports under it
    _range_file(tmp_path, monkeypatch, "15000 60999")
    assert all(1024 <= net.free_port(rng=random.Random(seed)) < 15000 for seed in range(20))


def test_missing_or_garbled_range_file_means_32768(tmp_path, monkeypatch):
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", str(tmp_path / "absent"))
    assert net.ephemeral_port_low() == net.DEFAULT_EPHEMERAL_LOW == 32768
    _range_file(tmp_path, monkeypatch, "not a range")
    assert net.ephemeral_port_low() == 32768
    assert net.PORT_FLOOR <= net.free_port() < 32768


def test_every_candidate_taken_raises_a_clear_error(monkeypatch):
    tried = []

    def taken(host: str, port: int) -> bool:
        tried.append(port)
        return False

    monkeypatch.setattr(net, "_bindable", taken)
    with pytest.raises(RuntimeError, match=r"no free TCP port on host '127.0.0.1': 7 random ports in 20000-"):
        net.free_port(host="127.0.0.1", attempts=7)
    assert len(tried) == 7


def test_a_taken_port_is_skipped():
    with socket.socket() as held:
        held.bind(("", net.free_port()))
        taken, other = held.getsockname()[1], net.free_port()
        assert other != taken
        picks = iter([taken, taken, other])
        rng = random.Random()
        rng.randrange = lambda lo, hi: next(picks)
        assert net.free_port(rng=rng) == other


def test_no_room_below_the_range_falls_back_to_the_kernel_with_a_warning(tmp_path, monkeypatch, caplog):
    _range_file(tmp_path, monkeypatch, "1024 65535")
    with caplog.at_level("WARNING", logger="asyncrl.net"):
        port = net.free_port(host="127.0.0.1")
    assert 0 < port < 65536 and "no port below it" in caplog.text
