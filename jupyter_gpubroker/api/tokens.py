"""Kernel tokens' rules: a user's own, issued, renewed and revoked only with the user's
credential, never a kernel token's (``runtime.tokens`` keeps them).

A token lives ``c.GPUBroker.kernel_token_max_age`` past its last renewal, and only its
kernel's server renews it: the embedded broker's tick for the kernels its server runs, a
renewal of the kernel's lease or request with the user's credential, or ``renew_tokens``
(the kernel provisioner of a server that uses a central broker). Its own use renews
nothing, so a leaked token, used, still ends.
"""

from __future__ import annotations

import re
from typing import Any

from ..wire.errors import Forbidden, InvalidRequest, NotFound
from .base import Rules
from .identity import Identity
from .parse import only

KERNEL_ID = re.compile(r"[A-Za-z0-9-]{1,64}")


class TokenRules(Rules):
    """Issue, renew and revoke kernel tokens; what renews them besides."""

    @staticmethod
    def _require_user(who: Identity) -> None:
        if who.kernel_id is not None:
            raise Forbidden("a kernel token cannot issue, renew or revoke tokens")

    def issue_token(self, who: Identity, body: dict[str, Any]) -> dict[str, Any]:
        """A kernel-scoped token of ``who`` for one of its kernels; the reply names the
        user it acts for, whom its kernel's requests are charged to, and how long it lives
        without a renewal (``max_age_s``)."""
        self._require_user(who)
        only(body, {"kernel_id"})
        kernel_id = body.get("kernel_id")
        if not isinstance(kernel_id, str) or not KERNEL_ID.fullmatch(kernel_id):
            raise InvalidRequest("'kernel_id' must be a kernel id (letters, digits, '-')")
        token = self.runtime.issue_token(who.user, kernel_id)
        max_age = self.runtime.tokens.max_age
        return {"token": token, "user": who.user, "kernel_id": kernel_id, "max_age_s": max_age}

    def renew_tokens(self, who: Identity, kernel_id: str) -> None:
        """The kernel's server says it runs: ``who``'s tokens for it live another maximum
        age (404: none lives, revoked or ended)."""
        self._require_user(who)
        if not self.runtime.tokens.renew(who.user, kernel_id):
            raise NotFound(f"{who.user} has no live token for kernel {kernel_id}")

    def revoke_tokens(self, who: Identity, kernel_id: str) -> None:
        self._require_user(who)
        self.runtime.revoke_tokens(kernel_id, who.user)

    def _kernel_lives(self, who: Identity, user: str, holder: str) -> None:
        """A renewal with the user's own credential (a server's, not a kernel token's)
        says the holding kernel runs: its tokens live on."""
        if who.kernel_id is None:
            self.runtime.tokens.sweep([(user, holder)])
