"""`oodbench annotate …`: build an OOD benchmark from label errors with a multi-annotator web app.

Web dependencies (FastAPI, SQLAlchemy, …; the `web` extra) are imported inside the commands, so
the rest of the CLI works without them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from ..core.errors import OodbenchError

app = typer.Typer(
    help="Construct an OOD benchmark from label errors: candidates, evidence, 3-stage annotation, export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
user_app = typer.Typer(help="Annotator accounts.", no_args_is_help=True)
app.add_typer(user_app, name="user")

F = TypeVar("F", bound=Callable[..., Any])


def _friendly(func: F) -> F:
    """Turn oodbench errors into a one-line message and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OodbenchError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None
        except ModuleNotFoundError as exc:
            from ..util.extras import missing_extra_message

            typer.secho(f"error: {missing_extra_message(exc.name, 'web')}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _open(project: Path) -> Any:
    from .project import Project

    return Project.open(project)


PROJECT_ARG = typer.Argument(..., help="Project folder (created by `init`).")


@app.command()
@_friendly
def init(
    project: Path = PROJECT_ARG,
    images: Path | None = typer.Option(
        None, "--images", help="Folder holding the candidate images (searched recursively)."
    ),
    demo: bool = typer.Option(
        False, "--demo", help="Build a sample project (real ReaL/MTurk candidates, generated images, accounts)."
    ),
    real: Path | None = typer.Option(
        None, "--real", help="ReaL real.json (images with an empty label list), or 'builtin' (timm's copy)."
    ),
    mturk: Path | None = typer.Option(
        None, "--mturk", help="Northcutt et al. imagenet_mturk.json (majority 'neither'), or 'builtin' (shipped)."
    ),
    mturk_min_neither: int | None = typer.Option(None, help="Votes for 'neither' needed (default: a strict majority)."),
    table: Path | None = typer.Option(None, "--table", help="Generic JSONL/JSON/CSV/TSV re-annotation with flags."),
    mapping: Path | None = typer.Option(None, "--mapping", help="JSON column mapping for --table (see docs)."),
    original_labels: Path | None = typer.Option(
        None,
        "--original-labels",
        help="Original labels for --real: .npy, one int per line, imagenet_val_set_index_to_filepath.json, "
        "or 'builtin' (the shipped copy of that file).",
    ),
    classes: str = typer.Option(
        "imagenet1k:timm",
        help="Class list: imagenet1k:timm (timm's lemmas), imagenet1k (CLIP names), a .txt/.json file.",
    ),
    examples: Path | None = typer.Option(None, "--examples", help="ImageFolder-style ID root for example images."),
    public_url: str | None = typer.Option(
        None, "--public-url", help="Public URL template of the images for reverse search, e.g. https://host/{path}."
    ),
    db_url: str | None = typer.Option(None, "--db-url", help="SQLAlchemy URL (default: SQLite in the project)."),
    skip_missing: bool = typer.Option(False, help="Import the candidates whose image files exist, skip the rest."),
) -> None:
    """Create a project from candidate sources and a folder of images (reruns add new candidates).

    Example: oodbench annotate init proj --images /data/imagenet/val --real builtin
    --original-labels builtin --mturk builtin
    """
    from ..text.classes import load_classes
    from .importers import TableMapping, load_original_labels, read_mturk, read_real, read_table
    from .project import Project, import_candidates

    if demo:
        _init_demo(project, other=[images, real, mturk, table, original_labels, examples, public_url])
        return
    if images is None:
        raise typer.BadParameter("give --images (the folder of the candidate images), or --demo for a sample")
    class_list = load_classes(classes)
    sources = []
    if real is not None:
        labels = load_original_labels(original_labels) if original_labels is not None else None
        sources.append(read_real(real, labels))
    elif original_labels is not None:
        raise typer.BadParameter("--original-labels goes with --real")
    if mturk is not None:
        sources.append(read_mturk(mturk, min_neither=mturk_min_neither))
    if table is not None:
        if mapping is None:
            raise typer.BadParameter("--table needs --mapping (a JSON column mapping)")
        sources.append(read_table(table, TableMapping.from_json(mapping), class_names=class_list.names))
    if not sources:
        raise typer.BadParameter("give at least one candidate source: --real, --mturk or --table")
    proj = Project.create(
        project,
        images,
        class_list,
        example_root=str(examples) if examples else None,
        public_url_template=public_url,
        db_url=db_url,
    )
    counts = import_candidates(proj, sources, skip_missing=skip_missing)
    for imp in sources:
        typer.echo(f"{imp.source}: {len(imp.candidates)} candidates, {len(imp.confusion_pairs)} re-assignments")
    typer.echo(f"{proj.dir}: {counts['added']} images added, {counts['updated']} updated, {counts['skipped']} skipped")
    if not proj.store().users():
        typer.echo(f"next: oodbench annotate user add {project} NAME --admin")
    proj.close()


def _init_demo(project: Path, other: list[Any]) -> None:
    from .sample import ACCOUNTS, build_sample

    if any(value is not None for value in other):
        raise typer.BadParameter("--demo builds its own candidates and images; give it only the project folder")
    proj, password = build_sample(project)
    progress = proj.store().progress()
    typer.echo(f"{proj.dir}: sample project with {progress['total']} images (real ReaL and MTurk candidates,")
    typer.echo("  generated images, evidence from a tiny colour-histogram model)")
    typer.echo(f"accounts: {', '.join(ACCOUNTS)} (admin is an administrator); password for all: {password}")
    typer.echo(f"next: oodbench annotate serve {project}   then open http://127.0.0.1:8000")
    proj.close()


@user_app.command("add")
@_friendly
def user_add(
    project: Path = PROJECT_ARG,
    name: str = typer.Argument(..., help="Login name."),
    admin: bool = typer.Option(False, "--admin", help="May see the admin page and declare label matches."),
    password: str = typer.Option(
        ...,
        prompt=True,
        hide_input=True,
        confirmation_prompt=True,
        envvar="OODBENCH_PASSWORD",
        help="Password (prompted; or from OODBENCH_PASSWORD).",
    ),
) -> None:
    """Create an annotator account.

    Example: oodbench annotate user add proj alice --admin
    """
    proj = _open(project)
    user = proj.store().add_user(name, password, is_admin=admin)
    typer.echo(f"created {'admin ' if user.is_admin else ''}user {user.name}")
    proj.close()


@user_app.command("password")
@_friendly
def user_password(
    project: Path = PROJECT_ARG,
    name: str = typer.Argument(..., help="Login name."),
    password: str = typer.Option(
        ...,
        prompt=True,
        hide_input=True,
        confirmation_prompt=True,
        envvar="OODBENCH_PASSWORD",
        help="New password (prompted; or from OODBENCH_PASSWORD).",
    ),
) -> None:
    """Set a new password (ends the user's sessions).

    Example: oodbench annotate user password proj alice
    """
    proj = _open(project)
    proj.store().set_password(name, password)
    typer.echo(f"password of {name} changed")
    proj.close()


@user_app.command("list")
@_friendly
def user_list(project: Path = PROJECT_ARG) -> None:
    """List accounts.

    Example: oodbench annotate user list proj
    """
    proj = _open(project)
    for user in proj.store().users():
        typer.echo(f"{user.name}{' (admin)' if user.is_admin else ''}")
    proj.close()


@app.command()
@_friendly
def evidence(
    project: Path = PROJECT_ARG,
    image_embeddings: Path | None = typer.Option(
        None, help="N×D .npy of image embeddings (e.g. cached open_clip); or use --store."
    ),
    keys: Path | None = typer.Option(None, help="Text file naming the image of each embedding row (file name or key)."),
    text_embeddings: Path | None = typer.Option(
        None, help="C×D .npy of class-name embeddings, in class order (with --store: default the model's head)."
    ),
    store: Path | None = typer.Option(
        None, "--store", help="Feature store holding the images' features (instead of --image-embeddings/--keys)."
    ),
    entry: str | None = typer.Option(None, "--entry", help="The store entry MODEL/DATASET to read (with --store)."),
    k: int = typer.Option(5, help="How many nearest ID classes to show."),
    model: str | None = typer.Option(None, help="Model name to show with the evidence."),
    per_class: int = typer.Option(3, help="Example images per class (when the project has an example root)."),
) -> None:
    """Add evidence D: the k ID classes a VLM ranks closest to each image.

    Example: oodbench annotate evidence proj --image-embeddings val_img.npy --keys val_keys.txt
    --text-embeddings classnames.npy --model ViT-B-16/openai

    From a feature store: oodbench annotate evidence proj --store store --entry clip-vit-b16/imagenet-val
    --text-embeddings classnames.npy (without --text-embeddings: the model's classifier head rows)
    """
    from .project import add_vlm_evidence, read_keys, store_evidence_inputs

    if store is not None:
        if image_embeddings is not None or keys is not None or entry is None or "/" not in entry:
            raise typer.BadParameter("--store goes with --entry MODEL/DATASET, not with --image-embeddings or --keys")
        model_id, dataset_id = entry.split("/", 1)
        row_keys, images, head = store_evidence_inputs(store, model_id, dataset_id)
        texts = text_embeddings if text_embeddings is not None else head
        if texts is None:
            raise typer.BadParameter(f"{model_id} has no stored head; give --text-embeddings")
        model = model or (model_id if text_embeddings is not None else f"{model_id} (classifier head)")
    elif image_embeddings is None or keys is None or text_embeddings is None:
        raise typer.BadParameter("give --image-embeddings, --keys and --text-embeddings, or --store and --entry")
    else:
        row_keys, images, texts = read_keys(keys), image_embeddings, text_embeddings
    proj = _open(project)
    done = add_vlm_evidence(proj, row_keys, images, texts, k=k, model=model)
    typer.echo(f"VLM evidence added to {done} images")
    if proj.config.example_root:
        typer.echo(f"example images indexed for {proj.index_examples(per_class)} classes")
    proj.close()


@app.command()
@_friendly
def describe(
    project: Path = PROJECT_ARG,
    base_url: str | None = typer.Option(None, help="OpenAI-compatible base URL (or OODBENCH_LLM_BASE_URL)."),
    model: str | None = typer.Option(None, help="Multimodal model name (or OODBENCH_LLM_MODEL)."),
    limit: int | None = typer.Option(None, help="Describe at most this many images."),
    redo: bool = typer.Option(
        False, help="Describe every image again, asking the endpoint again (the cached answers are replaced)."
    ),
    timeout: float | None = typer.Option(None, help="Seconds per request (default: project llm.timeout, else 60)."),
    retries: int | None = typer.Option(None, help="Retries on timeouts, 429, 5xx (default: llm.max_retries, else 3)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Add evidence A: closed-/open-world descriptions from a multimodal LLM (key: OODBENCH_LLM_API_KEY).

    Example: OODBENCH_LLM_API_KEY=… oodbench annotate describe proj --base-url http://127.0.0.1:8080/v1
    --model qwen2-vl-7b
    """
    from ..util.progress import progress_bar
    from .llm import LLMConfig, LLMDescriber
    from .project import describe_images

    proj = _open(project)
    settings = dict(proj.config.llm)
    # Options override the project's llm settings, which override the defaults.
    given = {"timeout": timeout, "max_retries": retries}
    options = {k: v for k, v in settings.items() if k in given} | {k: v for k, v in given.items() if v is not None}
    config = LLMConfig.resolve(
        base_url or settings.pop("base_url", None), model or settings.pop("model", None), **options
    )
    describer = LLMDescriber(config, proj.llm_cache)
    total = len(proj.store().images())
    with progress_bar(progress) as bar:
        task = bar.add_task("describing", total=min(total, limit) if limit else total)
        done = describe_images(proj, describer, limit=limit, redo=redo, progress=lambda: bar.advance(task))
    typer.echo(f"described {done} images (answers cached in {proj.llm_cache})")
    proj.close()


@app.command()
@_friendly
def serve(
    project: Path = PROJECT_ARG,
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8000, help="TCP port."),
    trusted_proxy: list[str] | None = typer.Option(
        None,
        "--trusted-proxy",
        help="Address or network (CIDR) of a reverse proxy whose X-Forwarded-For names the client (repeatable). "
        "Without it forwarding headers are ignored.",
    ),
) -> None:
    """Run the annotation web app.

    Example: oodbench annotate serve proj --port 8000   (then open http://127.0.0.1:8000)

    Behind a reverse proxy on the same host: oodbench annotate serve proj --trusted-proxy 127.0.0.1
    """
    import uvicorn

    from .security import parse_trusted_proxies
    from .web import create_app

    parse_trusted_proxies(trusted_proxy or ())  # a bad value is one line and exit 2, before the project opens
    proj = _open(project)
    if host not in ("127.0.0.1", "localhost", "::1") and not proj.config.cookie_secure:
        typer.secho(
            "warning: serving beyond loopback without HTTPS; put it behind a TLS proxy and set "
            '"cookie_secure": true in project.json',
            fg=typer.colors.YELLOW,
            err=True,
        )
    # uvicorn's own proxy handling (on by default, trusting 127.0.0.1) stays off: behind an SSH tunnel every
    # client comes from 127.0.0.1 and could claim any address. The app reads the header from --trusted-proxy only.
    app_ = create_app(proj, trusted_proxies=trusted_proxy or ())
    uvicorn.run(app_, host=host, port=port, log_level="info", access_log=False, proxy_headers=False)


@app.command()
@_friendly
def status(project: Path = PROJECT_ARG) -> None:
    """Print progress and the outcome statistics table.

    Example: oodbench annotate status proj
    """
    from .stats import outcome_stats, stats_markdown

    proj = _open(project)
    store = proj.store()
    progress = store.progress()
    typer.echo(
        f"{progress['total']} images: {progress['stage1']} in Stage 1, {progress['stage3']} in Stage 3, "
        f"{progress['final']} final"
    )
    typer.echo(stats_markdown(outcome_stats(store.images(), store.replay_all(), proj.classes.names)))
    proj.close()


@app.command()
@_friendly
def match(
    project: Path = PROJECT_ARG,
    label_a: str = typer.Argument(..., help="An OOD label."),
    label_b: str = typer.Argument(..., help="An OOD label naming the same concept."),
    by: str = typer.Option(..., "--by", help="Admin account recording the match."),
) -> None:
    """Declare two OOD labels the same concept (an explicit match; append-only).

    Example: oodbench annotate match proj "cell phone" "mobile phone" --by alice
    """
    proj = _open(project)
    store = proj.store()
    user = next((u for u in store.users() if u.name == by), None)
    if user is None or not user.is_admin:
        raise typer.BadParameter(f"{by!r} is not an admin account of this project")
    changed = store.add_match(user, label_a, label_b)
    typer.echo(f"match recorded; {changed} image(s) changed status")
    proj.close()


@app.command()
@_friendly
def release(
    project: Path = PROJECT_ARG, name: str = typer.Argument(..., help="Annotator whose claims to free.")
) -> None:
    """Return an annotator's unsubmitted Stage 1 claims to the pool (e.g. someone left the project).

    Example: oodbench annotate release proj bob
    """
    proj = _open(project)
    typer.echo(f"released {proj.store().release(name)} image(s)")
    proj.close()


@app.command()
@_friendly
def export(
    project: Path = PROJECT_ARG,
    out: Path = typer.Argument(..., help="Output folder."),
    name: str = typer.Option(
        "ood", help="Stem of the OOD file list, e.g. fi-imagenet-1k (read by extract's registry)."
    ),
    relative: bool = typer.Option(False, help="Write file-list paths relative to the output folder."),
) -> None:
    """Write the verified benchmark: extract file lists, manifests, ambiguous list, statistics, event log.

    Example: oodbench annotate export proj bench --name fi-imagenet-1k
    then:    oodbench extract --model resnet50.a1_in1k --store store --data bench/fi-imagenet-1k.csv
    (or --dataset fi-imagenet-1k --root bench)
    """
    from .export import export as run_export
    from .stats import stats_markdown

    proj = _open(project)
    manifest = run_export(proj, out, name=name, relative=relative)
    counts = manifest["counts"]
    typer.echo(
        f"{out}: {counts['ood']} OOD, {counts['id']} returned to ID, {counts['ambiguous']} ambiguous, "
        f"{counts['pending']} pending"
    )
    typer.echo(stats_markdown(manifest["stats"]))
    proj.close()


def register(parent: typer.Typer) -> None:
    """Mount these commands as `oodbench annotate`."""
    parent.add_typer(app, name="annotate")
