"""The annotation web app: server-rendered pages over the annotation store.

Pages: login, home, Stage 1 queue (blind), Stage 3 joint review, admin (progress, outcome
statistics, explicit label matches). Every state-changing request is a POST carrying the
session's CSRF token; images are served only from the project's configured roots.

`create_app` builds the shared state (`_Site`) and lets each route group add its routes: login,
Stage 1, Stage 3, admin, files.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import Depends, FastAPI, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from ..core.errors import AnnotateError
from .db import MAX_ROW_ID, AnnotationStore, User
from .evidence import SOURCE_TITLES, SOURCES
from .project import Project
from .protocol import AMBIGUITY_REASONS, MAX_NOTE_LENGTH, PANEL_SIZE, Judgement, Status, Verdict
from .security import (
    DeviceTokens,
    IPNetwork,
    LoginCsrf,
    LoginThrottle,
    client_address,
    parse_trusted_proxies,
    tokens_equal,
)
from .stats import outcome_stats

HERE = Path(__file__).parent
SESSION_COOKIE = "oodb_session"
LOGIN_COOKIE = "oodb_login"
DEVICE_COOKIE = "oodb_device"  # recognises a browser that logged in before (see DeviceTokens)
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; script-src 'self'; style-src 'self'; "
        b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
]


class _Redirect(Exception):
    def __init__(self, url: str) -> None:
        self.url = url


class _Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


class SecurityHeaders:
    """ASGI middleware adding security headers to every response (cheaper than BaseHTTPMiddleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)


FormText = Annotated[str, Form()]


def image_id_in_range(image_id: int) -> int:
    """The image id of a path, or 404 when no database row can have it (SQLite ids are signed 64-bit)."""
    if not 0 < image_id <= MAX_ROW_ID:
        raise _Denied(404, "There is no such image.")
    return image_id


ImageId = Annotated[int, Depends(image_id_in_range)]


async def verdict_fields(
    csrf_token: FormText = "",
    verdict: FormText = "",
    label: FormText = "",
    class_: Annotated[str, Form(alias="class")] = "",
    reason: FormText = "",
    fine_grained: FormText = "",
    note: FormText = "",
) -> dict[str, str]:
    """The fields of the verdict form (a FastAPI dependency)."""
    return {
        "csrf_token": csrf_token,
        "verdict": verdict,
        "label": label,
        "class": class_,
        "reason": reason,
        "fine_grained": fine_grained,
        "note": note,
    }


VerdictForm = Annotated[dict, Depends(verdict_fields)]


def parse_class(text: str, names: tuple[str, ...]) -> int:
    """Class index from a form value: an index, "index: name", or a unique name."""
    text = (text or "").strip()
    match = re.match(r"^(\d+)\b", text)
    if match:
        index = int(match.group(1))
        if index >= len(names):
            raise AnnotateError(f"class {index} is outside 0..{len(names) - 1}")
        return index
    hits = [i for i, n in enumerate(names) if n.casefold() == text.casefold()]
    if len(hits) == 1:
        return hits[0]
    if not text:
        raise AnnotateError("an ID verdict needs a class: type its index or name")
    if hits:
        raise AnnotateError(f"{text!r} names several classes ({', '.join(map(str, hits))}); give the index")
    close = difflib.get_close_matches(text.casefold(), [n.casefold() for n in names], n=3, cutoff=0.6)
    folded = {n.casefold(): i for i, n in reversed(list(enumerate(names)))}
    hint = "; did you mean " + " or ".join(f"“{folded[c]}: {names[folded[c]]}”" for c in close) + "?" if close else ""
    raise AnnotateError(f"unknown class {text!r}{hint or '; type its index or exact name'}")


def judgement_from_form(form: Any, names: tuple[str, ...]) -> Judgement:
    """A judgement from the verdict form's fields."""
    verdict = str(form.get("verdict") or "")
    fine = form.get("fine_grained") in ("on", "1", "true")
    if verdict == Verdict.OOD:
        return Judgement(Verdict.OOD, label=str(form.get("label") or ""), fine_grained=fine)
    if verdict == Verdict.ID:
        return Judgement(Verdict.ID, class_index=parse_class(str(form.get("class") or ""), names), fine_grained=fine)
    if verdict == Verdict.AMBIGUOUS:
        return Judgement(Verdict.AMBIGUOUS, reason=str(form.get("reason") or "") or None, fine_grained=fine)
    raise AnnotateError("choose a verdict: OOD, ID or ambiguous")


