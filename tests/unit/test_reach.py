"""What :func:`scheduler_unreachable` says about an address, on loopback."""

from __future__ import annotations

import socket
import time

import pytest

from tests.ports import free_port
from vcdl.reach import scheduler_unreachable

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone


def test_a_closed_port_is_refused_at_once() -> None:
    started = time.monotonic()
    assert scheduler_unreachable(f"tcp://127.0.0.1:{free_port()}") == "connection refused"
    assert scheduler_unreachable(f"tls://127.0.0.1:{free_port()}") == "connection refused"
    assert time.monotonic() - started < 5


def test_a_listener_is_left_to_the_dask_handshake() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert scheduler_unreachable(f"tcp://127.0.0.1:{s.getsockname()[1]}") is None


def test_a_name_that_does_not_resolve_says_so() -> None:
    problem = scheduler_unreachable("tcp://no-such-host.invalid:8786", timeout=5)
    assert problem is not None and problem.startswith("host not found"), problem


def test_other_schemes_and_malformed_addresses_are_not_judged_here() -> None:
    assert scheduler_unreachable("ws://127.0.0.1:1") is None
    assert scheduler_unreachable("inproc://x") is None
    assert scheduler_unreachable("tcp://127.0.0.1:notaport") is None
