"""API bearer tokens: `tf_<random>` handed out once, stored as sha256, with one scope each."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import select

from ..errors import NotFound, SpecError
from . import models as m
from .models import utcnow
from .store import Store


class Scope(StrEnum):
    USER = "user"  # submit and follow jobs, read records, best schedules, spaces
    WORKER = "worker"  # register, heartbeat, post results
    ADMIN = "admin"  # everything

    def allows(self, needed: Scope) -> bool:
        return self is Scope.ADMIN or self is needed


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    scope: Scope


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(store: Store, scope: Scope | str, name: str = "") -> str:
    """A new token of `scope`; the plaintext is returned once and never stored."""
    try:
        scope = Scope(scope)
    except ValueError as exc:
        raise SpecError(f"unknown scope {scope!r}; use user, worker or admin", field="scope") from exc
    token = "tf_" + secrets.token_urlsafe(32)
    with store.session() as s:
        s.add(m.Token(name=name, scope=scope.value, token_hash=hash_token(token),
                      created_at=utcnow()))
    return token


def verify_token(store: Store, token: str) -> Principal | None:
    """The principal of a valid, unrevoked token, else None."""
    with store.session() as s:
        row = s.scalar(select(m.Token).where(m.Token.token_hash == hash_token(token),
                                             m.Token.revoked_at.is_(None)))
        return Principal(row.id, row.name, Scope(row.scope)) if row else None


def revoke_token(store: Store, token_id: int) -> None:
    with store.session() as s:
        row = s.get(m.Token, token_id)
        if row is None:
            raise NotFound(f"no token {token_id}")
        row.revoked_at = row.revoked_at or utcnow()
