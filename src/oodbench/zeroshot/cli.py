"""`oodbench zeroshot …`: evaluate zero-shot scores from cached embeddings, print Table-2-style tables, build vocabularies."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from ..core.errors import OodbenchError

app = typer.Typer(
    help="Zero-shot VLM OOD scores (MCM … GL-MCM, NegLabel, EOE) and negative-label vocabularies.", no_args_is_help=True
)
vocab_app = typer.Typer(help="Build, import and list versioned label vocabularies.", no_args_is_help=True)
build_app = typer.Typer(
    help="Build a vocabulary (WordNet NegMining, LLM siblings, EOE outliers, union, oracle).", no_args_is_help=True
)
app.add_typer(vocab_app, name="vocab")
vocab_app.add_typer(build_app, name="build")


# Makes the label embedder of a store model: (store, model id, open_clip model, pretrained, device) -> EmbedFn.
# zeroshot does not import extract: the command layer that mounts these commands hands the open_clip one in
# (`use_text_embedder(oodbench.extract.label_embedder.embedder_for)`).
TextEmbedderFactory = Callable[[Path, str, "str | None", "str | None", str], Callable[..., Any]]
_text_embedder: TextEmbedderFactory | None = None


def register(main: typer.Typer) -> None:
    """Mount `oodbench zeroshot …` on the main CLI."""
    main.add_typer(app, name="zeroshot")


def use_text_embedder(factory: TextEmbedderFactory) -> None:
    """Set the factory of label embedders the commands use (the main CLI hands in extract's open_clip one)."""
    global _text_embedder
    _text_embedder = factory


def _default_vocab_dir() -> Path:
    return Path(os.environ.get("OODBENCH_VOCAB_DIR", "vocab"))


VOCAB_DIR = typer.Option(None, "--vocab-dir", help="Vocabulary directory (default: $OODBENCH_VOCAB_DIR or ./vocab).")
CLASSES = typer.Option(
    "imagenet1k",
    "--classes",
    help="ID classes: imagenet1k, imagenet1k:timm, imagenet1k@WNIDS.txt, or a .txt/.json class list.",
)


def _ints(text: str | None, flag: str) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{flag} takes comma-separated integers, e.g. 1,5,10; got {text!r}") from None


def _embedder(
    store: Path, model_id: str, openclip_model: str | None, pretrained: str | None, device: str
) -> Callable[..., Any]:
    """Embedding function over the store's text cache, loading the open_clip model only if something is missing."""
    if _text_embedder is None:
        raise OodbenchError("no text encoder is wired into the zeroshot commands (see use_text_embedder)")
    return _text_embedder(store, model_id, openclip_model, pretrained, device)


def _llm_client(
    vocab_dir: Path,
    base_url: str | None,
    model: str | None,
    api_key: str | None,
    config: Path | None,
    cache: Path | None,
    rpm: float | None,
    timeout: float | None,
    retries: int | None,
    temperature: float | None,
) -> Any:
    from ..text.llm import ChatClient, LLMConfig

    config_obj = LLMConfig.resolve(  # options left None fall back to the config file, then the defaults
        base_url=base_url,
        model=model,
        api_key=api_key,
        config_file=config,
        requests_per_minute=rpm,
        timeout_s=timeout,
        max_retries=retries,
        temperature=temperature,
    )
    return ChatClient(config_obj, cache or vocab_dir / ".llm-cache")


def _save(vocab_dir: Path, vocab: Any) -> None:
    from .vocab.artefact import VocabStore

    stored = VocabStore(vocab_dir).save(vocab)
    deploy = "" if stored.deployable else " (oracle: non-deployable)"
    typer.echo(
        f"{stored.ref}: {len(stored)} labels, kind {stored.kind}{deploy}, hash {stored.hash[:12]} "
        f"-> {vocab_dir / stored.name}"
    )


# ----------------------------------------------------------------------------------------------- evaluate / table
@app.command("evaluate")
def evaluate_command(
    store: Path = typer.Option(..., "--store", help="Feature store with open_clip image (and patch) embeddings."),
    model: list[str] = typer.Option(..., "--model", help="Model id in the store (repeat for several models)."),
    id_dataset: str = typer.Option(..., "--id", help="Dataset id of the ID test set."),
    ood: list[str] = typer.Option(..., "--ood", help="Dataset id of an OOD set (repeat)."),
    classes: str = CLASSES,
    vocab: list[str] | None = typer.Option(None, "--vocab", help="Vocabulary name[@version] (repeat), or 'all'."),
    vocab_dir: Path | None = VOCAB_DIR,
    scores: str | None = typer.Option(None, "--scores", help="Comma-separated scores; default: all."),
    vocab_score: list[str] | None = typer.Option(
        None,
        "--vocab-score",
        help="Score(s) every vocabulary feeds (default: eoe for EOE lists, neglabel for the others).",
    ),
    sweep_k: str | None = typer.Option(None, "--sweep-k", help="Siblings per class to sweep, e.g. 1,2,5,10,20."),
    sweep_m: str | None = typer.Option(None, "--sweep-m", help="WordNet prefix sizes to sweep, e.g. 1000,5000,10000."),
    param: list[str] | None = typer.Option(None, "--param", "-p", help="SCORE.PARAM=VALUE, e.g. neglabel.groups=100."),
    tau: float | None = typer.Option(None, "--tau", help="Temperature of every score (default 0.01)."),
    out: Path = typer.Option(Path("oodbench-zeroshot"), "--out", help="Output folder; one run directory per model."),
    pretrained: str | None = typer.Option(
        None,
        "--pretrained",
        help="Checkpoint path, if the model came from a local file and text embeddings must be computed.",
    ),
    device: str = typer.Option("cpu", "--device", help="Device for computing missing text embeddings."),
    metric: str = typer.Option("fpr95", "--metric", help="Metric of the printed table."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Score ID and OOD sets with every zero-shot score and vocabulary; write runs and print the Table-2 layout.

    Example:
      oodbench zeroshot evaluate --store feats --model ViT-B-16@openai --id imagenet-val --ood ninco \\
          --ood ssb-hard --vocab all --vocab-dir vocab --sweep-k 1,5,10,20 -p neglabel.groups=100 --out runs/zs
    """
    from ..core.store import Store
    from ..text.classes import load_classes
    from ..util.cli_params import parse_params
    from .evaluate import DEFAULT_SCORES, evaluate_zeroshot_store, make_plan
    from .table import load_run, table2_markdown
    from .vocab.artefact import VocabStore

    id_classes = load_classes(classes)
    vocabularies = VocabStore(vocab_dir or _default_vocab_dir()).load_many(vocab or [])
    names = [s.strip() for s in scores.split(",") if s.strip()] if scores else list(DEFAULT_SCORES)
    views = []
    for model_id in model:
        # WordNet lists are mined with one model's text tower: each model gets only its own (or model-free) ones.
        usable = [v for v in vocabularies if v.provenance.get("model") in (None, model_id)]
        for other in sorted({v.ref for v in vocabularies} - {v.ref for v in usable}):
            typer.secho(f"{model_id}: not using {other} (mined with another model)", fg=typer.colors.YELLOW, err=True)
        plan = make_plan(
            names,
            usable,
            vocab_scores=vocab_score or None,
            sweep_k=_ints(sweep_k, "--sweep-k"),
            sweep_m=_ints(sweep_m, "--sweep-m"),
            params=parse_params(param),
            tau=tau,
        )
        typer.echo(f"{model_id}: {len(plan.detectors)} score columns", err=True)
        embed = _embedder(store, model_id, None, pretrained, device)
        result = evaluate_zeroshot_store(
            Store(store),
            model_id,
            id_dataset,
            ood,
            id_classes,
            embed,
            plan,
            out_dir=out / model_id,
            progress=progress,
        )
        for name, reason in result.skipped.items():
            typer.secho(f"{model_id}: skipped {name}: {reason}", fg=typer.colors.YELLOW, err=True)
        views.append(load_run(out / model_id))
    sys.stdout.write(table2_markdown(views, metric=metric))
    typer.echo(f"runs: {', '.join(str(out / m) for m in model)}  (per-run table.md, results.parquet, run.json)")


@app.command("table")
def table_command(
    runs: list[Path] = typer.Argument(..., help="Zero-shot run directories, or folders holding them."),
    ood: str | None = typer.Option(None, "--ood", help="Tabulate one OOD set instead of the mean over all."),
    metric: str = typer.Option("fpr95", "--metric", help="fpr95, auroc, aupr_in or aupr_out."),
    sweeps: bool = typer.Option(False, "--sweeps", help="Also print the k / M sweep tables of each run."),
) -> None:
    """Print the Fi-ImageNet-1k paper's Table-2 layout (rows = models; best logit-space, EOE, WN, LLM, WN+LLM, oracle).

    Example:
      oodbench zeroshot table runs/zs --metric fpr95
    """
    from .table import find_runs, load_run, sweep_markdown, table2_markdown

    views = [load_run(path) for path in find_runs(runs)]
    sys.stdout.write(table2_markdown(views, metric=metric, ood=ood))
    if sweeps:
        for view in views:
            block = sweep_markdown(view, metric=metric)
            if block:
                sys.stdout.write(f"\n### {view.model}\n\n{block}")


@app.command("scores")
def scores_command() -> None:
    """List the zero-shot scores with what they need, their defaults and papers.

    Example:
      oodbench zeroshot scores
    """
    from rich.table import Table

    from ..util.terminal import print_table
    from .scores import SCORES

    table = Table(title="zero-shot scores (higher = more in-distribution)")
    for column in ("name", "needs", "defaults", "paper"):
        table.add_column(column, overflow="fold")
    for name, spec in SCORES.items():
        needs = (
            ["ID label embeddings"]
            + ([f"{spec.vocabulary} vocabulary"] if spec.vocabulary else [])
            + (["patch embeddings"] if spec.needs_patches else [])
        )
        defaults = ", ".join(f"{k}={v!r}" for k, v in spec.defaults.items())
        table.add_row(name, ", ".join(needs), defaults, f"{spec.paper.citation} ({spec.paper.venue})")
    print_table(
        table,
        legend="needs: what the score reads (label embeddings from the store, a negative-label vocabulary, patch "
        "embeddings); defaults: its parameters.",
    )


# ----------------------------------------------------------------------------------------------- vocabularies
@vocab_app.command("list")
def vocab_list(vocab_dir: Path | None = VOCAB_DIR) -> None:
    """List stored vocabularies and their versions.

    Example:
      oodbench zeroshot vocab list --vocab-dir vocab
    """
    from .vocab.artefact import VocabStore

    rows = VocabStore(vocab_dir or _default_vocab_dir()).summaries()
    if not rows:
        typer.echo("no vocabularies stored")
    for row in rows:
        flag = "" if row["deployable"] else "  [oracle: non-deployable]"
        typer.echo(
            f"{row['name']}@v{row['version']}  {row['kind']:<8} {row['size']:>6} labels  hash {row['hash']}  "
            f"{row['created']}  {row['source']}{flag}"
        )


@vocab_app.command("show")
def vocab_show(
    ref: str = typer.Argument(..., help="name, name@v3 or name@<hash prefix>"),
    vocab_dir: Path | None = VOCAB_DIR,
    limit: int = typer.Option(20, help="How many labels to print."),
) -> None:
    """Print a vocabulary's parameters, provenance and first labels.

    Example:
      oodbench zeroshot vocab show wordnet@v1 --vocab-dir vocab
    """
    from .vocab.artefact import VocabStore

    vocab = VocabStore(vocab_dir or _default_vocab_dir()).load(ref)
    typer.echo(f"{vocab.ref} kind={vocab.kind} deployable={vocab.deployable} size={len(vocab)} hash={vocab.hash}")
    typer.echo("params: " + json.dumps(vocab.params, default=str))
    typer.echo(
        "provenance: "
        + json.dumps({k: v for k, v in vocab.provenance.items() if not isinstance(v, list) or len(v) < 50}, default=str)
    )
    typer.echo("labels: " + ", ".join(vocab.labels[:limit]) + (" …" if len(vocab) > limit else ""))


@vocab_app.command("import")
def vocab_import(
    path: Path = typer.Argument(
        ...,
        help="A .txt (one label per line) or .json (list, or object of lists) file, optionally .gz; "
        "'neglabel:in1k-10k' imports NegLabel's shipped reference negatives.",
    ),
    name: str = typer.Option(..., "--name", help="Vocabulary name."),
    kind: str = typer.Option("custom", "--kind", help="wordnet, siblings, union, oracle, eoe or custom."),
    classes: str = CLASSES,
    k: int | None = typer.Option(None, "--k", help="Siblings per class to keep (per-class JSON only)."),
    keep_prompts: bool = typer.Option(False, help="Keep NegMining prompts ('the nice X') inside labels."),
    vocab_dir: Path | None = VOCAB_DIR,
) -> None:
    """Import a label list made elsewhere (ID names and their WordNet synonyms are removed).

    Example:
      oodbench zeroshot vocab import selected_neg_labels_in1k_10k.txt --name neglabel-ref --kind wordnet
    """
    from ..text.classes import load_classes
    from .vocab.builders import import_vocabulary, neglabel_reference_list

    if str(path) == "neglabel:in1k-10k":
        path = neglabel_reference_list()
    vocab = import_vocabulary(
        path, name=name, kind=kind, id_classes=load_classes(classes), k=k, strip_prompts=not keep_prompts
    )
    _save(vocab_dir or _default_vocab_dir(), vocab)


@build_app.command("wordnet")
def build_wordnet(
    store: Path = typer.Option(..., "--store", help="Store holding (or receiving) the model's text embeddings."),
    model: str = typer.Option(..., "--model", help="Model id in the store."),
    classes: str = CLASSES,
    m: int = typer.Option(5000, "--m", help="How many negatives to keep (NegLabel used 10000)."),
    percentile: float = typer.Option(95.0, help="Percentile of a candidate's cosine to the ID names."),
    pool: str = typer.Option(
        "all",
        "--pool",
        help="Candidate pool: 'all' (every noun and adjective synset, the Fi-ImageNet-1k paper's 79,403 head lemmas) "
        "or 'neglabel' (without noun.animal and noun.food, as NegLabel's corpus: 70,794).",
    ),
    lexicon: Path | None = typer.Option(
        None, "--lexicon", help="Lexicon .tsv.gz (pos, offset, lexname, lemmas) instead of the packaged WordNet 3.0."
    ),
    name: str | None = typer.Option(None, "--name", help="Vocabulary name (default wordnet-<model>)."),
    openclip_model: str | None = typer.Option(
        None, "--openclip-model", help="open_clip name, if the store has no image entry of the model to take it from."
    ),
    pretrained: str | None = typer.Option(None, "--pretrained", help="open_clip pretrained tag or checkpoint path."),
    device: str = typer.Option("cpu", "--device"),
    vocab_dir: Path | None = VOCAB_DIR,
) -> None:
    """Mine WordNet negatives with NegMining for one model (text embeddings cached in the store).

    Example:
      oodbench zeroshot vocab build wordnet --store feats --model ViT-B-16@openai --m 5000 --vocab-dir vocab
    """
    from ..text.classes import load_classes
    from .vocab.lexicon import Lexicon
    from .vocab.wordnet_negmining import mine_wordnet_negatives

    vocab = mine_wordnet_negatives(
        load_classes(classes),
        _embedder(store, model, openclip_model, pretrained, device),
        m=m,
        percentile=percentile,
        pool=pool,
        lexicon=Lexicon.read(lexicon) if lexicon is not None else None,
        name=name or f"wordnet-{model}",
        model=model,
    )
    _save(vocab_dir or _default_vocab_dir(), vocab)


@build_app.command("siblings")
def build_siblings(
    classes: str = CLASSES,
    per_class: int = typer.Option(20, "--per-class", help="Siblings asked for per class and generation."),
    generations: int = typer.Option(1, "--generations", help="Independent generations to merge per class."),
    k: int = typer.Option(20, "--k", help="Siblings kept per class (seeded random order)."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**31 - 1, help="Seed of the per-class order."),
    context: str | None = typer.Option(None, "--context", help="Where the classes come from, e.g. 'ImageNet-1k'."),
    name: str = typer.Option("siblings", "--name"),
    llm_base_url: str | None = typer.Option(
        None,
        "--llm-base-url",
        help="OpenAI-compatible base URL (default $OODBENCH_LLM_BASE_URL), e.g. http://127.0.0.1:8000/v1.",
    ),
    llm_model: str | None = typer.Option(None, "--llm-model", help="Model name (default $OODBENCH_LLM_MODEL)."),
    llm_api_key: str | None = typer.Option(
        None,
        "--llm-api-key",
        help="API key (else the --llm-config file's api_key, else $OODBENCH_LLM_API_KEY or $OPENAI_API_KEY).",
    ),
    llm_config: Path | None = typer.Option(None, "--llm-config", help="JSON/TOML file with LLM settings."),
    llm_cache: Path | None = typer.Option(None, "--llm-cache", help="Request cache (default <vocab-dir>/.llm-cache)."),
    rpm: float | None = typer.Option(None, "--rpm", help="Requests per minute limit."),
    workers: int = typer.Option(4, "--workers", help="Concurrent requests."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds per request (default 120)."),
    retries: int | None = typer.Option(None, "--retries", help="Retries of transient failures (default 5)."),
    temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature (default 1.0)."),
    max_attempts: int = typer.Option(
        3, "--max-attempts", help="How often one run asks a class whose reply gave too few usable names."
    ),
    allow_incomplete: bool = typer.Option(
        False, "--allow-incomplete", help="Save the vocabulary even if some classes got no usable answer."
    ),
    vocab_dir: Path | None = VOCAB_DIR,
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Ask an LLM for fine-grained near siblings of every ID class (cached, resumable).

    Example:
      oodbench zeroshot vocab build siblings --llm-base-url http://127.0.0.1:8000/v1 --llm-model qwen2.5-7b-instruct \\
          --generations 3 --k 20 --context ImageNet-1k --vocab-dir vocab
    """
    from ..text.classes import load_classes
    from ..util.progress import progress_bar
    from .vocab.siblings import generate_siblings

    directory = vocab_dir or _default_vocab_dir()
    id_classes = load_classes(classes)
    client = _llm_client(
        directory, llm_base_url, llm_model, llm_api_key, llm_config, llm_cache, rpm, timeout, retries, temperature
    )
    with progress_bar(progress) as bar:
        task = bar.add_task("LLM siblings", total=len(id_classes) * generations)
        vocab = generate_siblings(
            id_classes,
            client,
            per_class=per_class,
            generations=generations,
            k=k,
            seed=seed,
            workers=workers,
            context=context,
            name=name,
            max_attempts=max_attempts,
            allow_incomplete=allow_incomplete,
            on_progress=lambda _i: bar.advance(task),
        )
    missing = vocab.provenance["classes_without_enough_names"]
    if missing:
        typer.secho(
            f"saved with --allow-incomplete: {len(missing)} classes got too few usable siblings "
            f"(e.g. {missing[:3]}); a rerun asks them again",
            fg=typer.colors.YELLOW,
            err=True,
        )
    _save(directory, vocab)
    typer.echo(f"LLM requests sent {client.stats['requests']}, answered from cache {client.stats['cache_hits']}")


@build_app.command("eoe")
def build_eoe(
    classes: str = CLASSES,
    task: str = typer.Option("far", "--task", help="far, near or fine_grained."),
    prompts: Path | None = typer.Option(
        None,
        "--prompts",
        help="TOML/JSON file with EOE's released prompt texts: run the released protocol (docs/zeroshot.md).",
    ),
    class_type: str | None = typer.Option(
        None, "--class-type", help="With --prompts: the value of {class_type} (the fine-grained prompt's kind)."
    ),
    generation: int = typer.Option(0, "--generation", help="With --prompts: the generation index (one per sample)."),
    size: int = typer.Option(500, "--size", help="Outlier names wanted (L)."),
    per_class: int = typer.Option(3, "--per-class", help="Names per ID class for the near task."),
    super_class: str | None = typer.Option(None, "--super-class", help="Super-category for fine_grained."),
    max_requests: int = typer.Option(10, "--max-requests", help="Requests (far/fine_grained) or attempts (near)."),
    name: str | None = typer.Option(None, "--name", help="Vocabulary name (default eoe-<task>)."),
    llm_base_url: str | None = typer.Option(None, "--llm-base-url", help="OpenAI-compatible base URL."),
    llm_model: str | None = typer.Option(None, "--llm-model", help="Model name."),
    llm_api_key: str | None = typer.Option(
        None, "--llm-api-key", help="API key (else the config file's, else $OODBENCH_LLM_API_KEY or $OPENAI_API_KEY)."
    ),
    llm_config: Path | None = typer.Option(None, "--llm-config", help="JSON/TOML file with LLM settings."),
    llm_cache: Path | None = typer.Option(None, "--llm-cache", help="Request cache (default <vocab-dir>/.llm-cache)."),
    rpm: float | None = typer.Option(None, "--rpm", help="Requests per minute limit."),
    workers: int = typer.Option(4, "--workers", help="Concurrent requests (near task)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds per request."),
    retries: int | None = typer.Option(None, "--retries", help="Retries of transient failures."),
    allow_incomplete: bool = typer.Option(
        False, "--allow-incomplete", help="near task: save even if some classes got no usable answer."
    ),
    vocab_dir: Path | None = VOCAB_DIR,
) -> None:
    """Generate EOE outlier class names (far / near / fine-grained) with an LLM (cached, resumable).

    With --prompts, EOE's released prompts (from your file) and protocol; without, oodbench's own paraphrases.

    Example:
      oodbench zeroshot vocab build eoe --task far --prompts eoe_prompts.toml --name eoe-far --generation 0 \
          --llm-base-url http://127.0.0.1:8000/v1 --llm-model m
    """
    from ..text.classes import load_classes
    from .vocab.eoe import EOE_TASKS, generate_eoe_outliers

    # Everything given is checked before the LLM client is set up or any request is sent.
    if task not in EOE_TASKS:
        raise typer.BadParameter(f"--task must be one of {', '.join(EOE_TASKS)}; got {task!r}")
    if generation < 0:
        raise typer.BadParameter(f"--generation must be >= 0; got {generation}")
    directory = vocab_dir or _default_vocab_dir()
    released = None
    if prompts is not None:
        from .vocab.eoe_release import load_prompt_file

        released = load_prompt_file(prompts)
    elif class_type is not None or generation:
        raise typer.BadParameter("--class-type and --generation go with --prompts")
    id_classes = load_classes(classes)
    client = _llm_client(
        directory, llm_base_url, llm_model, llm_api_key, llm_config, llm_cache, rpm, timeout, retries, None
    )
    if released is not None:
        from .vocab.eoe_release import generate_released_eoe

        _save(
            directory,
            generate_released_eoe(
                id_classes,
                client,
                released,
                style=task,
                size=size,
                per_class=per_class,
                class_type=class_type,
                generation=generation,
                workers=workers,
                name=name,
            ),
        )
        return
    vocab = generate_eoe_outliers(
        id_classes,
        client,
        task=task,
        size=size,
        per_class=per_class,
        super_class=super_class,
        max_requests=max_requests,
        workers=workers,
        name=name,
        allow_incomplete=allow_incomplete,
    )
    _save(directory, vocab)


@build_app.command("union")
def build_union_command(
    wordnet: str = typer.Option(..., "--wordnet", help="WordNet vocabulary name[@version]."),
    siblings: str = typer.Option(..., "--siblings", help="Siblings vocabulary name[@version]."),
    name: str = typer.Option("union", "--name"),
    vocab_dir: Path | None = VOCAB_DIR,
) -> None:
    """Combine WordNet negatives and LLM siblings (the WN+LLM column).

    Example:
      oodbench zeroshot vocab build union --wordnet wordnet-ViT-B-16@openai --siblings siblings --name wn+llm
    """
    from .vocab.artefact import VocabStore
    from .vocab.builders import build_union

    directory = vocab_dir or _default_vocab_dir()
    vocabs = VocabStore(directory)
    _save(directory, build_union(vocabs.load(wordnet), vocabs.load(siblings), name=name))


@build_app.command("oracle")
def build_oracle_command(
    labels: list[Path] | None = typer.Option(None, "--labels", help="File of an OOD set's class names (repeat)."),
    store: Path | None = typer.Option(None, "--store", help="Store whose OOD entries record class names."),
    model: str | None = typer.Option(None, "--model", help="Model id of those entries."),
    dataset: list[str] | None = typer.Option(None, "--dataset", help="OOD dataset id in the store (repeat)."),
    classes: str = CLASSES,
    name: str = typer.Option("oracle", "--name"),
    vocab_dir: Path | None = VOCAB_DIR,
) -> None:
    """The oracle vocabulary: the benchmark's own OOD labels (a non-deployable lower bound).

    Example:
      oodbench zeroshot vocab build oracle --store feats --model ViT-B-16@openai --dataset inat-plants --dataset places
    """
    from ..core.store import Store
    from ..text.classes import load_classes
    from .vocab.builders import build_oracle, oracle_labels_from_store, read_label_file

    sources: dict[str, list[str]] = {}
    for path in labels or []:
        content = read_label_file(path)
        sources[path.name] = content if isinstance(content, list) else [x for v in content.values() for x in v]
    if dataset:
        if store is None or model is None:
            raise typer.BadParameter("--dataset needs --store and --model")
        for dataset_id in dataset:
            sources[dataset_id] = oracle_labels_from_store(Store(store), model, dataset_id)
    _save(vocab_dir or _default_vocab_dir(), build_oracle(sources, load_classes(classes), name=name))
