"""The demo admin's password: settings.PARLEY_ADMIN_PASSWORD, or one made once and kept in the
data folder."""

import secrets

from django.conf import settings


def admin_password() -> str:
    if settings.PARLEY_ADMIN_PASSWORD:
        return settings.PARLEY_ADMIN_PASSWORD
    path = settings.DATA_DIR / "demo-admin-password"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()
