"""What Prefect records of a vcdl flow's parameters: never a credential.

Prefect stores a called flow's parameters (``flow_run.parameters``) when it
creates the flow run, before the flow validates them, and logs the raw
parameters when they fail validation. A config holding a credential is
refused by vcdl (vcdl/config.py), but by then Prefect would have it in its
database and its log. So vcdl's flows are :class:`GuardedFlow`:

* the parameters it hands Prefect to store have every credential masked
  (:func:`vcdl.redact.redact_value`: values under credential-like keys, the
  password and secret query values of URLs); the flow itself still gets them
  as given (a ``ledger_url`` with a password, from a trusted caller, works);
* Prefect's log line of a failed validation (which prints the parameters and
  pydantic's inputs) is replaced by one that names the flow only; the flow
  run's failure message, which names each bad field and why, stays.

A deployment's form is another way in: the server stores what the form sent,
and vcdl refuses credentials there (flows/guard.py). The allowed way to give
credentials is the environment of the process (the AWS chain, PGPASSWORD).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Flow

from vcdl.redact import redact_value

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["GuardedFlow", "guarded_flow"]

_VALIDATION_FAILED = "Parameter validation failed for flow "


class GuardedFlow(Flow[P, R]):
    """A Prefect flow whose stored parameters hold no credential (see the module)."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return redact_value(super().serialize_parameters(parameters))


def guarded_flow(**options: Any) -> Callable[[Callable[P, R]], GuardedFlow[P, R]]:
    """``@flow(**options)`` making a :class:`GuardedFlow`."""

    def make(fn: Callable[P, R]) -> GuardedFlow[P, R]:
        return GuardedFlow(fn=fn, **options)

    return make


class _NoRawParameters(logging.Filter):
    """Prefect's "Parameter validation failed" line, without the parameters and inputs."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_VALIDATION_FAILED):
            name = message[len(_VALIDATION_FAILED) :].split(":", 1)[0]
            record.msg = (
                f"{_VALIDATION_FAILED}{name}: see the flow run's message for the fields "
                "(the parameters are not logged: they may hold credentials)"
            )
            record.args = ()
        return True


def _install() -> None:
    # Prefect logs it on its "prefect.flows" logger (prefect/flows.py, validate_parameters).
    logger = logging.getLogger("prefect.flows")
    if not any(isinstance(f, _NoRawParameters) for f in logger.filters):
        logger.addFilter(_NoRawParameters())


_install()
