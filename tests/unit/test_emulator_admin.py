"""The emulator's admin routes answer loopback clients, or the admin token, nobody else."""

from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from specregen.cli.emulator import is_loopback_host
from specregen.emulator.app import ADMIN_TOKEN_ENV, create_app
from specregen.emulator.config import EmulatorConfig
from specregen.emulator.server import serve_in_thread
from tests.support import get_tokenizer


def remote_client(app) -> TestClient:
    # A client from another machine (TestClient lets us pick the peer address).
    return TestClient(app, client=("203.0.113.7", 50000))


def test_admin_routes_refuse_a_remote_client_without_the_token(monkeypatch):
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    app = create_app(EmulatorConfig(), get_tokenizer("mini"))
    with remote_client(app) as client:
        assert client.post("/_emulator/reset").status_code == 403
        refused = client.get("/_emulator/stats")
        assert refused.status_code == 403 and ADMIN_TOKEN_ENV in refused.text
        # A token header means nothing while the server has none.
        assert client.get("/_emulator/stats",
                          headers={"X-Emulator-Token": "guess"}).status_code == 403


def test_admin_routes_answer_the_right_token_only(monkeypatch):
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "s3cret-admin")
    app = create_app(EmulatorConfig(), get_tokenizer("mini"))
    with remote_client(app) as client:
        ok = client.get("/_emulator/stats", headers={"X-Emulator-Token": "s3cret-admin"})
        assert ok.status_code == 200 and "chat_requests" in ok.json()
        assert client.post("/_emulator/reset",
                           headers={"X-Emulator-Token": "wrong"}).status_code == 403


def test_admin_routes_answer_a_loopback_client(monkeypatch):
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    with serve_in_thread(EmulatorConfig(), get_tokenizer("mini")) as emu:
        assert httpx.get(f"{emu.base_url}/_emulator/stats").status_code == 200
        assert httpx.post(f"{emu.base_url}/_emulator/reset").status_code == 200


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("127.3.4.5", True), ("0.0.0.0", False), ("::", False), ("192.168.1.4", False),
    ("myhost.example", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback
