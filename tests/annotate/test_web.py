"""HTTP-level tests of the annotation app: auth, CSRF, Stage 1 blindness, path traversal, flows."""

from __future__ import annotations

import re

import pytest

from .helpers import PASSWORD, claim, csrf_of, login

pytest.importorskip("fastapi", reason="the annotation app needs the 'web' extra")
from fastapi.testclient import TestClient  # noqa: E402


def image_id_of(response) -> int:
    match = re.search(r"/annotate/(\d+)", str(response.url))
    assert match, f"not an annotation page: {response.url}"
    return int(match.group(1))


def submit(client, image_id, **fields):
    page = client.get(f"/annotate/{image_id}")
    return client.post(f"/annotate/{image_id}", data={"csrf_token": csrf_of(page.text), **fields})


# -- authentication ----------------------------------------------------------------------------
def test_pages_need_login(app):
    with TestClient(app) as anon:
        for path in ("/", "/annotate", "/annotate/1", "/stage3", "/stage3/1", "/admin", "/api/classes"):
            response = anon.get(path, follow_redirects=False)
            assert response.status_code == 303 and response.headers["location"] == "/login", path
        assert anon.get("/image/1").status_code == 401
        assert anon.get("/example/0/0").status_code == 401
        assert anon.post("/annotate/1", data={"verdict": "id", "class": "1"}, follow_redirects=False).status_code == 303


def test_login_logout_and_wrong_password(app, project):
    with TestClient(app) as client:
        bad = login(client, "ann1", "not the password")
        assert "Wrong name or password" in bad.text and "oodb_session" not in client.cookies
        assert "Wrong name or password" in login(client, "nobody").text
        home = login(client, "ann1")
        assert home.status_code == 200 and "Hello, ann1" in home.text
        cookie = home.history[0].headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=lax" in cookie.replace("Lax", "lax")
        assert (
            home.headers["x-frame-options"] == "DENY" and "script-src 'self'" in home.headers["content-security-policy"]
        )
        token = client.cookies["oodb_session"]
        client.post("/logout", data={"csrf_token": csrf_of(home.text)})
        assert project.store().session_user(token) is None  # the session is gone server-side
        assert client.get("/", follow_redirects=False).status_code == 303


def test_login_throttle(app):
    with TestClient(app) as client:
        for _ in range(8):
            login(client, "ann2", "guess guess")
        assert "Too many failed attempts" in login(client, "ann2").text  # even the right password waits


def test_non_admin_cannot_use_admin_pages(client_for):
    ann = client_for("ann1")
    assert ann.get("/admin").status_code == 403
    page = ann.get("/")
    data = {"csrf_token": csrf_of(page.text), "label_a": "a", "label_b": "b"}
    assert ann.post("/admin/matches", data=data).status_code == 403


# -- CSRF --------------------------------------------------------------------------------------
def test_csrf_is_required(app, client_for, project):
    ann = client_for("ann1")
    image_id = image_id_of(claim(ann))
    for data in ({}, {"csrf_token": "forged"}):
        response = ann.post(f"/annotate/{image_id}", data={"verdict": "id", "class": "1", **data})
        assert response.status_code == 403
    other = client_for("ann2")
    other_token = csrf_of(other.get("/").text)  # a valid token, but of another session
    assert (
        ann.post(f"/annotate/{image_id}", data={"verdict": "id", "class": "1", "csrf_token": other_token}).status_code
        == 403
    )
    token = csrf_of(ann.get(f"/annotate/{image_id}").text)
    cross = ann.post(
        f"/annotate/{image_id}",
        data={"verdict": "id", "class": "1", "csrf_token": token},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status_code == 403
    assert project.store().events() == []
    with TestClient(app) as anon:  # the login form has its own double-submit token
        anon.get("/login")
        response = anon.post("/login", data={"username": "ann1", "password": PASSWORD, "csrf_token": "x"})
        assert response.status_code == 403 and "oodb_session" not in anon.cookies


# -- Stage 1 blindness -------------------------------------------------------------------------
SECRET_LABEL = "zanzibar-xylophone-17"


def test_stage1_is_blind(client_for, project):
    first, second, outsider, boss = client_for("ann1"), client_for("ann2"), client_for("ann3"), client_for("boss")
    image_id = image_id_of(claim(first))
    assert image_id_of(claim(second)) == image_id
    probes = [
        "/",
        "/annotate",
        f"/annotate/{image_id}",
        "/stage3",
        f"/stage3/{image_id}",
        "/admin",
        "/api/classes",
        f"/annotate/{image_id}?show=all",
        f"/stage3/{image_id}/vote",
        f"/image/{image_id}",
        "/mine",
        "/stage3/next",
    ]

    def snapshot():
        return {
            (who, path): (r.status_code, r.content)
            for who, client in (("second", second), ("outsider", outsider), ("boss", boss))
            for path in probes
            for r in [client.get(path)]
        }

    snapshot()  # any side effects of the probes themselves happen here
    before = snapshot()
    assert submit(first, image_id, verdict="ood", label=SECRET_LABEL).status_code == 200
    assert SECRET_LABEL in first.get(f"/annotate/{image_id}").text  # one's own verdict is shown
    after = snapshot()
    # Neither the second annotator, nor anyone else, nor an admin sees any change before the second
    # verdict: every page and endpoint answers byte for byte as before the first verdict.
    assert after == before
    assert all(SECRET_LABEL.encode() not in body for _, body in after.values())
    assert before[("second", f"/stage3/{image_id}")][0] == 404
    assert before[("outsider", f"/annotate/{image_id}")][0] == 404
    # A Stage 3 vote or a close cannot be used to probe the image either.
    token = csrf_of(outsider.get("/").text)
    for action in ("vote", "close"):
        response = outsider.post(
            f"/stage3/{image_id}/{action}", data={"csrf_token": token, "verdict": "id", "class": "1"}
        )
        assert response.status_code == 404 and SECRET_LABEL not in response.text
    # Nor can a Stage 1 verdict on an image outside one's queue, and none is recorded.
    logged = len(project.store().events())
    response = outsider.post(f"/annotate/{image_id}", data={"csrf_token": token, "verdict": "ood", "label": "kayak"})
    assert response.status_code == 404 and SECRET_LABEL not in response.text
    assert len(project.store().events()) == logged
    # Once the second verdict is in (and disagrees), the joint review shows both.
    submit(second, image_id, verdict="id", **{"class": "3"})
    review = outsider.get(f"/stage3/{image_id}")
    assert review.status_code == 200 and SECRET_LABEL in review.text and "class-3" in review.text


# -- path traversal ----------------------------------------------------------------------------
def test_images_only_from_configured_roots(client_for, project, tmp_path):
    ann = client_for("ann1")
    image_id = image_id_of(claim(ann))
    ok = ann.get(f"/image/{image_id}")
    assert ok.status_code == 200 and ok.headers["content-type"] == "image/png" and ok.content[:4] == b"\x89PNG"
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    for path in (
        "/image/../../secret.txt",
        "/image/..%2f..%2fsecret.txt",
        "/image/%2e%2e/%2e%2e/etc/passwd",
        "/static/../project.json",
        "/static/..%2f..%2fdb.py",
        "/static/%2e%2e/web.py",
        "/example/0/..%2f..%2fsecret.txt",
        "/image/999999",
        "/example/0/0",
        "/example/-1/0",
    ):
        response = ann.get(path)
        assert response.status_code in (404, 422), path
        assert "top secret" not in response.text and "AnnotateError" not in response.text
    # Rows pointing outside the root (edited database, symlink) are refused at serving time too.
    store = project.store()
    link = project.root("images") / "sub0" / "escape.png"
    link.symlink_to(secret)
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE images SET path = :p WHERE id = :i"), {"p": "../secret.txt", "i": image_id})
    assert ann.get(f"/image/{image_id}").status_code == 404
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE images SET path = :p WHERE id = :i"), {"p": "sub0/escape.png", "i": image_id})
    assert ann.get(f"/image/{image_id}").status_code == 404
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE images SET path = :p WHERE id = :i"), {"p": str(secret), "i": image_id})
    assert ann.get(f"/image/{image_id}").status_code == 404


def test_static_assets_are_served(client_for):
    ann = client_for("ann1")
    js = ann.get("/static/annotate.js")
    assert js.status_code == 200 and "keydown" in js.text
    assert ann.get("/static/style.css").status_code == 200


# -- flows -------------------------------------------------------------------------------------
def test_full_round_over_http(client_for, project):
    a, b, c, boss = client_for("ann1"), client_for("ann2"), client_for("ann3"), client_for("boss")
    image_id = image_id_of(claim(a))
    page = a.get(f"/annotate/{image_id}")
    # Evidence panels: present ones rendered, absent ones say why.
    assert 'id="evidence-original"' in page.text and "class-" in page.text
    assert "no VLM embeddings given yet" in page.text and "no LLM description yet" in page.text
    assert "no public URL" in page.text
    bad = submit(a, image_id, verdict="id", **{"class": "zebra"})
    assert bad.status_code == 400 and "unknown class" in bad.text
    assert submit(a, image_id, verdict="ood", label="Snow globe", fine_grained="on").status_code == 200
    assert image_id_of(claim(b)) == image_id
    submit(b, image_id, verdict="id", **{"class": "4: class-4"})
    listing = c.get("/stage3").text
    assert f"/stage3/{image_id}" in listing
    for client, fields in (
        (a, {"verdict": "ood", "label": "snow globe"}),
        (b, {"verdict": "ood", "label": "snow-globe"}),
    ):
        token = csrf_of(client.get(f"/stage3/{image_id}").text)
        assert client.post(f"/stage3/{image_id}/vote", data={"csrf_token": token, **fields}).status_code == 200
    token = csrf_of(c.get(f"/stage3/{image_id}").text)
    done = c.post(
        f"/stage3/{image_id}/vote",
        data={"csrf_token": token, "verdict": "ood", "label": "The snow globe", "fine_grained": "on"},
    )
    assert 'id="final"' in done.text and "Snow globe" in done.text
    outcome = project.store().outcome(image_id)
    assert outcome.concept == "snow globe" and outcome.decided_in == 3 and outcome.fine_grained
    admin = boss.get("/admin")
    assert admin.status_code == 200 and "snow globe (1)" in admin.text
    token = csrf_of(admin.text)
    matched = boss.post("/admin/matches", data={"csrf_token": token, "label_a": "snow globe", "label_b": "snowdome"})
    assert "Match recorded" in matched.text and "“snow globe” ≡ “snowdome”" in matched.text


def test_ambiguous_needs_reason_and_queue_ends(client_for, project):
    a = client_for("ann1")
    image_id = image_id_of(claim(a))
    bad = submit(a, image_id, verdict="ambiguous")
    assert bad.status_code == 400 and "needs a reason" in bad.text
    assert submit(a, image_id, verdict="", label="x").status_code == 400
    for _ in range(len(project.store().images())):
        response = claim(a)
        if "queue-empty" in response.text:
            break
        submit(a, image_id_of(response), verdict="ambiguous", reason="degraded")
    assert 'id="queue-empty"' in a.get("/annotate").text
    assert len(project.store().events()) == len(project.store().images())


def test_admin_lists_label_disputes_and_matches_them(client_for, project):
    a, b, boss = client_for("ann1"), client_for("ann2"), client_for("boss")
    image_id = image_id_of(claim(a))
    assert image_id_of(claim(b)) == image_id
    submit(a, image_id, verdict="ood", label="cellphone")
    submit(b, image_id, verdict="ood", label="mobile phone")
    admin = boss.get("/admin")
    assert "“cellphone” vs “mobile phone”" in admin.text
    form = re.search(r'<ul id="disputes">.*?</ul>', admin.text, re.S).group(0)
    fields = dict(re.findall(r'name="(label_[ab])" value="([^"]+)"', form))
    done = boss.post("/admin/matches", data={"csrf_token": csrf_of(admin.text), **fields})
    assert "1 image(s) resolved" in done.text and 'id="disputes"' not in done.text
    assert project.store().outcome(image_id).concept == "cellphone"


# -- findings of the outside review --------------------------------------------------------------
HUGE_IDS = ("99999999999999999999", str(2**63), "0", "-1")


def test_out_of_range_ids_answer_404(client_for):
    ann = client_for("ann1")
    token = csrf_of(ann.get("/").text)
    for image_id in HUGE_IDS:
        for path in (f"/image/{image_id}", f"/annotate/{image_id}", f"/stage3/{image_id}"):
            assert ann.get(path).status_code == 404, path
        for path in (f"/annotate/{image_id}", f"/stage3/{image_id}/vote", f"/stage3/{image_id}/close"):
            response = ann.post(path, data={"csrf_token": token, "verdict": "ood", "label": "kayak"})
            assert response.status_code == 404, path


def test_get_requests_never_claim_an_image(client_for, project):
    ann = client_for("ann1")
    user = {u.name: u for u in project.store().users()}["ann1"]
    for path in ("/", "/annotate", "/annotate", "/stage3"):  # what a cross-site link or image tag can send
        ann.get(path)
    assert project.store().progress(user)["mine_open"] == 0
    page = ann.get("/annotate")
    assert page.status_code == 200 and 'id="claim"' in page.text and "4 image(s) wait" in page.text
    image_id = image_id_of(claim(ann))  # the button: a POST with the session's CSRF token
    assert project.store().progress(user)["mine_open"] == 1
    assert image_id_of(ann.get("/annotate")) == image_id  # a pending image is shown, not a new one claimed
    forged = ann.post("/annotate", data={"csrf_token": "forged"})
    assert forged.status_code == 403 and project.store().progress(user)["mine_open"] == 1


def test_image_files_follow_queue_and_stage(client_for, project):
    a, b, outsider, boss = client_for("ann1"), client_for("ann2"), client_for("ann3"), client_for("boss")
    image_id = image_id_of(claim(a))
    assert image_id_of(claim(b)) == image_id
    others = [i.id for i in project.store().images() if i.id != image_id]

    def served(client, ids):
        return [client.get(f"/image/{i}").status_code for i in ids]

    assert served(a, [image_id]) == [200] and served(b, [image_id]) == [200]
    assert served(outsider, [image_id] + others) == [404] * 4  # neither in their queue nor in review
    assert served(a, others) == [404] * 3
    assert served(boss, [image_id] + others) == [200] * 4  # admins see every image
    submit(a, image_id, verdict="ood", label="kayak")
    assert served(outsider, [image_id]) == [404]  # one verdict in: still Stage 1
    submit(b, image_id, verdict="id", **{"class": "3"})  # disagreement: joint review, open to everyone
    assert served(outsider, [image_id]) == [200]


def test_throttle_never_lets_a_stranger_lock_out_a_user(app, monkeypatch):
    from oodbench.annotate import db

    hashed = []
    real_verify = db.verify_password
    monkeypatch.setattr(db, "verify_password", lambda *args: hashed.append(1) or real_verify(*args))
    with TestClient(app, client=("203.0.113.5", 40000)) as stranger:
        for _ in range(12):
            assert "oodb_session" not in login(stranger, "ann2", "guess guess").history[0].headers.get("set-cookie", "")
        assert "Too many failed attempts" in login(stranger, "ann2").text  # even the right password waits
    assert len(hashed) == 5  # after the 5th failure no attempt runs the password hash
    with TestClient(app, client=("198.51.100.7", 40000)) as owner:
        assert "Hello, ann2" in login(owner, "ann2").text


def test_throttle_limits_one_password_across_many_names(app, monkeypatch):
    from oodbench.annotate import db

    hashed = []
    real_verify = db.verify_password
    monkeypatch.setattr(db, "verify_password", lambda *args: hashed.append(1) or real_verify(*args))
    with TestClient(app, client=("203.0.113.9", 40000)) as sprayer:
        answers = [login(sprayer, f"user{i}", "Summer2026!").text for i in range(30)]
    assert len(hashed) == 20 and all("Too many failed attempts" in text for text in answers[20:])


def count_hashes(monkeypatch) -> list:
    """A list that grows by one for every password hash the login runs."""
    from oodbench.annotate import db

    hashed = []
    real_verify = db.verify_password
    monkeypatch.setattr(db, "verify_password", lambda *args: hashed.append(1) or real_verify(*args))
    return hashed


TOO_MANY = "Too many failed attempts"


def test_spoofed_forwarding_headers_change_nothing_in_throttling(app, monkeypatch):
    """Every client behind an SSH tunnel comes from 127.0.0.1; a header claiming another address is ignored."""
    hashed = count_hashes(monkeypatch)
    with TestClient(app, client=("127.0.0.1", 40000)) as stranger:
        for i in range(12):
            stranger.headers["X-Forwarded-For"] = f"203.0.113.{i}, 198.51.100.{i}"
            stranger.headers["Forwarded"] = f"for=192.0.2.{i}"
            login(stranger, "ann2", "guess guess")
        assert TOO_MANY in login(stranger, "ann2").text
        assert len(hashed) == 5  # one address, one name: 5 checked, whatever the headers said
        for i in range(30):  # spraying with a new claimed address each time: still one client's budget of 20
            stranger.headers["X-Forwarded-For"] = f"203.0.114.{i}"
            login(stranger, f"user{i}", "Summer2026!")
    assert len(hashed) == 5 + 15  # 20 failures in all from 127.0.0.1, then nothing more is hashed


def test_a_trusted_proxy_names_the_client(project, monkeypatch):
    from oodbench.annotate.web import create_app

    hashed = count_hashes(monkeypatch)
    app = create_app(project, trusted_proxies=["127.0.0.1"])
    with TestClient(app, client=("127.0.0.1", 40000)) as proxied:
        proxied.headers["X-Forwarded-For"] = "203.0.113.5"
        for _ in range(7):
            login(proxied, "ann2", "guess guess")
        assert len(hashed) == 5
        # A client that writes its own header before the proxy's entry still counts as the proxy's entry.
        proxied.headers["X-Forwarded-For"] = "198.51.100.7, 203.0.113.5"
        assert TOO_MANY in login(proxied, "ann2").text
    with TestClient(app, client=("127.0.0.1", 40001)) as owner:
        owner.headers["X-Forwarded-For"] = "198.51.100.7"
        assert "Hello, ann2" in login(owner, "ann2").text
    with TestClient(app, client=("192.0.2.50", 40000)) as direct:  # not the proxy: its header is ignored
        direct.headers["X-Forwarded-For"] = "198.51.100.7"
        for _ in range(6):
            login(direct, "ann3", "guess guess")
        assert TOO_MANY in login(direct, "ann3").text


def test_a_stranger_with_many_addresses_cannot_lock_out_a_colleague(app, monkeypatch):
    with TestClient(app, client=("192.0.2.10", 40000)) as owner:  # the colleague has logged in before
        home = login(owner, "ann2")
        assert "Hello, ann2" in home.text and "oodb_device" in owner.cookies
        owner.post("/logout", data={"csrf_token": csrf_of(home.text)})
    hashed = count_hashes(monkeypatch)
    for i in range(40):  # one guess from each of 40 addresses, the owner's own among them
        with TestClient(app, client=(f"203.0.113.{i}" if i else "192.0.2.10", 40000)) as stranger:
            login(stranger, "ann2", f"guess {i}")
    assert len(hashed) == 10  # the account's budget: 10 guesses in the window, however many addresses
    with TestClient(app, client=("192.0.2.99", 40000)) as new_browser:
        assert TOO_MANY in login(new_browser, "ann2").text  # a browser never used for ann2 waits
        new_browser.cookies.set("oodb_device", "forged.token", path="/login")
        assert TOO_MANY in login(new_browser, "ann2").text
    with TestClient(app, client=("192.0.2.10", 40000)) as again:  # the same browser (its cookie jar)
        again.cookies = owner.cookies
        assert "Hello, ann2" in login(again, "ann2").text
    assert len(hashed) == 11
    with TestClient(app, client=("192.0.2.11", 40000)) as other:  # other accounts are untouched
        assert "Hello, ann3" in login(other, "ann3").text


def test_ood_label_with_a_nul_byte_is_refused(client_for, project):
    ann = client_for("ann1")
    image_id = image_id_of(claim(ann))
    response = submit(ann, image_id, verdict="ood", label="kayak\x00<script>")
    assert response.status_code == 400 and "control character U+0000" in response.text
    assert project.store().events() == []


# -- a full day of work: queue position, earlier verdicts, forms kept, Stage 3 list ----------------
def test_stage1_page_shows_position_and_what_is_left(client_for):
    ann = client_for("ann1")
    first = claim(ann)
    assert "Your verdict no. 1 · 3 more image(s) open for you after this one" in first.text
    following = submit(ann, image_id_of(first), verdict="ambiguous", reason="degraded")
    assert "Your verdict no. 2 · 2 more image(s) open for you after this one" in following.text


def test_earlier_verdicts_are_listed_and_revisable(client_for):
    ann = client_for("ann1")
    assert 'id="no-verdicts"' in ann.get("/mine").text
    first = image_id_of(claim(ann))
    submit(ann, first, verdict="ood", label="kayak")
    second = image_id_of(ann.get("/annotate"))
    submit(ann, second, verdict="id", **{"class": "2"})
    mine = ann.get("/mine").text
    assert mine.index(f'href="/annotate/{first}"') < mine.index(f'href="/annotate/{second}"')
    assert "OOD: “kayak”" in mine and "ID: 2 · class-2" in mine and mine.count("open: revisable") == 2
    revised = submit(ann, first, verdict="ood", label="canoe")
    assert revised.status_code == 200
    mine = ann.get("/mine").text
    assert "“canoe”" in mine and "kayak" not in mine and 'href="/mine"' in ann.get(f"/annotate/{first}").text


def test_refused_verdict_keeps_the_form_as_typed_and_suggests_a_class(client_for):
    ann = client_for("ann1")
    image_id = image_id_of(claim(ann))
    refused = submit(ann, image_id, verdict="id", label="", fine_grained="on", **{"class": "clas-3"})
    assert refused.status_code == 400
    assert "unknown class 'clas-3'; did you mean “3: class-3”" in refused.text.replace("&#39;", "'")
    form = re.search(
        r'<form method="post" action="/annotate/\d+" id="verdict-form".*?</form>', refused.text, re.S
    ).group(0)
    assert 'value="clas-3"' in form and re.search(r'id="v-id" checked', form) and re.search(r'id="fine" checked', form)
    ood = submit(ann, image_id, verdict="ood", label="x" * 201)
    assert ood.status_code == 400 and f'value="{"x" * 201}"' in ood.text and re.search(r'id="v-ood" checked', ood.text)


def stage3_ready(client_for, project, n):
    """n images in Stage 3 (ann1 says OOD, ann2 says ID); returns the clients and the image ids."""
    a, b, c = client_for("ann1"), client_for("ann2"), client_for("ann3")
    ids = []
    for _ in range(n):
        image_id = image_id_of(claim(a))
        assert image_id_of(claim(b)) == image_id
        submit(a, image_id, verdict="ood", label="kayak")
        submit(b, image_id, verdict="id", **{"class": "1"})
        ids.append(image_id)
    return a, b, c, ids


def test_stage3_list_counts_votes_and_next_goes_to_the_next_open_image(client_for, project):
    a, b, c, ids = stage3_ready(client_for, project, 2)
    listing = c.get("/stage3").text
    assert listing.count("0 of 3 vote(s)") == 2 and listing.count("needs your vote") == 2
    assert image_id_of_stage3(c.get("/stage3/next")) == ids[0]
    page = c.get(f"/stage3/{ids[0]}")
    # Stage 1 verdicts are one click away: "use this" fills the label or the class.
    assert 'data-label="kayak" title="use this label">use this' in page.text
    assert 'data-class="1: class-1" title="use this class">use this' in page.text
    assert 'id="next-open"' in page.text
    voted = c.post(
        f"/stage3/{ids[0]}/vote", data={"csrf_token": csrf_of(page.text), "verdict": "ood", "label": "kayak"}
    )
    assert 'id="next-open"' in voted.text  # after voting, "next" leads on
    assert image_id_of_stage3(c.get("/stage3/next")) == ids[1]
    listing = c.get("/stage3").text
    assert '1 of 3 vote(s)</span> <span class="muted">you voted' in listing and listing.count("needs your vote") == 1
    assert a.get("/stage3").text.count("needs your vote") == 2  # others still see both as open
    token = csrf_of(c.get(f"/stage3/{ids[1]}").text)
    c.post(f"/stage3/{ids[1]}/vote", data={"csrf_token": token, "verdict": "ood", "label": "kayak"})
    assert c.get("/stage3/next").url.path == "/stage3"  # nothing left for c: back to the list
    assert "No other image needs your vote" in c.get(f"/stage3/{ids[1]}").text


def image_id_of_stage3(response) -> int:
    match = re.fullmatch(r"/stage3/(\d+)", response.url.path)
    assert match, f"not a review page: {response.url}"
    return int(match.group(1))


def test_unknown_class_names_get_the_closest_suggestions():
    from oodbench.annotate.web import parse_class
    from oodbench.core.errors import AnnotateError

    names = ("cat", "dog", "cattle", "hot dog")
    assert parse_class("CAT", names) == 0 and parse_class("3: hot dog", names) == 3
    with pytest.raises(AnnotateError, match="unknown class 'catt'; did you mean “0: cat” or “2: cattle”"):
        parse_class("catt", names)
    with pytest.raises(AnnotateError, match="unknown class 'zebra'; type its index or exact name"):
        parse_class("zebra", names)  # nothing close: no suggestion


def test_a_stage3_note_over_the_limit_is_refused_whole(client_for, project):
    """A 5,055-character note is refused with the limit stated; nothing is stored, nothing is cut."""
    from oodbench.annotate.protocol import MAX_NOTE_LENGTH

    a, b, c = client_for("ann1"), client_for("ann2"), client_for("ann3")
    image_id = image_id_of(claim(a))
    assert image_id_of(claim(b)) == image_id
    submit(a, image_id, verdict="ood", label="kayak")
    submit(b, image_id, verdict="id", **{"class": "3"})  # disagreement: joint review
    page = c.get(f"/stage3/{image_id}")
    assert f'maxlength="{MAX_NOTE_LENGTH}"' in page.text
    long_note = ("a paddle and a hull, " * 241)[:5055]
    fields = {"csrf_token": csrf_of(page.text), "verdict": "ood", "label": "kayak", "note": long_note}
    refused = c.post(f"/stage3/{image_id}/vote", data=fields)
    assert refused.status_code == 400 and "a note has at most 2,000 characters; this one has 5,055" in refused.text
    assert [e["kind"] for e in project.store().events(image_id)] == ["stage1", "stage1"]
    fields["note"] = long_note[:MAX_NOTE_LENGTH]  # exactly the limit: kept whole
    assert c.post(f"/stage3/{image_id}/vote", data=fields).status_code == 200
    assert project.store().events(image_id)[-1]["note"] == long_note[:MAX_NOTE_LENGTH]
