"""Which lease stores are there, and which one does a setting name?

One table, a setting's form to a lazy builder (the store's module is imported only when it is
used), and the check `ControllerConfig(leases=...)` applies. A row is a store's name (`"local"`:
that exact text) or a URL scheme (`"SCHEME://"`: any URL of that scheme, the builder given the
whole text). A new store is a module beside the others and one row here; the controller and the
CLI name stores only through this table. A setting is shown (an error, a repr) by `shown`: a
URL without its password.

| `leases=` | the store | slots shared with |
|---|---|---|
| `None` | none | nobody: the controller's own slots |
| `"local"` | `local.LocalStore`: the per-user slot server | every mpvisor process of this user on this host |
| `"postgresql://USER@HOST/DB"` | `postgres.PostgresStore`: two tables in that database | every mpvisor process that names it, on any host |
| a `LeaseStore` object (e.g. `memory.MemoryStore()`) | that store | whoever is given the same store |
"""

from __future__ import annotations

from collections.abc import Callable

from mpvisor._admission.leases.store import DEFAULT_LEASE_TTL, LeaseStore
from mpvisor._model.errors import ConfigError


def _local(setting: str, ttl: float) -> LeaseStore:
    from mpvisor._admission.leases.local import LocalStore

    return LocalStore()


def _postgres(setting: str, ttl: float) -> LeaseStore:
    from mpvisor._admission.leases.postgres import PostgresStore

    return PostgresStore(setting, ttl)


STORES: dict[str, Callable[[str, float], LeaseStore]] = {
    "local": _local,
    "postgresql://": _postgres,
    "postgres://": _postgres,
}


def _name(setting: str) -> str:
    """The row a setting names: the setting itself, or for a URL its `"SCHEME://"`."""
    scheme, sep, _ = setting.partition("://")
    return scheme + sep if sep else setting


def is_store_url(setting: str) -> bool:
    """`setting` is a URL whose scheme names a store (`postgresql://...`)."""
    return "://" in setting and _name(setting) in STORES


def url_problem(setting: str) -> str | None:
    """What makes a store's URL `setting` read otherwise than as written (`postgres.url_problem`:
    an `@`, `/` or `?` of a password not percent-encoded), shown without its password; None
    when there is nothing (or `setting` names no store of a URL). The one check of `--slots`,
    `$MPVISOR_SLOTS`, a file's `slots` and `leases=`, before anything connects."""
    if _name(setting) not in ("postgresql://", "postgres://"):
        return None
    from mpvisor._admission.leases.postgres import url_problem as problem

    return problem(setting)


def shown(value: object) -> str:
    """`repr(value)`, as a message or a repr shows a setting: a URL without its password (in
    any form it was given, or in a keyword/value string or a malformed URL: `postgres.concealed`)."""
    if isinstance(value, str):
        from mpvisor._admission.leases.postgres import concealed

        return repr(concealed(value))
    return repr(value)


def checked(value: object) -> str | LeaseStore | None:
    """`value` if it names a store (or is one), else `ConfigError` naming it (`shown`); a URL
    that would read otherwise than as written too (`url_problem`)."""
    if isinstance(value, str) and (problem := url_problem(value)) is not None:
        raise ConfigError(f"leases: {problem}")
    if value is None or (isinstance(value, str) and _name(value) in STORES):
        return value
    if not isinstance(value, str) and all(callable(getattr(value, m, None)) for m in ("request", "holdings")):
        return value  # type: ignore[return-value]
    names = ", ".join(repr(name) for name in STORES)
    raise ConfigError(f"leases must be None, one of {names}, or a lease store, got {shown(value)}")


def open_store(value: str | LeaseStore, ttl: float = DEFAULT_LEASE_TTL) -> LeaseStore:
    """The store `value` names (or `value` itself); `ttl`: how long its leases live past a
    renewal, for a store whose leases expire."""
    return STORES[_name(value)](value, ttl) if isinstance(value, str) else value
