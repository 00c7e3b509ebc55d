"""A stand-in for the Hugging Face hub's auth-check endpoint, served over HTTP so the real
huggingface_hub client asks it (HfApi(endpoint=...).auth_check). The answers follow the hub's: 200
when the token may read the repository, 403 with X-Error-Code GatedRepo for a gated one it may not,
404 with X-Error-Code RepoNotFound for a missing or someone else's private one (huggingface_hub
utils/_http.py hf_raise_for_status turns these codes into GatedRepoError and
RepositoryNotFoundError)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hub(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.public: set[str] = set()
        self.open = False  # True: every repository not gated is public
        self.gated: dict[str, set[str]] = {}  # repo -> tokens granted access
        self.tokens_seen: list[str | None] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def api(self) -> Any:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint)


class _Handler(BaseHTTPRequestHandler):
    server: Hub

    def do_GET(self) -> None:
        prefix, suffix = "/api/models/", "/auth-check"
        if not (self.path.startswith(prefix) and self.path.endswith(suffix)):
            return self._send(404, "Entry not found", "EntryNotFound")
        repo = self.path[len(prefix) : -len(suffix)]
        auth = self.headers.get("authorization") or ""
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        self.server.tokens_seen.append(token)
        if repo in self.server.public or (self.server.open and repo not in self.server.gated):
            return self._send(200, "{}", None)
        if repo in self.server.gated:
            if token in self.server.gated[repo]:
                return self._send(200, "{}", None)
            return self._send(403, "Access to model is restricted", "GatedRepo")
        return self._send(404, "Repository not found", "RepoNotFound")

    def _send(self, status: int, body: str, code: str | None) -> None:
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", body)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        return None


@contextmanager
def serve() -> Iterator[Hub]:
    """The stub, with huggingface_hub's offline mode (HF_HUB_OFFLINE, which the tests set so nothing
    reaches the real hub) lifted while it serves: its requests go to this local endpoint only."""
    from huggingface_hub import constants

    hub = Hub()
    thread = threading.Thread(target=hub.serve_forever, daemon=True)
    thread.start()
    offline, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, False
    try:
        yield hub
    finally:
        constants.HF_HUB_OFFLINE = offline
        hub.shutdown()
        hub.server_close()
