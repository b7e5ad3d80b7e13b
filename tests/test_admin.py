"""Status inspection: the snapshot, the admin endpoint, metrics, and its security."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from conftest import ask, console_text
from prometheus_client.parser import text_string_to_metric_families

from autoresponse.actors import Runtime
from autoresponse import Application
from autoresponse.supervisors import snapshot
from autoresponse.admin import AdminServer
from autoresponse.app import names_in
from autoresponse.config import AdminSettings

MakeApp = Callable[..., Application]
ADMIN = {"enabled": True, "host": "127.0.0.1", "port": 0}


def call(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def admin_url(app: Application) -> str:
    assert app.admin is not None
    return app.admin.url


def test_the_snapshot_lists_every_actor_in_its_tree(make_app: MakeApp) -> None:
    app = make_app()
    status = snapshot(app.runtime)
    [root] = status.tree
    assert root.name == "root" and root.kind == "supervisor"
    assert [c.name for c in root.children] == ["pipeline", "retry", "interfaces"]
    listed = [n.name for n in root.walk()]
    assert sorted(listed) == sorted(names_in(app.tree()))
    llm = status.find("llm")
    assert llm is not None and (llm.kind, llm.state, llm.restarts) == ("worker", "running", 0)


def test_status_counts_restarts_caused_through_inject(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    for n in range(2):
        code, body = call(f"{url}/inject/llm?type=Crash", "POST", {"reason": f"drill {n}"})
        assert code == 202, body
    ask(app, "run echo still-serving")
    assert "still-serving" in console_text(app)
    code, body = call(f"{url}/status")
    llm = next(n for n in _walk(json.loads(body)["tree"]) if n["name"] == "llm")
    assert llm["restarts"] == 2
    assert llm["last_failure"]["type"] == "CrashRequested"
    assert llm["last_failure"]["message"] == "drill 1"


def _walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for n in nodes for x in [n, *_walk(n["children"])]]


def test_inject_validates_against_the_actors_messages(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    code, body = call(f"{url}/inject/interface.console", "POST", {"text": "run echo injected"})
    assert code == 202 and json.loads(body)["type"] == "ConsoleInput"
    assert app.runtime.wait_idle(json.loads(body)["correlation_id"], timeout=10)
    assert "injected" in console_text(app)

    code, body = call(f"{url}/inject/interface.console", "POST", {"txt": "typo"})
    assert code == 422
    assert "text: Field required" in json.loads(body)["problems"]["ConsoleInput"]
    code, body = call(f"{url}/inject/nobody", "POST", {})
    assert code == 404 and "no actor named 'nobody'" in body
    code, body = call(f"{url}/inject/llm?type=Nonsense", "POST", {})
    assert code == 400 and "UserRequest" in json.loads(body)["accepts"]


def test_metrics_parse_and_count_what_happened(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    ask(app, "run echo measured")
    app.runtime.send("dispatcher", "not a reply")  # one dead letter
    assert app.runtime.wait_idle(timeout=10)
    call(f"{url}/inject/builder?type=Crash", "POST", {})
    assert app.runtime.wait_idle(timeout=10)
    code, text = call(f"{url}/metrics")
    assert code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("autoresponse_messages_processed_total", (("actor", "llm"),))] >= 2
    assert samples[("autoresponse_deliveries_total", (("interface", "console"),))] == 1
    assert samples[("autoresponse_dead_letters_total", (("reason", "no handler"),))] == 1
    assert samples[("autoresponse_restarts_total", (("actor", "builder"),))] == 1
    assert ("autoresponse_in_flight", ()) in samples


def test_dead_letters_are_listed_and_replayed(make_app: MakeApp) -> None:
    app = make_app(admin=ADMIN)
    url = admin_url(app)
    app.runtime.send("dispatcher", "junk")
    assert app.runtime.wait_idle(timeout=10)
    code, body = call(f"{url}/deadletters")
    data = json.loads(body)
    assert data["counts"] == {"no handler": 1}
    [letter] = data["letters"]
    code, body = call(f"{url}/deadletters/{letter['id']}/replay", "POST", {})
    assert code == 202 and json.loads(body)["attempt"] == 2
    assert app.runtime.wait_idle(timeout=10)
    assert app.runtime.dead_letters.counts() == {"no handler": 2}
    code, _ = call(f"{url}/deadletters/999/replay", "POST", {})
    assert code == 404


def test_binding_outside_loopback_needs_a_token() -> None:
    rt = Runtime().start()
    try:
        with pytest.raises(ValueError, match="only with a token"):
            AdminServer(rt, AdminSettings(host="0.0.0.0", port=0))
    finally:
        rt.stop()


def test_with_a_token_every_request_must_carry_it() -> None:
    token = "admin-token-that-must-stay-secret"
    rt = Runtime().start()
    try:
        server = AdminServer(rt, AdminSettings(host="0.0.0.0", port=0, token=token))
        server.start()
        url = f"http://127.0.0.1:{server.port}"
        for path in ("/status", "/metrics", "/deadletters", "/healthz"):
            code, body = call(url + path)
            assert code == 401 and token not in body
            assert call(url + path, token="wrong")[0] == 401
            assert call(url + path, token=token)[0] == 200
        assert call(f"{url}/inject/x", "POST", {}, token="wrong")[0] == 401
    finally:
        rt.stop()
