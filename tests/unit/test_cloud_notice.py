"""The metadata services' documents, as each cloud documents them, read by the pure parsers."""

from __future__ import annotations

import json

import pytest

from vcdl.worker.cloud_notice import (
    CloudNotice,
    CloudPoller,
    MetadataWatcher,
    aws_notice,
    azure_notice,
    gcp_notice,
)


def test_aws_instance_action_and_rebalance() -> None:
    body = json.dumps({"action": "terminate", "time": "2017-09-18T08:22:00Z"})
    assert aws_notice(200, body) == CloudNotice(
        "aws", "instance-action:terminate", "2017-09-18T08:22:00Z"
    )
    assert aws_notice(200, json.dumps({"action": "stop", "time": "t"})).kind.endswith("stop")  # type: ignore[union-attr]
    assert aws_notice(404, "") is None
    assert aws_notice(200, "not json") is None and aws_notice(200, "[1]") is None
    assert aws_notice(200, json.dumps({"action": "reboot"})) is None
    rebalance = aws_notice(200, json.dumps({"noticeTime": "2020-10-27T08:22:00Z"}), rebalance=True)
    assert rebalance == CloudNotice("aws", "rebalance", "2020-10-27T08:22:00Z")


def test_gcp_preempted() -> None:
    assert gcp_notice(200, "TRUE") == CloudNotice("gcp", "preempted")
    assert gcp_notice(200, "TRUE\n") is not None
    assert gcp_notice(200, "FALSE") is None and gcp_notice(503, "TRUE") is None


def _events(*events: dict[str, object]) -> str:
    return json.dumps({"DocumentIncarnation": 3, "Events": list(events)})


def test_azure_preempt_for_this_vm_only() -> None:
    preempt = {
        "EventId": "A123",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1"],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
    }
    assert azure_notice(200, _events(preempt), "vm1") == CloudNotice(
        "azure", "Preempt", "Mon, 19 Sep 2016 18:29:47 GMT"
    )
    assert azure_notice(200, _events(preempt), "vm2") is None  # another VM's
    assert azure_notice(200, _events(preempt), None) is not None  # name unknown: taken
    assert azure_notice(200, _events(preempt | {"EventType": "Reboot"}), "vm1") is None
    assert azure_notice(200, _events(preempt | {"Resources": []}), "vm1") is not None
    assert azure_notice(200, _events(), "vm1") is None
    assert azure_notice(200, "{}", "vm1") is None and azure_notice(500, "", "vm1") is None
    assert azure_notice(200, "garbage", "vm1") is None


def test_an_unknown_cloud_and_a_bad_interval_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown cloud"):
        CloudPoller("ibm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="above 0"):
        MetadataWatcher(CloudPoller("gcp", "http://127.0.0.1:9"), 0.0, lambda n: None)


def test_the_config_takes_a_cloud_and_an_interval() -> None:
    from vcdl.config import parse_config
    from vcdl.errors import ConfigError

    cfg = parse_config({"fault": {"cloud_notices": "aws", "notice_poll_seconds": 2}})
    assert (cfg.fault.cloud_notices, cfg.fault.notice_poll_seconds) == ("aws", 2.0)
    with pytest.raises(ConfigError, match="cloud_notices"):
        parse_config({"fault": {"cloud_notices": "ibm"}})
    with pytest.raises(ConfigError, match="notice_poll_seconds"):
        parse_config({"fault": {"notice_poll_seconds": 0}})
