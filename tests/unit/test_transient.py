"""The retry policy of transient network errors (vcdl/transient.py) and which errors are
transient at each edge: S3 (vcdl/store/s3retry.py) and PostgreSQL (vcdl/ledger/retry.py)."""

from __future__ import annotations

import asyncio
import errno
import logging
import random

import aiohttp
import psycopg
import pytest
from botocore import exceptions as boto
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.exc import IntegrityError as SAIntegrityError
from sqlalchemy.exc import OperationalError as SAOperationalError

from vcdl.errors import ChecksumMismatch, LeaseLost, LedgerError
from vcdl.ledger.retry import lost_connection, reconnect_pause, rolled_back, safe_to_repeat
from vcdl.store import s3retry
from vcdl.transient import (
    DEFAULT_POLICY,
    FIRST_CONTACT_RETRIES,
    MIN_DEADLINE,
    Outage,
    RetryPolicy,
    retry_async,
    retry_call,
)

policies = st.builds(
    RetryPolicy,
    first=st.floats(0.01, 2),
    factor=st.floats(1, 4),
    cap=st.floats(2, 30),
    deadline=st.floats(1, 300),
)


@given(policies, st.integers(0, 10_000), st.integers(0, 2**32))
def test_every_pause_lies_within_half_its_step_and_the_cap(
    policy: RetryPolicy, n: int, seed: int
) -> None:
    pause = policy.pause(n, random.Random(seed))
    try:
        step = min(policy.cap, policy.first * policy.factor**n)
    except OverflowError:
        step = policy.cap
    assert step / 2 <= pause <= step <= policy.cap


@given(policies, st.integers(0, 2**32))
def test_a_schedule_never_passes_its_deadline_and_ends(policy: RetryPolicy, seed: int) -> None:
    rng, elapsed, n = random.Random(seed), 0.0, 0
    while (pause := policy.next_pause(n, elapsed, rng)) is not None:
        elapsed += pause
        n += 1
        assert n < 100_000
    assert elapsed <= policy.deadline
    # Given up no earlier than one (at most capped) pause before the deadline.
    assert elapsed > policy.deadline - policy.cap


