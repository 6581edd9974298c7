"""The web app through Flask's test client, on a real (in-process) dispatcher without agents: login,
CSRF, and the dispatcher's own errors placed next to the form's fields."""

from __future__ import annotations

import html
import json
import re

from flask.testing import FlaskClient
from web_helpers import PASSWORD, USERNAME


def token_of(page: str) -> str:
    """The CSRF token of a rendered form."""
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def field_errors(page: str) -> dict[str, str]:
    """input name -> error text shown under it."""
    import html

    return {
        name: html.unescape(text)
        for name, text in re.findall(r'<span class="field-error" id="err-([^"]+)">([^<]+)</span>', page)
    }


def test_every_page_but_login_requires_login(client: FlaskClient):
    for path in ("/", "/agents/", "/traces/", "/traces/new", "/traces/yaml", "/traces/x/results"):
        response = client.get(path)
        assert response.status_code == 302, path
        assert "/login" in response.headers["Location"], path
    assert client.get("/traces/x/results.json").status_code == 401
    assert client.get("/login").status_code == 200
    assert client.get("/static/app.css").status_code == 200


def test_login_checks_the_password_and_returns_to_the_page_asked_for(client: FlaskClient):
    token = token_of(client.get("/login").text)
    wrong = client.post("/login", data={"username": USERNAME, "password": "nope", "csrf_token": token})
    assert wrong.status_code == 401 and "Wrong username or password" in wrong.text
    unknown = client.post("/login", data={"username": "mallory", "password": PASSWORD, "csrf_token": token})
    assert unknown.status_code == 401
    good = client.post(
        "/login?next=/agents/", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token}
    )
    assert good.status_code == 302 and good.headers["Location"] == "/agents/"
    assert client.get("/agents/").status_code == 200
    # An absolute URL as `next` is not followed (no open redirect).
    client.get("/login")
    token = token_of(client.get("/login").text)
    outside = client.post(
        "/login?next=https://evil.example/",
        data={"username": USERNAME, "password": PASSWORD, "csrf_token": token},
    )
    assert outside.headers["Location"] == "/"


def test_posts_without_the_sessions_csrf_token_are_refused(client: FlaskClient, login):
    no_token = client.post("/login", data={"username": USERNAME, "password": PASSWORD})
    assert no_token.status_code == 400
    login()
    page = client.get("/traces/new").text
    form = {"name": "t", "hops-0-name": "h", "action": "validate"}
    assert client.post("/traces/new", data=form).status_code == 400
    assert client.post("/traces/new", data={**form, "csrf_token": "forged"}).status_code == 400
    assert client.post("/traces/t/delete").status_code == 400
    assert client.post("/traces/validate.json", data=form).status_code == 400
    assert client.post("/logout").status_code == 400
    assert client.post("/traces/new", data={**form, "csrf_token": token_of(page)}).status_code == 422


def test_form_shows_the_dispatchers_field_errors_next_to_the_fields(client: FlaskClient, login):
    login()
    token = token_of(client.get("/traces/new").text)
    response = client.post(
        "/traces/new",
        data={
            "csrf_token": token,
            "action": "validate",
            "name": "Bad_Name",
            "protocol": "udp",
            "dst": "198.18.2.2/8",
            "dst_port": "eleven",
            "hops-0-name": "a-out",
            "hops-0-node": "host-a",
            "hops-0-at": "tc-egress",
            "hops-0-dev": "eth0",
            # an empty row in between is dropped: the next hop is hops[1]
            "hops-2-name": "b-in",
            "hops-2-node": "host-b",
            "hops-2-at": "xdp",
        },
    )
    assert response.status_code == 422
    errors = field_errors(response.text)
    assert errors["dst_port"].startswith("must be an integer")
    assert "must match [a-z0-9-]+" in errors["name"]
    assert "has host bits set" in errors["dst"]
    assert errors["hops-0-node"] == "node 'host-a' is not registered (registered: none)"
    assert errors["hops-1-dev"] == "required for xdp hops: the device to attach to"
    # The rows are re-rendered compacted, with their values kept.
    assert 'name="hops-1-name" value="b-in"' in response.text


def test_inline_validation_endpoint_names_the_inputs_of_the_request(client: FlaskClient, login):
    login()
    token = token_of(client.get("/traces/new").text)
    response = client.post(
        "/traces/validate.json",
        data={
            "name": "ok",
            "protocol": "udp",
            "hops-5-name": "x",
            "hops-5-node": "n",
            "hops-5-at": "tc-egress",
        },
        headers={"X-CSRF-Token": token},
    )
    assert response.status_code == 200
    by_input = {error["input"]: error["reason"] for error in response.json["errors"]}
    assert by_input["hops-5-dev"] == "required for tc-egress hops: the device to attach to"
    assert "not registered" in by_input["hops-5-node"]
    assert response.json["valid"] is False


def test_yaml_editor_reports_the_line_of_an_error(client: FlaskClient, login):
    login()
    token = token_of(client.get("/traces/yaml").text)
    text = "name: y\nsample: 0\nhops:\n  - {name: a, node: n, at: tc-egress, dev: eth0, colour: red}\n"
    response = client.post("/traces/yaml", data={"csrf_token": token, "spec": text, "action": "apply"})
    assert response.status_code == 422
    assert "sample: must be &gt;= 1 (trace 1 packet in N), got 0 (line 2)" in response.text
    assert "hops[0].colour: unknown key" in response.text


