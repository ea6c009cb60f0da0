"""Kernel tokens: secrets that act for one user on one kernel's requests only.

Only a token's sha256 is kept, in the state file, so a token outlives a restart of
the broker until its kernel's tokens are revoked, and a copy of the file gives none.

A token also ends once it goes ``max_age`` seconds without a renewal, so that one whose
kernel is gone without revoking it (its server killed with ``-9``) does not act for its
user for ever. What renews it is the word of the kernel's server, never the token's own
use (a leaked token, used, would live for ever): in the embedded broker the tick's sweep
renews the tokens of the kernels its server runs (``sweep``); a server that uses a
central broker renews its kernels' leases with its user's credential, and, for a kernel
with none, the token itself (``POST tokens/{kernel_id}/renew``, every third of
``max_age``: the kernel provisioner). A token past its age is refused at once; the
sweep deletes it from the state file.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

from ..broker.core import Broker

PREFIX = "gpb_"
RENEW_EVERY_S = 60.0
"""A token's renewal is written at most this often (a tenth of its age where that is
less): a kernel's calls do not each write to the state file."""


class KernelTokens:
    def __init__(self, core: Broker, max_age: float) -> None:
        self.core, self.max_age = core, max_age

    def issue(self, user: str, kernel_id: str) -> str:
        """A new token acting as ``user`` on ``kernel_id``'s requests; it replaces that
        user's old one for the kernel (only that user's: another user naming the same
        kernel id must not revoke it)."""
        token = PREFIX + secrets.token_urlsafe(24)
        store = self.core.store
        with store.transaction():
            store.revoke_kernel_tokens(kernel_id, user)
            store.insert_kernel_token(_hash(token), user, kernel_id, self.core.clock.now())
        return token

    def revoke(self, kernel_id: str, user: str | None = None) -> None:
        """Revoke a kernel's tokens (only ``user``'s, when given)."""
        store = self.core.store
        with store.transaction():
            store.revoke_kernel_tokens(kernel_id, user)

    def holder(self, token: str) -> tuple[str, str] | None:
        """The (user, kernel id) a token acts for; ``None``: unknown, revoked, or not
        renewed for longer than ``max_age``."""
        found = self.core.store.kernel_token(_hash(token))
        if found is None:
            return None
        user, kernel_id, renewed = found
        return None if renewed < self.core.clock.now() - self.max_age else (user, kernel_id)

    def renew(self, user: str, kernel_id: str) -> bool:
        """``user``'s tokens of ``kernel_id`` live ``max_age`` from now (their kernel's
        server says it runs); False: it has none that lives."""
        now, store = self.core.clock.now(), self.core.store
        with store.transaction():
            return store.renew_kernel_tokens(user, kernel_id, now, now, now - self.max_age) > 0

    def sweep(self, running: Iterable[tuple[str, str]] = ()) -> int:
        """Renew the tokens of the ``running`` kernels (user, kernel id), each written only
        where its last renewal is older than ``RENEW_EVERY_S``, then delete those past
        their age; how many were deleted."""
        now, store = self.core.clock.now(), self.core.store
        stale, expired = now - min(RENEW_EVERY_S, self.max_age / 10), now - self.max_age
        with store.transaction():
            for user, kernel_id in running:
                store.renew_kernel_tokens(user, kernel_id, now, stale, expired)
            return store.expire_kernel_tokens(expired)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
