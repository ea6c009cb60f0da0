"""Typed errors of the broker core.

Each carries a stable ``code`` (the API's ``error`` field) and an HTTP status
the fronts use, so a handler can render any of them without a lookup table.
Every error is raised before anything is written: a refused call changes nothing.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error the core raises on purpose."""

    code = "broker_error"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


class InvalidRequest(BrokerError):
    """Malformed input: a bad name, size, class or field; ``fields``: what is wrong with
    each field, where a form shows it next to the field (the message says it all too)."""

    code = "invalid_request"

    def __init__(self, message: str, fields: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}


class NotYourProcess(InvalidRequest):
    """A renewal named as its lease's holder a process that is not its user's: refused,
    so that no user's process escapes outside-use checks by another's naming it."""

    code = "not_your_process"


class ConfigError(BrokerError):
    """The broker's configuration cannot be used as it is (a ``c.GPUBroker`` value, the
    quotas file, the inventory source): the broker does not start, and says why in one
    sentence. Not a caller's bad input (``InvalidRequest``, a 400): no request caused it."""

    code = "broker_unavailable"
    status = 503


class UnknownProfile(InvalidRequest):
    """A MIG profile name that no GPU model in the catalog has."""

    code = "unknown_profile"


class Unsatisfiable(BrokerError):
    """Well-formed, but no device in this inventory could ever satisfy it."""

    code = "unsatisfiable"
    status = 422


class QuotaExceeded(BrokerError):
    """The user's or group's quota forbids it."""

    code = "quota_exceeded"
    status = 403


class NotFound(BrokerError):
    code = "not_found"
    status = 404


class Forbidden(BrokerError):
    """The caller may not act on another user's request or lease."""

    code = "forbidden"
    status = 403


class Conflict(BrokerError):
    """The object is not in a state that allows this (e.g. renewing an ended lease)."""

    code = "conflict"
    status = 409


class PartitionFailed(BrokerError):
    """The MIG partitioner could not create or destroy an instance."""

    code = "partition_failed"
    status = 503


class StorageFull(BrokerError):
    """The state file could not be written (a full disk or an I/O error); nothing changed."""

    code = "storage_full"
    status = 507


class StateFileError(BrokerError):
    """The broker cannot use its state file: corrupt, unreadable, too new or in use.

    The message is one sentence, ``<file>: <cause>; <what to do>``, shown as is by
    every front (the API's 503, a GPU kernel's failed start, the CLI)."""

    code = "broker_unavailable"
    status = 503


class GpuInUse(BrokerError):
    """Another broker on this machine (another user's, another state file) already
    manages one of its GPUs, or the machine-wide lock of a GPU cannot be taken."""

    code = "broker_unavailable"
    status = 503
