"""What every part of the API's rules stands on: the running broker, whose objects a
caller may see, and an admin's change with its audit record."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..broker.core import Broker
from ..broker.store import AuditRecord
from ..wire.errors import Forbidden
from .identity import Identity

if TYPE_CHECKING:
    from ..runtime import GPUBroker


class Rules:
    """The API's rules for a running broker (``runtime``)."""

    def __init__(self, runtime: GPUBroker) -> None:
        self.runtime = runtime

    @property
    def core(self) -> Broker:
        return self.runtime.core

    @staticmethod
    def _viewer(who: Identity) -> str | None:
        """The user whose objects ``who`` may see: ``None`` (everyone's) for an admin."""
        return None if who.admin else who.user

    @staticmethod
    def _kernel_may(who: Identity, holder: str) -> bool:
        """Whether ``who`` may act on a request held by ``holder``."""
        return who.kernel_id in (None, holder)

    @staticmethod
    def _require_admin(who: Identity, what: str = "change quotas") -> None:
        if not who.admin:
            kernel = "; a kernel token never acts as one" if who.kernel_id else ""
            raise Forbidden(f"only admins {what} ({who.user} is not one{kernel})")

    @contextmanager
    def _audited(
        self, who: Identity, action: str, target: str, detail: dict[str, Any]
    ) -> Iterator[None]:
        """Run an admin's change with its audit record, committed together."""
        record = AuditRecord(self.core.clock.now(), who.user, action, target, detail)
        with self.core.store.audited(record):
            yield
