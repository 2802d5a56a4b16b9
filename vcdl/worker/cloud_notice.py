"""Preemption notices from the cloud's instance metadata service, for VM spot fleets.

On Kubernetes a reclaimed node's pods get SIGTERM, which
:mod:`vcdl.worker.preemption` turns into "finish the batch, hand in a partial
result, leave the pool". On plain VMs nothing sends a signal: the warning
is published only by the instance metadata service, which a worker must
poll. This module reads it, per cloud, as each cloud documents it:

``aws``
    ``GET /latest/meta-data/spot/instance-action``: 404 until the instance
    is to be interrupted, then ``{"action": "terminate"|"stop"|"hibernate",
    "time": "2017-09-18T08:22:00Z"}`` about two minutes ahead; and
    ``GET /latest/meta-data/events/recommendations/rebalance``: 404, then
    ``{"noticeTime": "..."}`` when the instance is at elevated risk. Both
    under IMDSv2: a session token from ``PUT /latest/api/token`` (header
    ``X-aws-ec2-metadata-token-ttl-seconds``) sent as
    ``X-aws-ec2-metadata-token``.
``gcp``
    ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor:
    Google``: ``FALSE``, then ``TRUE`` about thirty seconds ahead.
``azure``
    ``GET /metadata/scheduledevents?api-version=2020-07-01`` with
    ``Metadata: true``: ``{"DocumentIncarnation": n, "Events": [...]}``; an
    event with ``"EventType": "Preempt"`` (at least 30 seconds ahead) whose
    ``Resources`` name this VM (or name none) is the notice.

The parsers are pure (:func:`aws_notice`, :func:`gcp_notice`,
:func:`azure_notice`); :class:`MetadataWatcher` polls in a daemon thread
and calls its ``on_notice`` once: the worker runtime hands it the same
:meth:`~vcdl.worker.preemption.Notice.set` that SIGTERM calls. The base URL
is the cloud's own unless ``$VCDL_METADATA_URL`` names another (a test's
fake server, a proxy). A metadata service that cannot be reached is logged
once and polled again: a missed poll must not fail an attempt.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

log = logging.getLogger(__name__)

Cloud = Literal["aws", "gcp", "azure"]
CLOUDS: tuple[Cloud, ...] = ("aws", "gcp", "azure")

#: Where each cloud serves its instance metadata (read-only: worker state lives in
#: vcdl.worker.runtime).
BASE_URLS: Mapping[Cloud, str] = MappingProxyType(
    {
        "aws": "http://169.254.169.254",
        "gcp": "http://metadata.google.internal",
        "azure": "http://169.254.169.254",
    }
)
URL_ENV = "VCDL_METADATA_URL"

AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"

#: Seconds one request to the metadata service may take (it is on the host).
TIMEOUT = 2.0


@dataclass(frozen=True)
class CloudNotice:
    """A notice read from a metadata service: which cloud, what it said, for when."""

    cloud: Cloud
    kind: str
    """``instance-action:terminate``, ``rebalance``, ``preempted``, ``Preempt``..."""
    at: str | None = None
    """The time the cloud gives (its own format), if any."""


def aws_notice(status: int, body: str, rebalance: bool = False) -> CloudNotice | None:
    """AWS: an ``instance-action`` (or, with ``rebalance``, a rebalance recommendation)."""
    if status != 200:
        return None  # 404: nothing scheduled
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if rebalance:
        return CloudNotice("aws", "rebalance", _text(doc.get("noticeTime")))
    action = doc.get("action")
    if action not in ("terminate", "stop", "hibernate"):
        return None
    return CloudNotice("aws", f"instance-action:{action}", _text(doc.get("time")))


def gcp_notice(status: int, body: str) -> CloudNotice | None:
    """GCP: ``instance/preempted`` says ``TRUE``."""
    if status == 200 and body.strip().upper() == "TRUE":
        return CloudNotice("gcp", "preempted")
    return None


def azure_notice(status: int, body: str, vm_name: str | None = None) -> CloudNotice | None:
    """Azure: a ``Preempt`` scheduled event for this VM (``vm_name``; None: any)."""
    if status != 200:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    events = doc.get("Events") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return None
    for event in events:
        if not isinstance(event, dict) or event.get("EventType") != "Preempt":
            continue
        resources = event.get("Resources") or []
        if vm_name is None or not resources or vm_name in resources:
            return CloudNotice("azure", "Preempt", _text(event.get("NotBefore")))
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


Fetch = Callable[[str, str, dict[str, str]], tuple[int, str]]
"""``(method, url, headers) -> (status, body)``; raises OSError when unreachable."""


def http_fetch(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    """One request to the metadata service (never through a proxy: it is link-local)."""
    request = urllib.request.Request(url, method=method, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            return int(response.status), response.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""


class CloudPoller:
    """One poll of one cloud's metadata service: the notice, or None."""

    def __init__(self, cloud: Cloud, base_url: str | None = None, fetch: Fetch = http_fetch):
        if cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {cloud!r}; one of {', '.join(CLOUDS)}")
        self.cloud = cloud
        self.base = (base_url or os.environ.get(URL_ENV) or BASE_URLS[cloud]).rstrip("/")
        self._fetch = fetch
        self._vm_name: str | None = None

    def poll(self) -> CloudNotice | None:
        """Ask once; raises OSError when the service cannot be reached."""
        if self.cloud == "aws":
            headers = self._aws_headers()
            status, body = self._fetch("GET", self.base + AWS_ACTION_PATH, headers)
            found = aws_notice(status, body)
            if found is None:
                status, body = self._fetch("GET", self.base + AWS_REBALANCE_PATH, headers)
                found = aws_notice(status, body, rebalance=True)
            return found
        if self.cloud == "gcp":
            status, body = self._fetch(
                "GET", self.base + GCP_PREEMPTED_PATH, {"Metadata-Flavor": "Google"}
            )
            return gcp_notice(status, body)
        if self._vm_name is None:
            status, body = self._fetch("GET", self.base + AZURE_NAME_PATH, {"Metadata": "true"})
            self._vm_name = body.strip() if status == 200 and body.strip() else ""
        status, body = self._fetch("GET", self.base + AZURE_EVENTS_PATH, {"Metadata": "true"})
        return azure_notice(status, body, self._vm_name or None)

    def _aws_headers(self) -> dict[str, str]:
        # IMDSv2 (the default on new instances refuses v1): a session token first.
        status, token = self._fetch(
            "PUT", self.base + AWS_TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        )
        return {"X-aws-ec2-metadata-token": token.strip()} if status == 200 else {}


