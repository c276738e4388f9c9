"""API bearer tokens: `tf_<random>` handed out once, stored as sha256, with one scope each.

A token expires (`expires_at`; `DEFAULT_EXPIRES_S`, 90 days, unless created with another
lifetime or none) and can be revoked (`revoked_at`, for good). A worker token may be bound to a
device key: the API lets it register workers of that key only. `check_token` says why a token
is refused, but only to a caller holding the token itself (its hash matches a row): any other
string is just `invalid`, so guessing learns nothing.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import select

from ..core.errors import NotFound, SpecError
from . import tables as m
from .jobs import LOCAL_OWNER
from .store import Store
from .tables import utcnow

DEFAULT_EXPIRES_S = 90 * 86400  # a token's lifetime unless created with another (or none)
MAX_EXPIRES_S = 10 * 365 * 86400
MAX_NAME_CHARS = 64
_UNNAMED_OWNER = re.compile(r"token-[0-9]+", re.IGNORECASE)  # `Principal.owner` of unnamed tokens
_DEVICE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # as api.schemas.DEVICE_KEY_PATTERN


class Scope(StrEnum):
    USER = "user"  # submit and follow jobs, read records, best schedules, spaces
    WORKER = "worker"  # register, heartbeat, post results
    ADMIN = "admin"  # everything

    def allows(self, needed: Scope) -> bool:
        return self is Scope.ADMIN or self is needed


class Refusal(StrEnum):
    """Why a token does not authenticate (`check_token`)."""

    INVALID = "invalid"  # no such token (the only answer a guessed string gets)
    REVOKED = "revoked"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as. A principal is a token *name*: every token of one name is the
    same principal (it owns the same jobs and shares their quotas), so rotating a token (create
    a new one under the name, revoke the old) keeps its jobs. Names are checked at creation
    (`check_name`): never "local" (the embedded CLI's owner) nor `token-<digits>` (the owner of
    unnamed tokens), so no token can pose as another principal."""

    token_id: int
    name: str
    scope: Scope
    device_key: str | None = None  # a bound worker token registers workers of this key only
    expires_at: datetime | None = None

    @property
    def owner(self) -> str:
        """Who owns what this principal creates (jobs): the token's name, so that a renewed
        token of the same name keeps its jobs; an unnamed token owns as `token-<id>`."""
        return self.name or f"token-{self.token_id}"

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or utcnow())


