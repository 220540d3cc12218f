"""Roles granted in the ledger: `grant_role`, `revoke_role`, `grants`.

The ledger's owner holds every role (`CoreBase._roles`); anyone else holds what was granted
to them. Only the owner or a holder of `ledger.admin` changes grants, and every change is
audited. An unknown role is InvalidInput, so a typo cannot grant nothing silently.
"""

from __future__ import annotations

from execkit._errors import Forbidden, InvalidInput
from execkit.ledger._core.base import CoreBase
from execkit.ledger._core.inputs import MAX_KEY, as_actor, check_name, moment
from execkit.ledger._core.store import Tx
from execkit.ledger._model import ADMIN_ROLE, KNOWN_ROLES, Actor, AuditAction, AuditEntry, Grant

__all__ = ["RoleOps"]


class RoleOps(CoreBase):
    """Granting, revoking and listing roles."""

    def _check_role_change(self, tx: Tx, who: Actor, role: object) -> None:
        if role not in KNOWN_ROLES:
            raise InvalidInput(
                f"role must be one of {', '.join(sorted(KNOWN_ROLES))}, got {role!r}",
                field="role",
            )
        if ADMIN_ROLE not in self._roles(tx, who):
            raise Forbidden(
                f"changing roles needs the ledger's owner ({self._store.owner() or 'unknown'}) "
                f"or the role {ADMIN_ROLE}; {who.name} has neither"
            )

    def grant_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> Grant:
        """Grant `role` to `principal` (idempotent: an existing grant is returned).

        Only the ledger's owner or a holder of `ledger.admin` may; Forbidden otherwise.
        """
        principal = check_name("principal", principal, MAX_KEY)
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            self._check_role_change(tx, who, role)
            grant = Grant(principal=principal, role=role, granted_by=str(who), granted_at=at)
            if not tx.put_grant(grant):
                return next(g for g in tx.grants(principal) if g.role == role)
            tx.audit(
                AuditEntry(
                    at=at,
                    actor=str(who),
                    action=AuditAction.ROLE_GRANT,
                    detail={"principal": principal, "role": role},
                )
            )
            return grant

    def revoke_role(
        self, principal: str, role: str, *, actor: Actor | str, now: float | None = None
    ) -> bool:
        """Revoke a grant; True when there was one. Same authority as `grant_role`."""
        principal = check_name("principal", principal, MAX_KEY)
        who = as_actor(actor)
        at = moment(now)
        with self._store.write() as tx:
            self._check_role_change(tx, who, role)
            removed = tx.delete_grant(principal, role)
            if removed:
                detail = {"principal": principal, "role": role}
                tx.audit(
                    AuditEntry(at=at, actor=str(who), action=AuditAction.ROLE_REVOKE, detail=detail)
                )
            return removed

    def grants(self, principal: str | None = None) -> list[Grant]:
        """Every grant (or one principal's), sorted by principal then role."""
        with self._store.read() as tx:
            return tx.grants(principal)