class MetadataWatcher:
    """Polls a cloud's metadata service every ``interval`` seconds in a daemon thread;
    calls ``on_notice`` once, at the first notice, and stops."""

    def __init__(
        self,
        poller: CloudPoller,
        interval: float,
        on_notice: Callable[[CloudNotice], None],
    ) -> None:
        if not interval > 0:
            raise ValueError(f"the poll interval must be above 0 s, got {interval!r}")
        self.poller = poller
        self.interval = interval
        self.notice: CloudNotice | None = None
        self._on_notice = on_notice
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"vcdl-{poller.cloud}-notices", daemon=True
        )
        self._unreachable_said = False

    @property
    def cloud(self) -> Cloud:
        return self.poller.cloud

    def start(self) -> MetadataWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.poller.poll()
            except OSError as exc:
                if not self._unreachable_said:  # said once: it is polled again and again
                    log.warning(
                        "cannot reach the %s instance metadata service at %s (%s); "
                        "preemption notices are not seen until it answers",
                        self.cloud,
                        self.poller.base,
                        exc,
                    )
                    self._unreachable_said = True
                found = None
            if found is not None:
                self.notice = found
                log.warning("preemption notice from %s: %s", self.cloud, found.kind)
                self._on_notice(found)
                return
            self._stop.wait(self.interval)
