"""The demo admin's password: PARLEY_ADMIN_PASSWORD, or one made once and kept in the data folder."""

import os
import secrets

from agents.paths import data_dir


def admin_password() -> str:
    if os.environ.get("PARLEY_ADMIN_PASSWORD"):
        return os.environ["PARLEY_ADMIN_PASSWORD"]
    path = data_dir() / "demo-admin-password"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()
