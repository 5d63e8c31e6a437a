"""parley's production settings, as the load bench's uvicorn workers run them.

The bench talks plain http to the workers on one machine (no TLS proxy in front), so the
cookies cannot be Secure-only and http is not redirected; nothing else differs.
"""

from parley.settings import *  # noqa: F403

SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = False
SECURE_SSL_REDIRECT = False
