"""Typed readers for settings that come from the environment."""

import json
import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_secret(name: str) -> str:
    """A secret by reference: the content of the file `<name>_FILE` names (a mounted secret), else `<name>` itself."""
    path = os.environ.get(f"{name}_FILE", "").strip()
    if path:
        try:
            with open(path, encoding="utf-8") as secret:
                return secret.read().strip()
        except OSError as unreadable:
            raise ImproperlyConfigured(f"{name}_FILE names {path!r}, which cannot be read: {unreadable}") from None
    return os.environ.get(name, "")


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _parsed(name: str, default, parse, kind: str):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be {kind}, got {raw!r}") from exc


def env_int(name: str, default: int) -> int:
    return _parsed(name, default, int, "an integer")


def env_float(name: str, default: float) -> float:
    return _parsed(name, default, float, "a number")


def env_json(name: str, default):
    return _parsed(name, default, json.loads, "JSON")


def database_url(database: dict) -> str:
    """A DATABASE_URL naming this Django database (settings.DATABASES entry), for subprocesses that must use the same
    one (a test run's test database included)."""
    if database["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{database['NAME']}"
    credentials = database["USER"] + (f":{database['PASSWORD']}" if database.get("PASSWORD") else "")
    return f"postgres://{credentials}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}"
