"""API keys, SGLang's way (``--api-key`` protects generation, ``--admin-api-key`` everything that changes state).

Instances run SGLang's own middleware; the front mounts the same one, and our state-changing routes are marked
``ADMIN_OPTIONAL`` like SGLang's (with an admin key configured only that key opens them; with only an API key, that
key does). The controller and the instances call each other with the admin key of their deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class AuthKeys:
    api_key: str | None = None
    admin_api_key: str | None = None

    @classmethod
    def of(cls, server_args: Any) -> AuthKeys:
        return cls(api_key=server_args.api_key or None, admin_api_key=server_args.admin_api_key or None)

    @property
    def enabled(self) -> bool:
        return bool(self.api_key or self.admin_api_key)

    def admin_headers(self) -> dict[str, str]:
        key = self.admin_api_key or self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def generation_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def admin(endpoint: Callable) -> Callable:
    """Mark a route as state-changing (SGLang's ``ADMIN_OPTIONAL``)."""
    from sglang.srt.utils.auth import AuthLevel, auth_level

    return auth_level(AuthLevel.ADMIN_OPTIONAL)(endpoint)


def mount(app: Any, router: Any) -> None:
    """Add a router's routes to ``app`` at top level. The installed FastAPI keeps an included router as one nested
    node, and SGLang 0.5.23's key middleware reads the auth level from the first top-level route that matches: behind
    ``include_router`` every admin route of ours would fall back to the generation key."""
    app.router.routes.extend(router.routes)


def mark_admin_routes(app: Any, routes: set[tuple[str, str]]) -> None:
    """Mark already-mounted routes (method, path) as admin (for routers mounted from elsewhere)."""
    for route in app.router.routes:
        methods = getattr(route, "methods", None) or set()
        if any((m, getattr(route, "path", "")) in routes for m in methods):
            admin(route.endpoint)


def install(app: Any, keys: AuthKeys) -> None:
    """SGLang's API-key middleware on one of our apps (the front); instances get SGLang's own."""
    if keys.enabled:
        from sglang.srt.utils.auth import add_api_key_middleware

        add_api_key_middleware(app, api_key=keys.api_key, admin_api_key=keys.admin_api_key)