@dataclass
class _Site:
    """What every route group shares: the project, its store, the page templates and the login defences."""

    project: Project
    store: AnnotationStore
    names: tuple[str, ...]  # the class names, as the verdict form's class field is parsed against them
    secure: bool  # whether cookies carry the Secure flag
    templates: Jinja2Templates
    trusted: tuple[IPNetwork, ...]  # reverse proxies whose X-Forwarded-For names the client
    login_csrf: LoginCsrf
    throttle: LoginThrottle
    devices: DeviceTokens

    @classmethod
    def open(cls, project: Project, trusted_proxies: Sequence[str]) -> _Site:
        """The shared state of one project's app; a bad trusted proxy is refused before the store opens."""
        trusted = parse_trusted_proxies(trusted_proxies)
        store = project.store()
        templates = Jinja2Templates(directory=str(HERE / "templates"))
        templates.env.globals.update(
            title=project.config.title,
            SOURCES=SOURCES,
            SOURCE_TITLES=SOURCE_TITLES,
            REASONS=AMBIGUITY_REASONS,
            MAX_NOTE_LENGTH=MAX_NOTE_LENGTH,
            class_name=lambda i: project.classes.name(i),
        )
        return cls(
            project=project,
            store=store,
            names=project.classes.names,
            secure=project.config.cookie_secure,
            templates=templates,
            trusted=trusted,
            login_csrf=LoginCsrf(project.secret),
            throttle=LoginThrottle(),
            devices=DeviceTokens(project.secret),
        )

    def current(self, request: Request) -> tuple[User, str]:
        """The logged-in user and their session's CSRF token, or a redirect to the login page."""
        found = self.store.session_user(request.cookies.get(SESSION_COOKIE))
        if found is None:
            raise _Redirect("/login")
        return found

    def admin(self, request: Request) -> tuple[User, str]:
        """As `current`, for administrators only."""
        user, csrf = self.current(request)
        if not user.is_admin:
            raise _Denied(403, "This page is for project administrators.")
        return user, csrf

    def page(
        self, request: Request, name: str, user: User | None, csrf: str | None, status: int = 200, **context: Any
    ) -> Response:
        """A rendered template, never cached."""
        return self.templates.TemplateResponse(
            request,
            name,
            {"user": user, "csrf": csrf, **context},
            status_code=status,
            headers={"cache-control": "no-store"},
        )

    async def denied(self, request: Request, exc: _Denied) -> Response:
        """The error page of a refused request (an exception handler)."""
        return self.templates.TemplateResponse(
            request, "error.html", {"message": exc.message, "user": None}, status_code=exc.status
        )


async def _redirect(_request: Request, exc: _Redirect) -> Response:
    return RedirectResponse(exc.url, status_code=303)


def _same_origin(request: Request) -> bool:
    # Browsers send Origin on POSTs; when present it must name this server.
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc == request.headers.get("host", "")


def _check_csrf(request: Request, csrf: str, given: str) -> None:
    if not _same_origin(request) or not tokens_equal(csrf, given):
        raise _Denied(403, "The form's security token is missing or wrong. Reload the page and try again.")


