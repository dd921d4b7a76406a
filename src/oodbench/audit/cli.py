"""`oodbench audit …`: fingerprint stored splits, run the controlled battery, scan suite class lists, L_k."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from ..util.cli_params import parse_params

app = typer.Typer(
    help="Benchmark audit: leak fingerprint, exclusion contrast, controlled battery, class-list scan.",
    no_args_is_help=True,
)

__all__ = ["app", "register"]


def register(main: typer.Typer) -> None:
    """Mount the audit commands under `oodbench audit`."""
    main.add_typer(app, name="audit")


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())


# Options shared by the commands that run the rule (Typer option markers are plain defaults, safe to reuse).
POOL = typer.Option(
    None,
    "--pool",
    help="Comma-separated pool (registry names or 'iforest'); default: maha, rmaha, maha++, rmaha++, knn, iforest.",
)
PARAM = typer.Option(
    None, "--param", "-p", help="Pool detector hyper-parameter DETECTOR.PARAM=VALUE (repeatable), e.g. knn.k=50."
)
LOGIT = typer.Option(
    "msp,maxlogit,energy", "--logit", help="Head-dependent detectors reported beside the rule ('' for none)."
)
ORACLE = typer.Option(
    0.95, "--oracle-threshold", help="OracleLDA AUROC at or above which the pair counts as separable."
)
COLLAPSE = typer.Option(
    0.65, "--collapse-threshold", help="Best unsupervised AUROC below which detection counts as collapsed."
)
MARGIN = typer.Option(0.10, "--margin", help="Recovery: best AUROC after exclusion >= collapse threshold + margin.")
FOLDS = typer.Option(5, "--folds", min=2, max=1000, help="Stratified folds of the out-of-fold OracleLDA.")
IDENTITY = typer.Option(
    None,
    "--identity-threshold",
    help="Call a recovery inconclusive when the OOD set is this separable from the excluded fit data (off by default).",
)
# Isolation Forest (scikit-learn) takes seeds below 2^32.
SEED = typer.Option(0, "--seed", min=0, max=2**32 - 1, help="Seed of the fold split, subsampling and Isolation Forest.")


def _config(
    pool: str | None,
    param: list[str] | None,
    logit: str,
    oracle: float,
    collapse: float,
    margin: float,
    folds: int,
    identity: float | None,
    seed: int,
    **extra: Any,
) -> Any:
    from .config import AuditConfig

    return AuditConfig(
        pool=_names(pool),
        pool_params=parse_params(param),
        logit_detectors=_names(logit) or (),
        oracle_threshold=oracle,
        collapse_threshold=collapse,
        recovery_margin=margin,
        folds=folds,
        identity_threshold=identity,
        seed=seed,
        **extra,
    )


def _suspects(items: list[str] | None) -> dict[str, list[int]]:
    suspects: dict[str, list[int]] = {}
    for item in items or []:
        dataset, sep, classes = item.partition("=")
        try:
            values = [int(c) for c in classes.split(",") if c.strip()]
        except ValueError:
            values = []
        if not sep or not dataset or not values:
            raise typer.BadParameter(f"{item!r}: expected DATASET=CLASS[,CLASS…], e.g. ssb-hard=3,17")
        suspects[dataset] = values
    return suspects


def _classes(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise typer.BadParameter(f"--classes {text!r}: expected comma-separated class indices, e.g. 0,3") from None


@app.command("fingerprint")
def fingerprint_command(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    model: str = typer.Option(..., "--model", help="Model id in the store."),
    fit: str = typer.Option(..., "--fit", help="Dataset id of the detectors' ID fit set."),
    id_dataset: str = typer.Option(..., "--id", help="Dataset id of the ID test set."),
    ood: list[str] = typer.Option(..., "--ood", help="Designated OOD set to audit (repeat for several)."),
    suspect: list[str] | None = typer.Option(
        None,
        "--suspect",
        help="Fit-set classes to exclude for one OOD set, DATASET=3,17 (default: found automatically).",
    ),
    mode: str | None = typer.Option(
        None,
        "--mode",
        help="Contrast mode: 'label' (exclude suspect classes) or 'nearest' (exclude the fit rows nearest the OOD images).",
    ),
    contrast: str = typer.Option(
        "fired", "--contrast", help="Run the exclusion contrast when the rule 'fired', 'always' or 'never'."
    ),
    pool: str | None = POOL,
    param: list[str] | None = PARAM,
    logit: str = LOGIT,
    oracle_threshold: float = ORACLE,
    collapse_threshold: float = COLLAPSE,
    margin: float = MARGIN,
    folds: int = FOLDS,
    identity_threshold: float | None = IDENTITY,
    seed: int = SEED,
    out: Path = typer.Option(
        Path("oodbench-audit"), "--out", help="Directory for audit.md, audit.json (and audit.html)."
    ),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Fingerprint stored splits for fit-set leakage, run the contrast, adjudicate, write a report.

    Example:
      oodbench audit fingerprint --store feats --model resnet50.tv_in1k --fit imagenet-train \\
          --id imagenet-val --ood ssb-hard --ood ninco --suspect ssb-hard=100,101 --out audits/resnet50
    """
    from .report import AuditDocument, split_sections, write_document
    from .split import audit_store

    config = _config(pool, param, logit, oracle_threshold, collapse_threshold, margin, folds, identity_threshold, seed)
    audits = audit_store(
        store,
        model,
        fit,
        id_dataset,
        ood,
        suspects=_suspects(suspect),
        mode=mode,
        config=config,
        contrast=contrast,
        progress=progress,
    )
    document = AuditDocument(
        f"oodbench audit: {model}",
        split_sections(audits, config),
        {"config": config.to_dict(), "splits": [a.to_dict() for a in audits]},
        subject=f"store {store}, model {model}, fit {fit}, ID test {id_dataset}",
    )
    paths = write_document(document, out, "audit")
    sys.stdout.write(document.markdown())
    typer.echo("report: " + ", ".join(str(p) for p in paths.values()))


