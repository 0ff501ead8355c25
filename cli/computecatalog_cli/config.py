"""Where `cc login` keeps the server and the token: one JSON file readable by its owner only (0600), in
$CC_CONFIG, else $XDG_CONFIG_HOME/computecatalog/config.json, else ~/.config/computecatalog/config.json.
CC_SERVER and CC_TOKEN, when set, take the place of what the file says (CI jobs pass them so)."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

FILE_MODE = 0o600


@dataclass(frozen=True)
class Settings:
    server: str | None
    token: str | None


def config_path() -> Path:
    if os.environ.get("CC_CONFIG"):
        return Path(os.environ["CC_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "computecatalog" / "config.json"


def settings_load() -> Settings:
    path = config_path()
    stored = json.loads(path.read_text()) if path.exists() else {}
    return Settings(
        server=os.environ.get("CC_SERVER") or stored.get("server"),
        token=os.environ.get("CC_TOKEN") or stored.get("token"),
    )


def settings_save(settings: Settings) -> Path:
    """Written through a file created 0600 (never world-readable, not even for a moment), then renamed over."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_suffix(".tmp")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(descriptor, "w") as file:
        json.dump({"server": settings.server, "token": settings.token}, file)
    os.replace(partial, path)
    return path