def create_app(project: Project, *, trusted_proxies: Sequence[str] = ()) -> FastAPI:
    """The FastAPI application serving one project.

    `trusted_proxies`: addresses or networks of reverse proxies whose X-Forwarded-For header names the client.
    Without them the headers are ignored and the socket's peer is the client (serve the app with the server's
    own proxy-header handling off, as `oodbench annotate serve` does).
    """
    site = _Site.open(project, trusted_proxies)
    app = FastAPI(title=project.config.title, docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.add_middleware(SecurityHeaders)
    app.add_exception_handler(_Redirect, _redirect)
    app.add_exception_handler(_Denied, site.denied)
    # Order matters where paths overlap: /stage3/next is matched before /stage3/{image_id}.
    # Each group adds its routes to the app itself (no included routers): the app matches one flat list.
    for add_routes in (_login_routes, _stage1_routes, _stage3_routes, _admin_routes, _file_routes):
        add_routes(app, site)
    return app


# Handlers are plain functions: FastAPI parses the form, then runs them in its thread pool, so
# password hashing and database work never block the event loop.


def _login_routes(app: FastAPI, site: _Site) -> None:
    """Login (CSRF cookie, throttling, device recognition) and logout."""
    store = site.store

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, error: str | None = None) -> Response:
        token, cookie = site.login_csrf.issue()
        response = site.page(request, "login.html", None, token, error=error)
        response.set_cookie(LOGIN_COOKIE, cookie, httponly=True, samesite="strict", secure=site.secure, max_age=3600)
        return response

    @app.post("/login")
    def login(
        request: Request, username: FormText = "", password: FormText = "", csrf_token: FormText = ""
    ) -> Response:
        if not _same_origin(request) or not site.login_csrf.check(request.cookies.get(LOGIN_COOKIE), csrf_token):
            raise _Denied(403, "The login form expired. Reload the page and try again.")
        name = username.strip()[:64]
        peer = request.client.host if request.client else None
        client = client_address(peer, request.headers.getlist("x-forwarded-for"), site.trusted)
        device = site.devices.device_for(request.cookies.get(DEVICE_COOKIE), name)
        # Counted as a failure before authenticate() and taken back on success: a throttled attempt costs no
        # password hash, and parallel attempts cannot all pass the check before any of them is counted.
        reservation = site.throttle.reserve(client, name, device, known_account=store.has_account(name))
        if reservation is None:
            return RedirectResponse(
                "/login?error=Too+many+failed+attempts%3B+wait+a+few+minutes+(a+browser+you+have+logged+in+"
                "with+before+is+not+affected)",
                303,
            )
        user = store.authenticate(name, password)
        if user is None:
            return RedirectResponse("/login?error=Wrong+name+or+password", 303)
        site.throttle.release(reservation)
        site.throttle.succeeded(client, name, device)
        token, _csrf = store.open_session(user)
        response = RedirectResponse("/", 303)
        # Recognition for later logins from this browser: judged by its own failures, not a stranger's.
        response.set_cookie(
            DEVICE_COOKIE,
            site.devices.issue(user.name, device),
            httponly=True,
            samesite="strict",
            secure=site.secure,
            max_age=int(site.devices.max_age_s),
            path="/login",
        )
        response.set_cookie(
            SESSION_COOKIE,
            token,
            httponly=True,
            samesite="lax",
            secure=site.secure,
            max_age=int(site.project.config.session_hours * 3600),
        )
        response.delete_cookie(LOGIN_COOKIE)
        return response

    @app.post("/logout")
    def logout(request: Request, csrf_token: FormText = "") -> Response:
        _user, csrf = site.current(request)
        _check_csrf(request, csrf, csrf_token)
        store.close_session(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE)
        return response


def _stage1_page(
    site: _Site,
    request: Request,
    user: User,
    csrf: str,
    image_id: int,
    error: str | None = None,
    status: int = 200,
    typed: dict | None = None,
) -> Response:
    """The Stage 1 page of one image in the user's queue (404 for any other image)."""
    store = site.store
    image = store.image(image_id)
    if image is None or not store.is_assigned(user, image_id):
        raise _Denied(404, "This image is not in your queue.")
    mine = store.own_stage1(user, image_id)
    progress = store.progress(user)
    # Position: this image's number among the user's verdicts; left: what the user can still do after it.
    waiting = mine is None and image.status is Status.STAGE1
    return site.page(
        request,
        "annotate.html",
        user,
        csrf,
        status=status,
        image=image,
        mine=mine,
        error=error,
        typed=typed,
        open=image.status is Status.STAGE1,
        examples=site.project.examples,
        position=progress["mine_done"] + 1 if waiting else None,
        left=progress["mine_open"] - int(waiting) + store.claimable(user),
    )