def test_yaml_editor_refuses_alias_bombs_and_deep_nesting(client: FlaskClient, login):
    """Findings 3 and 6: a 376-byte alias bomb grew the web process to 1.7 GB, 5,000 nested '[' gave a 500."""
    login()
    token = token_of(client.get("/traces/yaml").text)
    laughs = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    for text, words in ((laughs, "YAML aliases (*a) are not allowed"), ("[" * 5000, "nested more than")):
        response = client.post("/traces/yaml", data={"csrf_token": token, "spec": text, "action": "validate"})
        assert response.status_code == 422 and words in response.text


def test_results_page_says_why_there_is_no_report(client: FlaskClient, login):
    """The web reads results only through the dispatcher's GetReport: its refusal is shown, not a 500."""
    login()
    response = client.get("/traces/anything/results")
    assert response.status_code == 502
    assert "no report of anything: reports are not configured" in response.text
    error = client.get("/traces/anything/results.json").json["error"]
    assert error.startswith("no report of anything: reports are not configured"), error
    assert client.get("/traces/anything/results?since=forever").status_code == 400


def test_a_range_longer_than_ten_years_is_refused_with_the_limit(client: FlaskClient, login):
    """?since=999999999h would start before year 1: the results and the packets pages refuse it (400, the
    parameter and the limit named) instead of failing with a 500."""
    login()
    for page in ("results", "results.json", "packets"):
        response = client.get(f"/traces/anything/{page}?since=999999999h")
        assert response.status_code == 400, (page, response.status_code)
        text = html.unescape(response.text)
        assert "since: '999999999h' is longer than the limit of 10 years" in text, text


def test_chart_library_is_served_from_node_modules(client: FlaskClient):
    response = client.get("/vendor/chart.umd.js")
    assert response.status_code == 200, "run `npm ci --prefix web`"
    assert b"Chart" in response.data[:2000]


def test_failed_logins_are_rate_limited_even_for_the_right_password(app, client: FlaskClient):
    """100 wrong passwords at 7/s, then the right one, were once accepted."""
    limit = int(app.config["LOGIN_RATE_LIMIT"].split()[0])
    token = token_of(client.get("/login").text)
    for _ in range(limit):
        wrong = client.post("/login", data={"username": USERNAME, "password": "guess", "csrf_token": token})
        assert wrong.status_code == 401
    right = client.post("/login", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token})
    assert right.status_code == 429 and "Too many failed logins" in right.text
    # when to come back: in the header and on the page, within the limit's minute
    retry = int(right.headers["Retry-After"])
    assert 0 < retry <= 61 and f"try again in {retry} s" in right.text, right.headers
    # the name's owner at another address is not locked out by someone else's guesses (it was: the lock
    # was per name, so 10 wrong tries by anyone locked the admin out)
    other = app.test_client()
    token = token_of(other.get("/login").text)
    env = {"REMOTE_ADDR": "198.18.0.77"}
    owner = other.post(
        "/login", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token}, environ_base=env
    )
    assert owner.status_code == 302, owner.text


def test_a_cookie_kept_from_before_logout_no_longer_works(client: FlaskClient, login):
    login()
    cookie = client.get_cookie("session")
    assert client.get("/traces/").status_code == 200
    token = token_of(client.get("/traces/").text)
    assert client.post("/logout", data={"csrf_token": token}).status_code == 302
    client.set_cookie("session", cookie.value)  # the copy an attacker kept
    response = client.get("/traces/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_security_headers_and_secure_cookies_behind_a_tls_proxy(dispatcher):
    from web_helpers import web_config

    from hoptrace.web import create_app

    app = create_app(web_config(DISPATCHER=dispatcher.address, BEHIND_HTTPS_PROXY=True))
    client = app.test_client()
    page = client.get("/login", headers={"X-Forwarded-Proto": "https"})
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY" and page.headers["X-Content-Type-Options"] == "nosniff"
    token = token_of(page.text)
    done = client.post(
        "/login",
        data={"username": USERNAME, "password": PASSWORD, "csrf_token": token},
        headers={"X-Forwarded-Proto": "https"},
    )
    assert done.status_code == 302
    assert "Secure" in done.headers["Set-Cookie"] and "HttpOnly" in done.headers["Set-Cookie"]


def test_editing_a_trace_in_the_form_keeps_its_hop_actions():
    """The form does not edit actions yet; a trace edited there must keep them (a hidden input per row)."""
    from hoptrace.spec import load_spec
    from hoptrace.web.traces import TraceForm

    spec = load_spec(
        "name: acts\nfilter: {protocol: udp}\nhops:\n"
        "  - {name: a, node: host-a, at: tc-egress, dev: eth0}\n"
        "  - {name: b, node: host-a, at: tc-egress, dev: wire0,"
        " actions: [timestamp, {count: {by: cpu}}, {histogram: latency}]}\n"
    )
    shown = TraceForm.from_spec(spec)
    posted = {"name": shown.name, "protocol": shown.protocol, "sample": shown.sample}
    for row, hop in enumerate(shown.hops):
        posted.update({f"hops-{row}-{key}": value for key, value in hop.items()})
    assert "hops-0-actions" not in posted or posted["hops-0-actions"] == ""
    again = load_spec(json.dumps(TraceForm.from_request(posted).to_data()))
    assert again == spec