@app.command("battery")
def battery_command(
    synthetic: bool = typer.Option(
        False,
        "--synthetic",
        help="Run the synthetic controlled battery (Gaussian classes with leaks and hard clean pairs; no store).",
    ),
    store: Path | None = typer.Option(None, "--store", help="Feature store root."),
    model: str | None = typer.Option(None, "--model", help="Model id in the store."),
    train: str | None = typer.Option(
        None, "--train", help="Labelled train split of the model's classes (the fit set)."
    ),
    test: str | None = typer.Option(None, "--test", help="Labelled test split of the same classes."),
    extra_train: str | None = typer.Option(
        None, "--extra-train", help="Labelled train rows of classes outside the model's labels."
    ),
    extra_test: str | None = typer.Option(None, "--extra-test", help="Labelled test rows of those classes."),
    far: list[str] | None = typer.Option(None, "--far", help="Far-OOD set for clean splits (repeatable)."),
    near: list[str] | None = typer.Option(
        None,
        "--near",
        help="Near-OOD set known to be clean (none of its classes in the fit set), e.g. a hard pair (repeatable).",
    ),
    classes: str | None = typer.Option(
        None, "--classes", help="Comma-separated trained classes to designate (default: all)."
    ),
    pool: str | None = POOL,
    param: list[str] | None = PARAM,
    logit: str = LOGIT,
    oracle_threshold: float = ORACLE,
    collapse_threshold: float = COLLAPSE,
    margin: float = MARGIN,
    folds: int = FOLDS,
    identity_threshold: float | None = IDENTITY,
    seed: int = SEED,
    out: Path = typer.Option(
        Path("oodbench-battery"), "--out", help="Directory for battery.md, battery.json (and battery.html)."
    ),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Audit splits with known answers (leaked / clean) and report the rule's sensitivity and specificity.

    Example (synthetic: 5 leaked / 8 clean splits, two of them hard clean pairs; no store needed):
      oodbench audit battery --synthetic
    Example (any labelled store; `oodbench demo` runs it on the digits demo's store):
      oodbench audit battery --store feats --model m --train cifar10-train --test cifar10-test --far svhn
    """
    from .battery import battery_from_store, make_battery, run_battery
    from .report import battery_document, write_document

    config = _config(pool, param, logit, oracle_threshold, collapse_threshold, margin, folds, identity_threshold, seed)
    wanted = _classes(classes)
    if synthetic:
        if store is not None:
            raise typer.BadParameter("give either --synthetic or --store, not both")
        from .synthetic import synthetic_battery_data

        data = synthetic_battery_data(seed)
        splits = make_battery(data.train, data.test, None, classes=wanted, near=data.near, far=data.far, config=config)
        subject, model = f"the synthetic controlled battery (seed {seed})", "synthetic"
    elif store is None or model is None or train is None or test is None:
        raise typer.BadParameter("give --synthetic, or --store, --model, --train and --test")
    else:
        splits = battery_from_store(
            store,
            model,
            train,
            test,
            extra_train=extra_train,
            extra_test=extra_test,
            far=far or (),
            near=near or (),
            classes=wanted,
            config=config,
        )
        subject = f"store {store}, model {model}, train {train}, test {test}"
    result = run_battery(splits, config, progress=progress)
    document = battery_document(result, config, subject, f"oodbench audit battery: {model}")
    paths = write_document(document, out, "battery")
    typer.echo(
        f"automatic contrast: sensitivity {result.sensitivity:.3f}  specificity {result.specificity:.3f}; "
        f"designated class: {result.designated_sensitivity:.3f} / {result.designated_specificity:.3f}; "
        f"rule alone: {result.rule_sensitivity:.3f} / {result.rule_specificity:.3f} "
        f"({sum(a.meta['kind'] == 'leaked' for a in result.audits)} leaked, "
        f"{sum(a.meta['kind'] == 'clean' for a in result.audits)} clean splits)"
    )
    width = max(len(a.name) for a in result.audits)
    for a in result.audits:
        fp = a.fingerprint
        typer.echo(
            f"{a.name:<{width}}  truth={a.meta['kind']:<6}  verdict={a.verdict.label:<12}  "
            f"designated={result.designated_label(a):<12}  "
            f"OracleLDA={fp.oracle.auroc:.3f}  best={fp.best_auroc:.3f} ({fp.best_detector})"
        )
    typer.echo(result.scope_statement())
    typer.echo("report: " + ", ".join(str(p) for p in paths.values()))


@app.command("scan")
def scan_command(
    suite: list[str] | None = typer.Option(
        None, "--suite", help="Shipped suite name or manifest .json (repeatable; default: all shipped)."
    ),
    label_space: list[str] | None = typer.Option(
        None,
        "--label-space",
        help="Training label space: imagenet-1k, imagenet-21k, imagenet-22k, imagenet-21k-p, imagenet-12k, or a file of wnids/names (repeatable; default: imagenet-1k and imagenet-21k).",
    ),
    details: bool = typer.Option(False, "--details", help="List every related OOD class in the report."),
    out: Path | None = typer.Option(None, "--out", help="Directory for scan.md, scan.json (and scan.html)."),
) -> None:
    """Scan published suites' OOD class lists against training label spaces (no images needed).

    Example:
      oodbench audit scan --label-space imagenet-1k --label-space imagenet-21k --out audits/scan
    """
    from .report import AuditDocument, scan_sections, write_document
    from .scan import scan_suites, suite_scope
    from .suites import load_suites
    from .wordnet import label_space as load_space

    suites = load_suites(list(suite) if suite else None)
    spaces = [load_space(s) for s in (label_space or ["imagenet-1k", "imagenet-21k"])]
    scans = scan_suites(suites, spaces)
    sections = scan_sections(scans, suites, details=details)
    document = AuditDocument(
        "oodbench audit: suite class-list scan",
        sections,
        {
            "scans": [s.to_dict() for s in scans],
            "scope": suite_scope(scans, spaces[0].name, spaces[1].name if len(spaces) > 1 else "imagenet-21k"),
        },
        subject="label spaces: " + ", ".join(f"{s.name} ({len(s)} classes)" for s in spaces),
    )
    paths = write_document(document, out, "scan") if out is not None else {}
    from ..core.tabular import render_markdown

    sys.stdout.write(render_markdown(sections[0].tables[0]))
    if paths:
        typer.echo("report: " + ", ".join(str(p) for p in paths.values()))


@app.command("suites")
def suites_command() -> None:
    """List the shipped suite manifests with their class counts and sources.

    Example:
      oodbench audit suites
    """
    from .suites import load_suites

    for suite in load_suites():
        count = f"{suite.num_classes} classes" if suite.available else "no class list"
        source = suite.source
        typer.echo(
            f"{suite.name:<26} {suite.kind:<11} {count:<14} {source.get('repository', '')} ({source.get('licence', '')})"
        )


@app.command("overlap")
def overlap_command(
    store: Path = typer.Option(..., "--store", help="Feature store root."),
    model: str = typer.Option(..., "--model", help="Model id in the store."),
    id_dataset: str = typer.Option(..., "--id", help="Dataset id of the ID set."),
    ood: list[str] = typer.Option(..., "--ood", help="OOD set (repeatable)."),
    k: int = typer.Option(10, "-k", min=1, max=10_000, help="Neighbours per point."),
    max_rows: int = typer.Option(
        5000, "--max-rows", min=1, max=2**31 - 1, help="Rows per side (uniform subsample beyond)."
    ),
    seed: int = SEED,
) -> None:
    """Overlap index L_k of an ID set and each OOD set (share of neighbours with the other label).

    Example:
      oodbench audit overlap --store feats --model resnet50.tv_in1k --id imagenet-val --ood ssb-hard -k 10
    """
    from ..core.store import Store
    from .overlap import pair_overlap

    root = Store(store)
    root.check_compatible(*[(model, d) for d in (id_dataset, *ood)])
    id_set = root.read(model, id_dataset)
    for dataset in ood:
        value = pair_overlap(id_set, root.read(model, dataset), k=k, max_rows_per_side=max_rows, seed=seed)
        typer.echo(
            f"{dataset}: L_{k} = {value.value:.4f}  (chance {value.chance:.4f}, {value.relative:.2f}x chance; "
            f"ID {value.per_label[1]:.4f}, OOD {value.per_label[0]:.4f}; n = {value.n})"
        )
