"""Fake instance metadata services of AWS, GCP and Azure, on loopback, for the tests.

Each serves the paths and documents its cloud documents (vcdl/worker/cloud_notice.py
cites them) and refuses a request without the cloud's required header: AWS's
IMDSv2 session token (401), GCP's ``Metadata-Flavor: Google`` (403), Azure's
``Metadata: true`` (400). :meth:`FakeMetadata.announce` makes the notice
appear; until then AWS answers 404, GCP ``FALSE``, Azure an empty event list.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "fake-imds-token"
VM = "vm-under-test"


class FakeMetadata:
    def __init__(self, cloud: str, rebalance: bool = False) -> None:
        self.cloud = cloud
        self.rebalance = rebalance  # AWS: announce a rebalance recommendation instead
        self.announced = threading.Event()
        self.requests = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_PUT(self) -> None:
                fake.requests += 1
                if (
                    fake.cloud == "aws"
                    and self.path == "/latest/api/token"
                    and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                ):
                    self._send(200, TOKEN)
                else:
                    self._send(400, "")

            def do_GET(self) -> None:
                fake.requests += 1
                status, body = fake.answer(self.path, self.headers)
                self._send(status, body)

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeMetadata:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def announce(self) -> None:
        self.announced.set()

    def answer(self, path: str, headers: Any) -> tuple[int, str]:
        on = self.announced.is_set()
        if self.cloud == "aws":
            if headers.get("X-aws-ec2-metadata-token") != TOKEN:
                return 401, ""
            if path == "/latest/meta-data/spot/instance-action":
                if on and not self.rebalance:
                    return 200, json.dumps({"action": "terminate", "time": "2026-11-28T08:22:00Z"})
                return 404, ""
            if path == "/latest/meta-data/events/recommendations/rebalance":
                if on and self.rebalance:
                    return 200, json.dumps({"noticeTime": "2026-11-28T08:17:00Z"})
                return 404, ""
            return 404, ""
        if self.cloud == "gcp":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, ""
            if path == "/computeMetadata/v1/instance/preempted":
                return 200, "TRUE" if on else "FALSE"
            return 404, ""
        if headers.get("Metadata") != "true":
            return 400, ""
        if path.startswith("/metadata/instance/compute/name"):
            return 200, VM
        if path.startswith("/metadata/scheduledevents"):
            events = [
                # Another VM's event first: a notice only for this one.
                {
                    "EventId": "0",
                    "EventType": "Freeze",
                    "ResourceType": "VirtualMachine",
                    "Resources": [VM],
                    "EventStatus": "Scheduled",
                    "NotBefore": "Sat, 28 Nov 2026 08:22:00 GMT",
                }
            ]
            if on:
                events.append(
                    {
                        "EventId": "1",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": [VM],
                        "EventStatus": "Scheduled",
                        "NotBefore": "Sat, 28 Nov 2026 08:22:30 GMT",
                        "EventSource": "Platform",
                        "DurationInSeconds": -1,
                    }
                )
            return 200, json.dumps({"DocumentIncarnation": 2 if on else 1, "Events": events})
        return 404, ""
