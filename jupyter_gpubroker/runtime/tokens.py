"""Kernel tokens: secrets that act for one user on one kernel's requests only.

Only a token's sha256 is kept, in the state file, so a token outlives a restart of
the broker until its kernel's tokens are revoked, and a copy of the file gives none.
"""

from __future__ import annotations

import hashlib
import secrets

from ..broker.core import Broker

PREFIX = "gpb_"


class KernelTokens:
    def __init__(self, core: Broker) -> None:
        self.core = core

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
        """The (user, kernel id) a token acts for; ``None``: unknown or revoked."""
        return self.core.store.kernel_token(_hash(token))


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