@dataclass(frozen=True)
class TokenInfo:
    """A stored token as `tunefarm token list` and GET /v1/tokens show it: never its secret,
    never its hash."""

    id: int
    name: str
    scope: Scope
    device_key: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: m.Token) -> TokenInfo:
        return cls(id=row.id, name=row.name, scope=Scope(row.scope), device_key=row.device_key,
                   created_at=row.created_at, expires_at=row.expires_at,
                   revoked_at=row.revoked_at)

    @property
    def state(self) -> str:
        """"revoked", "expired" or "active"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= utcnow():
            return "expired"
        return "active"

    def to_dict(self) -> dict[str, Any]:
        def iso(t: datetime | None) -> str | None:
            return t.isoformat() if t else None

        return {"id": self.id, "name": self.name, "scope": self.scope.value,
                "device_key": self.device_key, "created_at": iso(self.created_at),
                "expires_at": iso(self.expires_at), "revoked_at": iso(self.revoked_at),
                "state": self.state}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    """`name` if it may name a principal, else SpecError: at most 64 characters, no control or
    format characters, no surrounding whitespace, and not a reserved owner ("local",
    `token-<digits>`). "" is allowed: the token is then its own principal `token-<id>`."""
    if not isinstance(name, str):
        raise SpecError("must be text", field="name")
    if len(name) > MAX_NAME_CHARS:
        raise SpecError(f"at most {MAX_NAME_CHARS} characters (got {len(name)})", field="name")
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise SpecError("must not contain control or format characters", field="name")
    if name != name.strip():
        raise SpecError("must not begin or end with whitespace", field="name")
    if name.casefold() == LOCAL_OWNER or _UNNAMED_OWNER.fullmatch(name):
        raise SpecError(f"{name!r} is reserved (the owner of the embedded CLI's jobs, or of an "
                        "unnamed token's); choose another name", field="name")
    return name


def _scope(scope: Scope | str) -> Scope:
    try:
        return Scope(scope)
    except ValueError as exc:
        raise SpecError(f"unknown scope {scope!r}; use user, worker or admin",
                        field="scope") from exc


def _expiry(expires_in_s: float | None) -> datetime | None:
    if expires_in_s is None:
        return None
    if (isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int | float)
            or not math.isfinite(expires_in_s) or not 0 < expires_in_s <= MAX_EXPIRES_S):
        raise SpecError(f"a number of seconds in (0, {MAX_EXPIRES_S}] (10 years), or none for "
                        f"a token that never expires; got {expires_in_s!r}",
                        field="expires_in_s")
    return utcnow() + timedelta(seconds=expires_in_s)


_LIFETIME = re.compile(r"([0-9]{1,12})([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_lifetime(text: str) -> int | None:
    """Seconds of a lifetime written `90d`, `12h`, `30m`, `45s` or `3600`; None for `never`."""
    text = text.strip().lower()
    if text == "never":
        return None
    match = _LIFETIME.fullmatch(text)
    seconds = int(match[1]) * _UNIT_S[match[2]] if match else 0
    if not 0 < seconds <= MAX_EXPIRES_S:
        raise SpecError(f"expected a lifetime such as 90d, 12h, 30m or 45s (at most 10 years), "
                        f"or 'never'; got {text!r}", field="expires-in")
    return seconds


def _device_key(scope: Scope, device_key: str | None) -> str | None:
    if device_key is None:
        return None
    if scope is not Scope.WORKER:
        raise SpecError(f"only worker tokens are bound to a device key (scope is {scope})",
                        field="device_key")
    if not isinstance(device_key, str) or not _DEVICE_KEY.fullmatch(device_key):
        raise SpecError("a device key is 1-64 letters, digits, '.', '_' or '-', starting with a "
                        f"letter or digit; got {device_key!r}", field="device_key")
    return device_key


def mint_token(store: Store, scope: Scope | str, name: str = "", *,
               expires_in_s: float | None = DEFAULT_EXPIRES_S,
               device_key: str | None = None) -> tuple[str, TokenInfo]:
    """A new token and its record; the plaintext is returned once and never stored.
    `expires_in_s=None`: it never expires. `device_key` binds a worker token to that key."""
    scope = _scope(scope)
    row = m.Token(name=check_name(name), scope=scope.value, created_at=utcnow(),
                  expires_at=_expiry(expires_in_s), device_key=_device_key(scope, device_key))
    token = "tf_" + secrets.token_urlsafe(32)
    row.token_hash = hash_token(token)
    with store.session() as s:
        s.add(row)
        s.flush()
        info = TokenInfo.from_row(row)
    return token, info


def create_token(store: Store, scope: Scope | str, name: str = "", *,
                 expires_in_s: float | None = DEFAULT_EXPIRES_S,
                 device_key: str | None = None) -> str:
    """A new token of `scope` (see `mint_token`); the plaintext is returned once."""
    return mint_token(store, scope, name, expires_in_s=expires_in_s, device_key=device_key)[0]


def check_token(store: Store, token: str) -> Principal | Refusal:
    """The principal of a valid token, else why not: revoked or expired for a token whose hash
    is stored, invalid for anything else."""
    with store.session() as s:
        row = s.scalar(select(m.Token).where(m.Token.token_hash == hash_token(token)))
        if row is None:
            return Refusal.INVALID
        if row.revoked_at is not None:
            return Refusal.REVOKED
        principal = Principal(row.id, row.name, Scope(row.scope), device_key=row.device_key,
                              expires_at=row.expires_at)
    return Refusal.EXPIRED if principal.expired() else principal


def verify_token(store: Store, token: str) -> Principal | None:
    """The principal of a valid (unrevoked, unexpired) token, else None."""
    found = check_token(store, token)
    return found if isinstance(found, Principal) else None


def list_tokens(store: Store) -> list[TokenInfo]:
    """Every token, revoked and expired ones included, newest first."""
    with store.session() as s:
        rows = s.scalars(select(m.Token).order_by(m.Token.id.desc())).all()
        return [TokenInfo.from_row(r) for r in rows]


def revoke_token(store: Store, token_id: int) -> TokenInfo:
    """Revoke token `token_id` for good (again: a no-op keeping the first revocation time);
    NotFound if there is no such token."""
    with store.session() as s:
        row = s.get(m.Token, token_id) if 0 < token_id < 2**31 else None
        if row is None:
            raise NotFound(f"no token {token_id}")
        row.revoked_at = row.revoked_at or utcnow()
        s.flush()
        return TokenInfo.from_row(row)


def revoke_by_name(store: Store, name: str) -> list[TokenInfo]:
    """Revoke every unrevoked token named `name` (the whole principal); NotFound if none."""
    if not name:
        raise SpecError("a name is required (unnamed tokens are revoked by id)", field="name")
    with store.session() as s:
        rows = s.scalars(select(m.Token).where(m.Token.name == name,
                                               m.Token.revoked_at.is_(None))).all()
        if not rows:
            raise NotFound(f"no unrevoked token named {name!r}")
        now = utcnow()
        for row in rows:
            row.revoked_at = now
        s.flush()
        return [TokenInfo.from_row(r) for r in rows]
