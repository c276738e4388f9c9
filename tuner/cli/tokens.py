"""`tunefarm token create|list|revoke`, and the tokens `tunefarm up` keeps under the data
directory (`token`, `worker-token`, mode 0600) and reuses while they are valid."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tuner.cli.common import DbOpt, console, err, fail, open_store
from tuner.core.config import get_settings, private_dir
from tuner.core.errors import TunefarmError

if TYPE_CHECKING:
    from tuner.db.store import Store


def token_file() -> Path:
    return get_settings().data_dir / "token"


UP_TOKEN_NAMES = {"user": "tunefarm up", "worker": "tunefarm up worker"}
UP_MIN_LIFE_S = 86400.0  # a saved token expiring sooner than this is replaced


def _write_secret(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only (mode 0600 from its first byte on), in a
    directory of its owner's (0700)."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _saved_token(store: Store, path: Path, scope: str, device_key: str | None) -> str | None:
    """The token saved at `path` if it still authenticates with `scope` (and `device_key`),
    for a day more at least."""
    from datetime import timedelta

    from tuner.db.tables import utcnow
    from tuner.db.tokens import Principal, check_token

    try:
        tok = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    found = check_token(store, tok) if tok else None
    if (not isinstance(found, Principal) or found.scope != scope
            or found.device_key != device_key
            or found.expired(utcnow() + timedelta(seconds=UP_MIN_LIFE_S))):
        return None
    return tok


def up_tokens(store: Store, data_dir: Path, device_key: str | None = None
              ) -> tuple[dict[str, str], bool]:
    """The user and worker tokens of `tunefarm up`, saved in `data_dir` (`token`,
    `worker-token`, mode 0600): the saved ones while they authenticate (unrevoked, unexpired,
    their scope; the worker's bound to `device_key`), else new ones. ({scope: token}, reused)."""
    from tuner.db.tokens import create_token

    toks: dict[str, str] = {}
    reused = True
    for scope, fname in (("user", "token"), ("worker", "worker-token")):
        bound = device_key if scope == "worker" else None
        path = data_dir / fname
        tok = _saved_token(store, path, scope, bound)
        if tok is None:
            tok, reused = create_token(store, scope, UP_TOKEN_NAMES[scope], device_key=bound), False
        _write_secret(path, tok + "\n")
        toks[scope] = tok
    return toks, reused


def token_create(
    scope: Annotated[str, typer.Option(help="user (jobs, best, spaces), worker (register, "
                                            "heartbeat, results) or admin (everything).")] = "user",
    name: Annotated[str, typer.Option(
        help="The principal: tokens of one name own the same jobs (rotate a token by creating "
             "a new one under its name, then revoking the old).")] = "",
    expires_in: Annotated[str, typer.Option(
        "--expires-in", help="Lifetime: 90d, 12h, 30m, 45s, or 'never'.")] = "90d",
    device_key: Annotated[str | None, typer.Option(
        help="Worker tokens: the only device key its workers may register for.")] = None,
    db: DbOpt = None,
) -> None:
    """Create an API token; it is printed once, alone on the last line."""
    from tuner.db.tokens import mint_token, parse_lifetime

    try:
        tok, info = mint_token(open_store(db), scope, name, expires_in_s=parse_lifetime(expires_in),
                               device_key=device_key)
    except TunefarmError as exc:
        fail(exc)
    until = f"expires {info.expires_at:%Y-%m-%d %H:%M} UTC" if info.expires_at else "never expires"
    err.print(f"created {info.scope} token {info.id}{f' {name!r}' if name else ''} ({until}); "
              "store it now, it is not shown again:", highlight=False)
    sys.stdout.write(tok + "\n")


def token_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print the tokens as JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """List API tokens, newest first (never their secrets)."""
    from rich.table import Table

    from tuner.db.tokens import list_tokens

    try:
        infos = list_tokens(open_store(db))
    except TunefarmError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps([t.to_dict() for t in infos], indent=2) + "\n")
        return
    table = Table("id", "name", "scope", "device key", "created", "expires", "revoked", "state")
    when = "{:%Y-%m-%d %H:%M}".format
    for t in infos:
        table.add_row(str(t.id), t.name or "-", t.scope, t.device_key or "-", when(t.created_at),
                      when(t.expires_at) if t.expires_at else "never",
                      when(t.revoked_at) if t.revoked_at else "-", t.state)
    console.print(table)


def token_revoke(
    token_id: Annotated[int | None, typer.Argument(help="The token's id (`token list`).")] = None,
    name: Annotated[str | None, typer.Option(
        help="Revoke every unrevoked token of this name instead.")] = None,
    db: DbOpt = None,
) -> None:
    """Revoke a token by id, or all of a name; every API process refuses it within 1 s."""
    from tuner.db.tokens import revoke_by_name, revoke_token

    if (token_id is None) == (name is None):
        fail(TunefarmError("name one token id, or --name (not both)"))
    try:
        store = open_store(db)
        infos = [revoke_token(store, token_id)] if token_id is not None else \
            revoke_by_name(store, name or "")
    except TunefarmError as exc:
        fail(exc)
    for t in infos:
        console.print(f"revoked token {t.id} ({t.scope}{f' {t.name!r}' if t.name else ''}) at "
                      f"{t.revoked_at:%Y-%m-%d %H:%M:%S} UTC", highlight=False)