def _stage1_routes(app: FastAPI, site: _Site) -> None:
    """Home, the blind Stage 1 queue and the user's own verdicts."""
    store = site.store

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request) -> Response:
        user, csrf = site.current(request)
        return site.page(request, "home.html", user, csrf, progress=store.progress(user))

    @app.get("/annotate")
    def next_item(request: Request) -> Response:
        # A GET never claims an image (a cross-site link must not change a queue): it shows the
        # pending image if there is one, else a button that claims the next one by POST.
        user, csrf = site.current(request)
        image_id = store.pending_stage1(user)
        if image_id is not None:
            return RedirectResponse(f"/annotate/{image_id}", 303)
        return site.page(
            request, "empty.html", user, csrf, progress=store.progress(user), claimable=store.claimable(user)
        )

    @app.post("/annotate")
    def claim_item(request: Request, csrf_token: FormText = "") -> Response:
        user, csrf = site.current(request)
        _check_csrf(request, csrf, csrf_token)
        image_id = store.next_stage1(user)
        if image_id is None:
            return site.page(request, "empty.html", user, csrf, progress=store.progress(user), claimable=0)
        return RedirectResponse(f"/annotate/{image_id}", 303)

    @app.get("/annotate/{image_id}", response_class=HTMLResponse)
    def annotate_form(request: Request, image_id: ImageId) -> Response:
        user, csrf = site.current(request)
        return _stage1_page(site, request, user, csrf, image_id)

    @app.post("/annotate/{image_id}")
    def annotate_submit(request: Request, image_id: ImageId, form: VerdictForm) -> Response:
        user, csrf = site.current(request)
        _check_csrf(request, csrf, form["csrf_token"])
        try:  # the store refuses images outside the user's queue; _stage1_page then answers 404
            store.submit_stage1(user, image_id, judgement_from_form(form, site.names))
        except AnnotateError as exc:  # the page comes back with the form as typed
            return _stage1_page(site, request, user, csrf, image_id, error=str(exc), status=400, typed=form)
        following = store.next_stage1(user)  # straight to the next item: one round trip fewer
        return RedirectResponse("/annotate" if following is None else f"/annotate/{following}", 303)

    @app.get("/mine", response_class=HTMLResponse)
    def my_verdicts(request: Request) -> Response:
        user, csrf = site.current(request)
        return site.page(request, "mine.html", user, csrf, history=store.stage1_history(user))


def _stage3_page(
    site: _Site,
    request: Request,
    user: User,
    csrf: str,
    image_id: int,
    error: str | None = None,
    status: int = 200,
    typed: dict | None = None,
) -> Response:
    """The joint-review page of one image (404 unless the image is or was in Stage 3)."""
    store = site.store
    image = store.image(image_id)
    # Stage 1 verdicts are shown only once both are in: the page does not exist before that.
    if image is None or image.status is Status.STAGE1:
        raise _Denied(404, "This image is not in Stage 3 review.")
    outcome = store.outcome(image_id)
    if outcome.decided_in != 3 and outcome.status is not Status.STAGE3:
        raise _Denied(404, "This image was decided by agreement in Stage 2; it has no joint review.")
    waiting = [i for i in store.stage3_open_for(user) if i != image_id]
    return site.page(
        request,
        "stage3.html",
        user,
        csrf,
        status=status,
        image=image,
        outcome=outcome,
        error=error,
        examples=site.project.examples,
        panel_size=PANEL_SIZE,
        mine=outcome.stage3.get(user.name),
        typed=typed,
        waiting=len(waiting),
    )