def test_the_default_policy_outlasts_a_minute_partition() -> None:
    assert DEFAULT_POLICY.deadline >= MIN_DEADLINE
    with pytest.raises(ValueError):
        RetryPolicy(first=0)
    with pytest.raises(ValueError):
        RetryPolicy(first=5, cap=1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _answered(name: str) -> Outage:
    service = Outage(name)
    service.succeeded(0.0)
    return service


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, service = Clock(), _answered("store s3://b")
    failures = iter([ConnectionResetError("reset")] * 5)

    def call() -> str:
        clock.now += 0.1
        error = next(failures, None)
        if error is not None:
            raise error
        return "ok"

    with caplog.at_level(logging.WARNING, "vcdl.transient"):
        for _ in range(2):  # a second call, meanwhile: no line of its own
            assert retry_call(call, lambda e: True, service, sleep=clock.sleep, clock=clock) == "ok"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("store s3://b unreachable (ConnectionResetError: reset)")
    assert "90 s" in lines[0]
    assert lines[1].startswith("store s3://b reachable again after")
    assert "5 calls retried" in lines[1]
    assert service.outages == 1 and service.since is None


def test_a_single_failure_is_a_blip_retried_without_a_word(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, service = Clock(), _answered("store blip")
    failures = iter([ConnectionResetError("stale pooled connection")])

    def call() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "ok"

    with caplog.at_level(logging.WARNING, "vcdl.transient"):
        assert retry_call(call, lambda e: True, service, sleep=clock.sleep, clock=clock) == "ok"
    assert caplog.records == [] and service.outages == 0 and service.retried == 0


def test_a_call_is_given_up_at_the_deadline_with_its_own_error() -> None:
    clock, service = Clock(), _answered("ledger x")
    policy = RetryPolicy(first=1, factor=2, cap=4, deadline=20)
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise TimeoutError("timed out")

    with pytest.raises(TimeoutError, match="timed out"):
        retry_call(call, lambda e: True, service, policy, sleep=clock.sleep, clock=clock)
    assert clock.now <= 20 and calls >= 5
    assert service.since is not None  # still out: the next success logs its end


def test_refusals_are_raised_at_once() -> None:
    clock = Clock()
    for error, service in [
        (ChecksumMismatch("v3: checksum mismatch"), _answered("store")),
        (LeaseLost("taken over"), _answered("ledger")),
    ]:

        def call(error: Exception = error) -> None:
            raise error

        transient = s3retry.transient if "store" in service.name else lambda e: True
        if isinstance(error, LedgerError):
            transient = lost_connection
        with pytest.raises(type(error)):
            retry_call(call, transient, service, sleep=clock.sleep, clock=clock)
    assert clock.now == 0


def test_a_service_never_reached_is_retried_briefly_and_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A wrong endpoint fails in about two seconds, not after the 90-s deadline."""
    clock, service, calls = Clock(), Outage("never answered"), 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("refused")

    with caplog.at_level(logging.WARNING, "vcdl.transient"), pytest.raises(ConnectionRefusedError):
        retry_call(call, lambda e: True, service, sleep=clock.sleep, clock=clock)
    assert calls == FIRST_CONTACT_RETRIES + 1 and clock.now <= 2
    assert caplog.records == [] and service.outages == 0


def test_the_async_loop_retries_without_blocking_its_event_loop() -> None:
    service = _answered("store async")
    policy = RetryPolicy(first=0.01, cap=0.02, deadline=5)
    tries = 0

    async def call() -> int:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise aiohttp.ServerDisconnectedError()
        return tries

    async def main() -> tuple[int, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        got = await retry_async(call, s3retry.transient, service, policy)
        task.cancel()
        return got, ticks

    got, ticks = asyncio.run(main())
    assert got == 3 and ticks > 1


def _client_error(code: str, status: int) -> boto.ClientError:
    return boto.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def _translated(answer: boto.ClientError) -> OSError:
    # As s3fs's translate_boto_error raises an answer it has no mapping for.
    error = OSError(errno.EIO, str(answer))
    error.__cause__ = answer
    return error


@pytest.mark.parametrize(
    "error",
    [
        boto.EndpointConnectionError(endpoint_url="http://s3"),
        boto.ConnectionClosedError(endpoint_url="http://s3"),
        boto.ReadTimeoutError(endpoint_url="http://s3"),
        boto.ConnectTimeoutError(endpoint_url="http://s3"),
        boto.ResponseStreamingError(error="reset"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("truncated"),
        ConnectionResetError(104, "reset by peer"),
        TimeoutError(),
        _client_error("SlowDown", 503),
        _translated(_client_error("InternalError", 500)),
        _translated(_client_error("Weird", 502)),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_s3_errors(error: BaseException) -> None:
    assert s3retry.transient(error)


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("no such key"),
        PermissionError("denied"),
        ChecksumMismatch("checksum mismatch"),
        boto.SSLError(endpoint_url="https://s3", error="certificate verify failed"),
        _translated(_client_error("InvalidArgument", 400)),
        ValueError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_lasting_s3_errors(error: BaseException) -> None:
    assert not s3retry.transient(error)


def _sa(orig: Exception, invalidated: bool = False) -> SAOperationalError:
    return SAOperationalError("SELECT 1", {}, orig, connection_invalidated=invalidated)


def _WithState(sqlstate: str) -> Exception:
    # psycopg's class of that SQLSTATE, as the server's answer would raise it.
    return psycopg.errors.lookup(sqlstate)("x")


def test_which_database_errors_are_a_lost_connection() -> None:
    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert lost_connection(refused)
    assert lost_connection(_sa(refused))
    assert lost_connection(_sa(Exception("server closed the connection"), invalidated=True))
    assert lost_connection(_WithState("08006"))
    assert lost_connection(_WithState("57P01"))
    # A refusal by the ledger is not: a unique violation, a serialization
    # failure (re-run at once, apart), SQLite's lock, vcdl's own fencing.
    assert not lost_connection(SAIntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not lost_connection(_WithState("40001"))
    import sqlite3

    assert not lost_connection(_sa(sqlite3.OperationalError("database is locked")))
    assert not lost_connection(LeaseLost("taken over"))


def test_a_session_ended_idle_in_transaction_is_repeated_even_at_its_commit() -> None:
    """SQLSTATE 25P03 (vcdl/ledger/pgsession.py): the server rolled the transaction back,
    so even a commit on the way applied nothing; a cancelled statement (57014, the
    statement timeout) is not a lost connection and is raised."""
    ended = _sa(_WithState("25P03"), invalidated=True)
    assert lost_connection(_WithState("25P03")) and rolled_back(ended)
    service = _answered("ledger pg")
    assert reconnect_pause(ended, "commit", service, reads=False, autocommit=False, n=0, elapsed=0)
    assert not rolled_back(_WithState("08006"))
    assert not lost_connection(_WithState("57014"))


def test_a_write_whose_commit_may_have_landed_is_never_repeated() -> None:
    assert safe_to_repeat("connect", reads=False, autocommit=True)
    assert safe_to_repeat("run", reads=True, autocommit=True)
    assert safe_to_repeat("run", reads=False, autocommit=False)  # rolled back by the server
    assert not safe_to_repeat("run", reads=False, autocommit=True)
    assert not safe_to_repeat("commit", reads=False, autocommit=False)
    service = _answered("ledger pg")
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert reconnect_pause(lost, "connect", service, reads=False, autocommit=True, n=0, elapsed=0)
    assert (
        reconnect_pause(lost, "commit", service, reads=False, autocommit=False, n=0, elapsed=0)
        is None
    )
    assert (
        reconnect_pause(lost, "run", Outage("new"), reads=True, autocommit=True, n=3, elapsed=0)
        is None
    )
    assert (
        reconnect_pause(lost, "run", service, reads=True, autocommit=True, n=3, elapsed=95) is None
    )