def _stage3_routes(app: FastAPI, site: _Site) -> None:
    """Stage 3 joint review: the list, the next open image, votes and closing."""
    store = site.store

    @app.get("/stage3", response_class=HTMLResponse)
    def stage3_list(request: Request) -> Response:
        user, csrf = site.current(request)
        return site.page(
            request,
            "stage3_list.html",
            user,
            csrf,
            images=store.stage3_images(),
            votes=store.stage3_votes(),
            panel_size=PANEL_SIZE,
        )

    @app.get("/stage3/next")
    def stage3_next(request: Request) -> Response:
        user, _csrf = site.current(request)
        waiting = store.stage3_open_for(user)
        return RedirectResponse(f"/stage3/{waiting[0]}" if waiting else "/stage3", 303)

    @app.get("/stage3/{image_id}", response_class=HTMLResponse)
    def stage3_form(request: Request, image_id: ImageId) -> Response:
        user, csrf = site.current(request)
        return _stage3_page(site, request, user, csrf, image_id)

    @app.post("/stage3/{image_id}/vote")
    def stage3_vote(request: Request, image_id: ImageId, form: VerdictForm) -> Response:
        user, csrf = site.current(request)
        _check_csrf(request, csrf, form["csrf_token"])
        try:
            store.vote_stage3(user, image_id, judgement_from_form(form, site.names), note=form["note"])
        except AnnotateError as exc:
            return _stage3_page(site, request, user, csrf, image_id, error=str(exc), status=400, typed=form)
        return RedirectResponse(f"/stage3/{image_id}", 303)

    @app.post("/stage3/{image_id}/close")
    def stage3_close(request: Request, image_id: ImageId, csrf_token: FormText = "") -> Response:
        user, csrf = site.current(request)
        _check_csrf(request, csrf, csrf_token)
        try:
            store.close_stage3(user, image_id)
        except AnnotateError as exc:
            return _stage3_page(site, request, user, csrf, image_id, error=str(exc), status=400)
        return RedirectResponse(f"/stage3/{image_id}", 303)


def _admin_routes(app: FastAPI, site: _Site) -> None:
    """The admin page (progress, outcome statistics, label disputes) and explicit label matches."""
    store = site.store

    @app.get("/admin", response_class=HTMLResponse)
    def admin_page(request: Request, message: str | None = None) -> Response:
        user, csrf = site.admin(request)
        images = {img.id: img for img in store.images()}
        outcomes = store.replay_all()
        stats = outcome_stats(images.values(), outcomes, site.names)
        # Stage 3 images whose two verdicts are both OOD differ only in the label: candidates for a match.
        disputes = [
            (images[i], [j.label for j in o.stage1.values()])
            for i, o in outcomes.items()
            if o.status is Status.STAGE3 and all(j.verdict is Verdict.OOD for j in o.stage1.values())
        ]
        return site.page(
            request,
            "admin.html",
            user,
            csrf,
            progress=store.progress(),
            stats=stats,
            users=store.users(),
            matches=store.matches(),
            message=message,
            disputes=disputes,
        )

    @app.post("/admin/matches")
    def admin_match(
        request: Request, csrf_token: FormText = "", label_a: FormText = "", label_b: FormText = ""
    ) -> Response:
        user, csrf = site.admin(request)
        _check_csrf(request, csrf, csrf_token)
        try:
            changed = store.add_match(user, label_a, label_b)
        except AnnotateError as exc:
            return RedirectResponse(f"/admin?message={quote(str(exc))}", 303)
        return RedirectResponse(f"/admin?message=Match+recorded%3B+{changed}+image(s)+resolved", 303)


def _image_response(path: Path | None) -> Response:
    if path is None:
        return Response("not found", status_code=404, media_type="text/plain")
    return FileResponse(path, headers={"cache-control": "private, max-age=3600"})


def _file_routes(app: FastAPI, site: _Site) -> None:
    """Images, class examples, the class list and the health check."""
    store = site.store

    def login_required(request: Request) -> Response | None:
        # Files answer 401 rather than redirecting: an <img> cannot follow a login page.
        if store.session_user(request.cookies.get(SESSION_COOKIE)) is None:
            return Response("login required", status_code=401, media_type="text/plain")
        return None

    @app.get("/image/{image_id}")
    def image_file(request: Request, image_id: ImageId) -> Response:
        found = store.session_user(request.cookies.get(SESSION_COOKIE))
        if found is None:
            return Response("login required", status_code=401, media_type="text/plain")
        # An annotator sees the images of their own Stage 1 queue and those in joint review; admins all.
        image = store.image(image_id) if store.may_view(found[0], image_id) else None
        return _image_response(None if image is None else site.project.image_file(image))

    @app.get("/example/{class_index}/{number}")
    def example_file(request: Request, class_index: int, number: int) -> Response:
        if (denied := login_required(request)) is not None:
            return denied
        return _image_response(site.project.example_file(class_index, number))

    @app.get("/api/classes")
    def classes(request: Request) -> Response:
        site.current(request)
        return JSONResponse(list(site.names), headers={"cache-control": "private, max-age=86400"})

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}
