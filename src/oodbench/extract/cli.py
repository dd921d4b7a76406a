"""`oodbench extract`, `oodbench probe` and `oodbench datasets …`: thin commands over the extraction library."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from ..core.errors import OodbenchError
from ..core.store import Store
from ..util.terminal import print_table

__all__ = [
    "MIN_IMAGE_SIZE",
    "check_image_size",
    "datasets_app",
    "extract_command",
    "lists_app",
    "probe_command",
    "register",
    "rehearse_app",
]

console = Console(stderr=True)
datasets_app = typer.Typer(
    help="Datasets the Fi-ImageNet-1k paper compares: list them, check what is under a data root.", no_args_is_help=True
)


DATASETS_LEGEND = (
    "paper: the table of the Fi-ImageNet-1k paper giving the size; published images: the size it gives; "
    "image list: what defines the set's images (an official list, read from --lists DIR, takes exactly the listed "
    "images); "
    "looked for under --root: the first folder name tried; --json gives every field, `datasets check` the details."
)
CHECK_LEGEND = (
    "status: ok, missing (set not found), images missing (listed images absent), count mismatch (list or folder "
    "differs from the published size) or unreadable (a refused list, such as an official list whose SHA-256 differs, "
    "or with --verify undecodable images); listed: images the set's list names (— = no list, or its official list "
    "not in --lists: every image under the folder); present: images taken; extra: other files under the folder, "
    "ignored; published: the paper's size."
)


def _open_clip_names() -> set[str]:
    """open_clip architecture names, without importing open_clip (slow) unless it is already loaded."""
    import importlib.util
    import sys

    if "open_clip" in sys.modules:
        return set(sys.modules["open_clip"].list_models())
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return set()
    return {
        path.stem
        for location in spec.submodule_search_locations
        for path in Path(location, "model_configs").glob("*.json")
    }


def _kind(model: str, kind: str) -> str:
    """Which library a model name belongs to (`auto`: the one that knows it; ambiguous names need --kind)."""
    if kind not in ("auto", "timm", "open_clip", "hf_clip"):
        raise OodbenchError(f"--kind must be auto, timm, open_clip or hf_clip; got {kind!r}")
    if kind != "auto":
        return kind
    if (Path(model).expanduser() / "config.json").is_file() or (
        "/" in model and not model.startswith(("hf-hub:", "local-dir:")) and not Path(model).exists()
    ):
        return "hf_clip"  # a transformers model: a hub id (owner/name) or a save_pretrained directory
    import timm

    in_clip = model in _open_clip_names() or model.startswith("local-dir:")
    base = model.split(".")[0]
    in_timm = timm.is_model(base) or bool(timm.list_models(base))
    if in_clip and in_timm:
        raise OodbenchError(f"{model!r} names both a timm and an open_clip model; pass --kind timm or --kind open_clip")
    if in_clip:
        return "open_clip"
    if in_timm or model.startswith("hf-hub:"):
        return "timm"
    from ..core.names import suggest

    known = [*timm.list_models(), *sorted(_open_clip_names())]
    raise OodbenchError(f"unknown model {model!r}: neither timm nor open_clip knows it{suggest(base, known)}")


# The smallest --image-size taken: 32 pixels, the total stride of timm's common classifiers (ResNets, ConvNeXt,
# EfficientNet; a ViT's patches are 8 to 32 pixels). Below it a ConvNeXt's last stage sees less than one pixel and
# fails inside the forward pass, after the store entry is started (0 and negative sizes fail the same way).
MIN_IMAGE_SIZE = 32


def check_image_size(image_size: int | None) -> int | None:
    """--image-size as given, or a BadParameter naming it when it is below `MIN_IMAGE_SIZE` pixels."""
    if image_size is not None and image_size < MIN_IMAGE_SIZE:
        raise typer.BadParameter(
            f"--image-size: must be at least {MIN_IMAGE_SIZE} pixels (the total stride of common timm classifiers); "
            f"got {image_size}"
        )
    return image_size


def _dataset_id_from(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._+@=,-]+", "-", path.stem if path.is_file() else path.name).strip("-._")
    return name or "dataset"


def extract_command(
    model: list[str] = typer.Option(
        ...,
        "--model",
        "-m",
        help="timm name (resnet50.a1_in1k), open_clip name (ViT-B-16-quickgelu) or transformers image/text model "
        "(apple/aimv2-large-patch14-224-lit, or a save_pretrained directory). Repeat it to extract several models "
        "in one pass: each image is read and decoded once for all of them.",
    ),
    store: Path = typer.Option(..., "--store", "-s", help="Feature store root."),
    data: Path | None = typer.Option(None, "--data", help="Image folder, file list (.csv/.txt) or ImageNet root."),
    dataset: str | None = typer.Option(
        None, "--dataset", help="Registered dataset name (see `oodbench datasets list`), found under --root."
    ),
    root: Path | None = typer.Option(
        None, "--root", help="Data root for --dataset; for file lists, the folder paths are relative to."
    ),
    image_list: Path | None = typer.Option(
        None, "--list", help="With --dataset: the set's image list (entries relative to its folder under --root)."
    ),
    lists: Path | None = typer.Option(
        None,
        "--lists",
        help="With --dataset: folder of the official image lists (`oodbench datasets lists fetch --to DIR`); "
        "without it, or without the set's list there, the set is every image under its folder.",
    ),
    data_format: str = typer.Option("auto", "--format", help="auto | folder | list | imagenet."),
    split: str = typer.Option("val", "--split", help="ImageNet split for --format imagenet: val or train."),
    no_labels: bool = typer.Option(
        False, "--no-labels", help="Do not store labels (e.g. class folders of an OOD set)."
    ),
    dataset_id: str | None = typer.Option(
        None, "--dataset-id", help="Store dataset id (default: registry name or folder name)."
    ),
    model_id: list[str] = typer.Option(
        [],
        "--model-id",
        help="Store model id (default: derived from the model name and checkpoint); with several --model, one per "
        "model in the same order.",
    ),
    kind: str = typer.Option("auto", "--kind", help="auto | timm | open_clip | hf_clip."),
    pretrained: str = typer.Option(
        "default",
        "--pretrained",
        help="timm: 'default' = hub weights; open_clip: a tag (openai, laion2b_s34b_b88k) or a checkpoint path.",
    ),
    no_pretrained: bool = typer.Option(
        False, "--no-pretrained", help="Random initialisation (seeded; for tests and benchmarks)."
    ),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="Local state dict file for a timm model (.pth/.safetensors)."
    ),
    num_classes: int | None = typer.Option(
        None, "--num-classes", help="timm: classes of the head (default: from the checkpoint)."
    ),
    seed: int = typer.Option(0, "--seed", min=0, max=2**31 - 1, help="Seed of random initialisation."),
    image_size: int | None = typer.Option(
        None, "--image-size", help="timm: override the input resolution (default: the model's)."
    ),
    convert: str = typer.Option(
        "auto",
        "--convert",
        help="timm --checkpoint key naming: auto (detect) | none | efficientnet_pytorch (see docs/extract.md).",
    ),
    mean: str | None = typer.Option(None, "--mean", help="timm: normalisation mean, one value or R,G,B."),
    std: str | None = typer.Option(None, "--std", help="timm: normalisation std, one value or R,G,B."),
    interpolation: str | None = typer.Option(
        None, "--interpolation", help="timm: resize interpolation (bicubic, bilinear, …)."
    ),
    crop_pct: float | None = typer.Option(None, "--crop-pct", help="timm: centre-crop fraction in (0, 1]."),
    crop_mode: str | None = typer.Option(None, "--crop-mode", help="timm: center | squash | border."),
    nac: list[str] = typer.Option([], "--nac", help="NAC layer LAYER[:ALPHA[:POOLING]], repeatable (e.g. layer3:300)."),
    net: list[str] = typer.Option(
        [],
        "--net",
        help="timm: arrays of a network-time detector, METHOD[:KEY=VALUE,...], repeatable "
        "(odin, rankfeat, gram, mds; e.g. odin:epsilon=0.002, gram:layers=layer3+layer4).",
    ),
    patches: bool | None = typer.Option(
        None,
        "--patches/--no-patches",
        help="VLMs: store fp16 value-branch patch embeddings for GL-MCM (default: when the tower has them).",
    ),
    text_labels: Path | None = typer.Option(
        None, "--text-labels", help="open_clip: also cache text embeddings of these label names (one per line)."
    ),
    engine: str = typer.Option("local", "--engine", help="local | ray."),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Ray cluster address (default: RAY_ADDRESS or a local instance)."
    ),
    num_actors: int | None = typer.Option(None, "--num-actors", help="Ray inference actors (default: one per GPU)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Images per forward pass."),
    shard_size: int = typer.Option(4096, "--shard-size", help="Images per store shard (the unit of resumption)."),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=0,
        help="Image decoding processes (local engine; default: one less than the cores available, at most 4).",
    ),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:1 …"),
    amp: bool = typer.Option(True, "--amp/--no-amp", help="Mixed precision on GPU."),
    amp_dtype: str = typer.Option(
        "auto", "--amp-dtype", help="Autocast type on GPU: auto (bfloat16 where supported) | bfloat16 | float16."
    ),
    channels_last: bool = typer.Option(
        False, "--channels-last/--no-channels-last", help="Run the networks in channels-last memory format."
    ),
    decode: str = typer.Option(
        "auto",
        "--decode",
        help="pil (PIL decode + each model's own transform: the reference pixels) | device (JPEGs decoded with "
        "torchvision.io.decode_jpeg on --device, tensor preprocessing; PIL for other files) | auto (device on CUDA).",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Extract features, logits, labels (and head) of a dataset into the store; reruns finish what is missing.

    Example: oodbench extract --model resnet50.a1_in1k --store store --data /data/imagenet --format imagenet --split val
    """
    _run_extract(**locals())


def _numbers(option: str, text: str | None) -> list[float] | None:
    """'0.5' or '0.485,0.456,0.406' as floats (validated further by check_preprocessing)."""
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise OodbenchError(f"{option} takes one number or three separated by commas; got {text!r}") from None


def preprocessing_overrides(opts: dict[str, Any]) -> dict[str, Any]:
    """The explicit preprocessing settings given on the command line (none given: the model's defaults)."""
    given = {
        "mean": _numbers("--mean", opts.get("mean")),
        "std": _numbers("--std", opts.get("std")),
        "interpolation": opts.get("interpolation"),
        "crop_pct": opts.get("crop_pct"),
        "crop_mode": opts.get("crop_mode"),
    }
    return {key: value for key, value in given.items() if value is not None}


def _load_backbone(opts: dict[str, Any], name: str, *, several: bool) -> tuple[Any, Any]:
    """(backbone, VLM bundle or None) of one --model, with the options that apply to it checked.

    With several models, settings meant for one kind (--image-size and the preprocessing overrides, --nac for timm;
    --pretrained TAG and --patches for open_clip) apply to the models of that kind and are ignored by the others.
    """
    from .nac import NacLayer
    from .posthoc_net import parse_specs

    nac_layers = [NacLayer.parse(spec) for spec in opts["nac"]]
    kind = _kind(name, opts["kind"])
    if kind == "timm":
        from .backbones.timm_backbone import load_timm

        if not several and (opts["text_labels"] is not None or opts["patches"]):
            raise OodbenchError("--text-labels and --patches apply to vision-language models only")
        if opts["convert"] != "auto" and opts["checkpoint"] is None:
            raise OodbenchError("--convert applies to --checkpoint files only")
        if not several and opts["pretrained"] not in ("default", "true", "none", "false"):
            raise OodbenchError(
                "for timm models --pretrained takes 'default' (hub weights); use --checkpoint PATH for a file"
            )
        use_hub = not opts["no_pretrained"] and (several or opts["pretrained"] in ("default", "true"))
        backbone = load_timm(
            name,
            pretrained=use_hub,
            checkpoint=opts["checkpoint"],
            seed=opts["seed"],
            nac_layers=nac_layers,
            num_classes=opts["num_classes"],
            image_size=opts["image_size"],
            preprocessing=preprocessing_overrides(opts),
            convert=opts["convert"],
            network=parse_specs(opts["net"]),
        )
        bundle = None
    elif kind == "hf_clip":
        from .backbones.base import resolve_device
        from .hf_clip import HfClipBackbone, load_hf_clip

        if (nac_layers and not several) or opts["checkpoint"] is not None:
            raise OodbenchError("--nac and --checkpoint do not apply to hf_clip models (give a directory)")
        if not several and opts["pretrained"] not in ("default", "true", "none", "false"):
            raise OodbenchError("hf_clip models take their weights from --model (hub id or directory)")
        if not several and (
            preprocessing_overrides(opts) or opts["image_size"] is not None or opts["convert"] != "auto"
        ):
            raise OodbenchError(
                "hf_clip models use their checkpoint's image processor; preprocessing is not overridden"
            )
        bundle = load_hf_clip(
            name,
            str(resolve_device(opts["device"])),
            pretrained=not opts["no_pretrained"] and opts["pretrained"] not in ("none", "false"),
            seed=opts["seed"],
        )
        backbone = HfClipBackbone(bundle, patches=opts["patches"])
    else:
        from .openclip import OpenClipBackbone, load_openclip

        if nac_layers and not several:
            raise OodbenchError("--nac applies to supervised timm models only")
        if not several and (
            preprocessing_overrides(opts) or opts["image_size"] is not None or opts["convert"] != "auto"
        ):
            raise OodbenchError(
                "--mean/--std/--interpolation/--crop-pct/--crop-mode/--image-size/--convert apply to timm models; "
                "open_clip models use the preprocessing their weights were trained with"
            )
        tag = None if opts["no_pretrained"] or opts["pretrained"] in ("none", "false") else opts["pretrained"]
        if opts["checkpoint"] is not None:
            tag = str(opts["checkpoint"])
        if tag == "default":
            raise OodbenchError("open_clip models need --pretrained TAG (e.g. openai) or --no-pretrained")
        from .backbones.base import resolve_device

        bundle = load_openclip(name, tag, device=str(resolve_device(opts["device"])), seed=opts["seed"])
        backbone = OpenClipBackbone(
            bundle, patches=opts["patches"] if not several or opts["patches"] is not True else None
        )
    return backbone, bundle


def _run_extract(**opts: Any) -> None:
    from .dataset_registry import get as get_registered
    from .dataset_registry import open_registered
    from .datasets import open_dataset
    from .pipeline import GroupMember, extract, extract_group
    from .posthoc_net import parse_specs

    if opts["image_list"] is not None and opts["dataset"] is None:
        raise OodbenchError("--list applies to --dataset NAME (a registered set); for --data give the list itself")
    if opts["lists"] is not None and opts["dataset"] is None:
        raise OodbenchError("--lists applies to --dataset NAME (a registered set)")
    if opts["lists"] is not None and not opts["lists"].is_dir():
        raise OodbenchError(f"--lists {opts['lists']} is not a folder; fill one with `oodbench datasets lists fetch`")
    check_image_size(opts["image_size"])  # before a model loads or the store entry starts
    names = list(opts["model"])
    several = len(names) > 1
    if len(set(names)) != len(names):
        raise OodbenchError(f"--model {sorted({n for n in names if names.count(n) > 1})[0]} is given twice")
    model_ids = list(opts["model_id"])
    if model_ids and len(model_ids) != len(names):
        raise OodbenchError(f"give one --model-id per --model ({len(names)} models, {len(model_ids)} ids)")
    if several:
        if opts["checkpoint"] is not None or opts["text_labels"] is not None:
            raise OodbenchError("--checkpoint and --text-labels belong to one model: extract that model on its own")
        if opts["engine"] != "local":
            raise OodbenchError("several --model in one pass need --engine local (each Ray actor runs one model)")
        if opts["data"] is None and opts["dataset"] is None:
            raise OodbenchError("give --data PATH or --dataset NAME --root DIR")
    from .backbones.base import AMP_DTYPES
    from .decode import DECODERS

    if opts["decode"] not in DECODERS:
        raise OodbenchError(f"--decode must be one of {', '.join(DECODERS)}; got {opts['decode']!r}")
    if opts["amp_dtype"] not in AMP_DTYPES:
        raise OodbenchError(f"--amp-dtype must be one of {', '.join(AMP_DTYPES)}; got {opts['amp_dtype']!r}")
    if opts["net"] and not any(_kind(name, opts["kind"]) == "timm" for name in names):
        raise OodbenchError("--net applies to supervised timm models only")
    parse_specs(opts["net"])  # a bad setting fails before any model loads
    store = Store(opts["store"])
    loaded: list[tuple[Any, Any]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        for name in names:
            loaded.append(_load_backbone(opts, name, several=several))
    for warning in caught:
        console.print(f"[yellow]warning:[/yellow] {warning.message}")
    from .backbones.base import describe_preprocessing

    for backbone, _ in loaded:
        overrides = getattr(backbone, "preprocessing_overrides", None)
        console.print(f"preprocessing of {backbone.name}: {describe_preprocessing(backbone.preprocessing, overrides)}")
    backbone, bundle = loaded[0]
    model_id = model_ids[0] if model_ids else backbone.default_model_id()
    if bundle is not None and opts["text_labels"] is not None:
        from .openclip import cached_text_embeddings

        labels = [
            line.strip() for line in Path(opts["text_labels"]).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
        embeddings = cached_text_embeddings(store, model_id, labels, model_bundle=bundle)
        from .openclip import text_dataset_id

        console.print(
            f"text embeddings of {len(labels)} labels: {model_id}/{text_dataset_id(labels)} {embeddings.shape}"
        )
    if opts["data"] is None and opts["dataset"] is None:
        if opts["text_labels"] is None:
            raise OodbenchError("give --data PATH or --dataset NAME --root DIR")
        return
    if opts["dataset"] is not None:
        if opts["root"] is None:
            raise OodbenchError("--dataset needs --root DIR (the folder holding the datasets)")
        images = open_registered(opts["dataset"], opts["root"], list_file=opts["image_list"], lists=opts["lists"])
        dataset_id = opts["dataset_id"] or get_registered(opts["dataset"]).name
        if "absent_list" in images.source:
            console.print(
                f"[yellow]{dataset_id}: every image under the folder taken ({len(images):,}); "
                f"{images.source['absent_list']}[/yellow]",
                soft_wrap=True,
                highlight=False,
            )
        if "listed" in images.source:
            console.print(
                f"{dataset_id}: {len(images):,} listed images taken; ignored {images.source['ignored']:,} other "
                f"file(s) beside them; list: {images.source['image_list']}",
                soft_wrap=True,
                highlight=False,
            )
    else:
        images = open_dataset(
            opts["data"],
            format=opts["data_format"],
            split=opts["split"],
            labels=not opts["no_labels"],
            root=opts["root"],
        )
        default_id = (
            f"imagenet-1k-{opts['split']}"
            if opts["data_format"] == "imagenet"
            else _dataset_id_from(Path(opts["data"]))
        )
        dataset_id = opts["dataset_id"] or default_id
    if opts["no_labels"] and images.labels is not None:
        from .datasets import ImageList

        images = ImageList(images.root, images.items, None, None, images.source)
    # The checkpoint check runs on ID data only: labelled sets that are not registered as OOD (OOD sets are
    # extracted with --no-labels; noise or textures may rightly all get one class).
    registered_ood = opts["dataset"] is not None and get_registered(opts["dataset"]).role == "ood"
    if opts["checkpoint"] is not None and backbone.kind == "timm" and images.labels is not None and not registered_ood:
        from .checks import probe_predictions

        if opts["engine"] == "local":
            backbone.to(opts["device"])
        check = probe_predictions(backbone, images)
        if check is not None:
            hits = "" if check.correct is None else f", {check.correct} matching their labels"
            console.print(f"probe: top-1 of the first {check.n} images: {check.shown()}{hits}", markup=False)
            for message in check.warnings:
                console.print(f"[yellow]warning:[/yellow] {message}")
    from .backbones.base import resolve_device
    from .decode import resolve_decode

    decode = resolve_decode(opts["decode"], resolve_device(opts["device"]))
    shared_pass = several or decode == "device" or opts["channels_last"] or opts["amp_dtype"] != "auto"
    if shared_pass and opts["engine"] != "local":
        raise OodbenchError("--decode device, --channels-last and --amp-dtype need --engine local")
    if shared_pass:
        members = [
            GroupMember(b, model_ids[i] if model_ids else None, opts["batch_size"]) for i, (b, _) in enumerate(loaded)
        ]
        reports = []
        for group in _passes(members, resolve_device(opts["device"])):
            if len(group) < len(members):
                console.print(f"pass of {len(group)} model(s): {', '.join(m.backbone.name for m in group)}")
            reports += extract_group(
                store,
                group,
                images,
                dataset_id=dataset_id,
                shard_size=opts["shard_size"],
                num_workers=opts["workers"],
                device=opts["device"],
                amp=opts["amp"],
                amp_dtype=opts["amp_dtype"],
                decode=decode,
                channels_last=opts["channels_last"],
                progress=opts["progress"],
            )
    else:
        engine_options: dict[str, Any] = {}
        if opts["engine"] == "ray":
            engine_options = {"address": opts["ray_address"], "num_actors": opts["num_actors"]}
        reports = [
            extract(
                store,
                backbone,
                images,
                dataset_id=dataset_id,
                model_id=model_id,
                engine=opts["engine"],
                batch_size=opts["batch_size"],
                shard_size=opts["shard_size"],
                num_workers=opts["workers"],
                device=opts["device"],
                amp=opts["amp"],
                progress=opts["progress"],
                engine_options=engine_options,
            )
        ]
    for report in reports:
        _print_report(report)
    decoded = reports[0].decode
    if decoded and decoded.get("device"):
        console.print(f"decoded on the device: {decoded['device']} images; by PIL (other files): {decoded['pil']}")


def _passes(members: list[Any], device: Any) -> list[list[Any]]:
    """On a GPU, the models packed into passes that fit its free memory (estimated); elsewhere all in one pass.

    On CPU the models are already loaded in host memory, so packing by it would only count them twice.
    """
    if device.type != "cuda" or len(members) == 1:
        return [members]
    from .passes import BUDGET_FRACTION, device_memory, footprint_of, pack_passes

    sizes = [footprint_of(m.backbone, m.batch_size).nbytes for m in members]
    budget = int(device_memory(device) * BUDGET_FRACTION)
    return [[members[i] for i in group] for group in pack_passes(sizes, budget)]


def _print_report(report: Any) -> None:
    rate = f", {report.images_per_second:.1f} images/s" if report.processed else " (already complete)"
    console.print(
        f"[green]{report.model_id}/{report.dataset_id}[/green]: {report.num_rows} of {report.num_items} images "
        f"stored in {report.path}{rate}" + ("; head stored" if report.head_written else "")
    )
    if report.skipped:
        console.print(f"[yellow]{len(report.skipped)} unreadable image(s) skipped[/yellow] (listed in meta.json):")
        for item in report.skipped[:10]:
            console.print(f"  {item['path']}: {item['error']}")
        if len(report.skipped) > 10:
            console.print(f"  … and {len(report.skipped) - 10} more")


def probe_command(
    store: Path = typer.Option(..., "--store", "-s", help="Feature store root."),
    model_id: str = typer.Option(..., "--model-id", help="Model id of the frozen backbone's embeddings."),
    fit_dataset: str = typer.Option(..., "--fit-dataset", help="Labelled dataset id to train the probe on."),
    apply_to: list[str] = typer.Option([], "--apply-to", help="Dataset ids to write probe logits for (repeatable)."),
    probe_id: str | None = typer.Option(None, "--probe-id", help="Model id of the probe (default <model-id>+probe)."),
    method: str = typer.Option(
        "auto", "--method", help="auto | lbfgs (full batch in memory) | streamed (full batch, chunked) | minibatch."
    ),
    val_fraction: float = typer.Option(0.1, "--val-fraction", help="Held-out share of every class for early stopping."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**31 - 1, help="Seed of the split and of mini-batch order."),
    weight_decay: float | None = typer.Option(
        None, "--weight-decay", help="L2 penalty on the standardised weights (default: chosen on the held-out rows)."
    ),
    max_epochs: int = typer.Option(100, "--max-epochs", help="Upper bound on epochs (L-BFGS: outer steps)."),
    patience: int = typer.Option(5, "--patience", help="Epochs without validation improvement before stopping."),
    batch_size: int = typer.Option(4096, "--batch-size", help="Mini-batch size."),
    lr: float = typer.Option(1e-2, "--lr", help="AdamW peak learning rate, cosine-decayed (mini-batch)."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda."),
) -> None:
    """Train a linear probe on cached embeddings, store it as a head, and write logits for datasets.

    Example: oodbench probe --store store --model-id vit_base_patch14_dinov2.lvd142m --fit-dataset imagenet-1k-train --apply-to imagenet-1k-val --apply-to ninco
    """
    from .probe import ProbeConfig, run_probe

    config = ProbeConfig(
        val_fraction=val_fraction,
        seed=seed,
        weight_decay=weight_decay,
        method=method,
        max_epochs=max_epochs,
        patience=patience,
        batch_size=batch_size,
        lr=lr,
    )
    report = run_probe(
        Store(store), model_id, fit_dataset, apply_to=apply_to, probe_id=probe_id, config=config, device=device
    )
    if report.result is not None:
        r = report.result
        console.print(
            f"probe trained ({r.method}): {r.train_rows} train / {r.val_rows} held-out rows, best epoch "
            f"{r.best_epoch}, weight decay {r.weight_decay:g}, held-out loss {r.val_loss:.4f}, accuracy {r.val_accuracy:.4f}"
        )
        if r.stopped_at_cap:
            console.print(
                "[yellow]warning: the epoch cap stopped the probe while it still improved; raise --max-epochs"
            )
    else:
        console.print(f"reusing the stored probe {report.probe_id}")
    console.print(f"[green]{report.probe_id}[/green]: head and logits for {', '.join(report.datasets)}")


@datasets_app.command("list")
def datasets_list(json_output: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the registered datasets with their published sizes, image lists and layouts.

    Example: oodbench datasets list
    """
    from dataclasses import asdict

    from .dataset_registry import REGISTRY

    if json_output:
        typer.echo(json.dumps({name: asdict(entry) for name, entry in REGISTRY.items()}, indent=2))
        return
    table = Table("name", "role", "paper", "published images", "image list", "looked for under --root")
    for entry in REGISTRY.values():
        expected = f"{entry.expected_count:,}" if entry.expected_count is not None else "—"
        table.add_row(
            entry.name,
            entry.role,
            entry.table or "—",
            expected,
            entry.image_list(short=True),
            entry.folders[0],
        )
    print_table(table, legend=DATASETS_LEGEND)


def _parse_lists(values: list[str]) -> dict[str, str]:
    """`--list NAME=FILE` options as {name: file}."""
    from .dataset_registry import get

    lists: dict[str, str] = {}
    for value in values:
        name, sep, file = value.partition("=")
        if not sep or not name or not file:
            raise OodbenchError(f"--list takes NAME=FILE (e.g. imagenet-ood=imagenetood.txt); got {value!r}")
        lists[get(name).name] = file
    return lists


def _count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


@datasets_app.command("check")
def datasets_check(
    root: Path = typer.Option(..., "--root", help="Folder holding the datasets."),
    only: list[str] = typer.Option([], "--only", help="Check only these registered names (repeatable)."),
    list_files: list[str] = typer.Option(
        [], "--list", help="NAME=FILE: the image list of a set (entries relative to its folder); repeatable."
    ),
    lists: Path | None = typer.Option(
        None,
        "--lists",
        help="Folder of the official image lists (`oodbench datasets lists fetch --to DIR`); a set whose list is "
        "not there is checked as every image under its folder.",
    ),
    verify: bool = typer.Option(False, "--verify", help="Also decode every image (slow) and list unreadable ones."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON."),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 if anything is missing, mismatched, incomplete or unreadable."
    ),
) -> None:
    """Tell per set how many images its list names, how many are present, missing or extra, against its published size.

    Example: oodbench datasets check --root /data/ood --lists /data/imagelists --only ninco --only clean-ood

    Example: oodbench datasets check --root /data/ood --only imagenet-ood --list imagenet-ood=imagenetood.txt
    """
    from .dataset_registry import check

    report = check(root, datasets=only or None, verify=verify, list_files=_parse_lists(list_files), lists=lists)
    if json_output:
        typer.echo(json.dumps([status.as_dict() for status in report], indent=2))
    else:
        colours = {
            "ok": "green",
            "missing": "red",
            "images missing": "red",
            "count mismatch": "yellow",
            "unreadable": "red",
        }
        table = Table("dataset", "status", "listed", "present", "missing", "extra", "published", "path", "details")
        for status in report:
            colour = colours.get(status.status, "cyan")
            table.add_row(
                status.name,
                f"[{colour}]{status.status}[/{colour}]",
                _count(status.listed),
                _count(status.found if status.listed is None else status.present),
                _count(status.missing_images),
                _count(status.extra),
                _count(status.expected),
                status.path or "—",
                status.message,
            )
        print_table(table, legend=CHECK_LEGEND)
        absent = [s.name for s in report if s.official_list == "missing"]
        if absent:
            where = f"in {lists}" if lists is not None else "(no --lists DIR given)"
            console.print(
                f"[yellow]{len(absent)} set(s) checked without their official image list, not found {where}: "
                f"{', '.join(absent)}; get the lists with `oodbench datasets lists fetch --to DIR` "
                "(or put the files there by hand: `oodbench datasets lists show`), then --lists DIR[/yellow]",
                soft_wrap=True,
                highlight=False,
            )
    bad = [
        s for s in report if s.status in ("missing", "count mismatch", "images missing", "unreadable") or s.unreadable
    ]
    if strict and bad:
        raise typer.Exit(1)


lists_app = typer.Typer(
    help="The official OOD image lists: where each comes from, and fetching them into a lists folder.",
    no_args_is_help=True,
)
datasets_app.add_typer(lists_app, name="lists")

LISTS_LEGEND = (
    "file: its name in the lists folder; source: repository @ commit, path in it (licence); entries: what the file "
    "holds; sets: the registered sets it defines; here: ok (checksum verified), absent, or modified (refused)."
)


@lists_app.command("show")
def lists_show(
    lists: Path | None = typer.Option(None, "--lists", help="A lists folder: say which files are there and intact."),
    json_output: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Name each official image list: repository, commit, path, licence, size, SHA-256 and raw URL.

    Example: oodbench datasets lists show --lists /data/imagelists
    """
    import hashlib
    from dataclasses import asdict

    from .dataset_registry import REGISTRY
    from .imagelists import LIST_SOURCES

    def state(file: str) -> str:
        if lists is None:
            return "—"
        path = lists / file
        if not path.is_file():
            return "absent"
        intact = hashlib.sha256(path.read_bytes()).hexdigest() == LIST_SOURCES[file].sha256
        return "ok" if intact else "modified"

    sets = {
        file: [n for n, e in REGISTRY.items() if e.official_list is not None and file in e.official_list.files]
        for file in LIST_SOURCES
    }
    if json_output:
        rows = [
            {**asdict(source), "url": source.url, "sets": sets[file], "state": state(file)}
            for file, source in LIST_SOURCES.items()
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("file", "source", "entries", "sets", "sha256", "here")
    for file, source in LIST_SOURCES.items():
        table.add_row(
            file,
            f"{source.describe()} {source.url}",
            f"{source.entries:,} {source.unit}",
            ", ".join(sets[file]),
            source.sha256,
            state(file),
        )
    print_table(table, legend=LISTS_LEGEND)


@lists_app.command("fetch")
def lists_fetch(
    to: Path = typer.Option(..., "--to", help="The lists folder to fill (created if absent)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for each download."),
) -> None:
    """Download each official image list from its authors' repository at the pinned commit, verified by SHA-256.

    A file already there with the pinned checksum is kept; each download is checked before it is written. Without
    network access, download the files `oodbench datasets lists show` names into the folder by hand.

    Example: oodbench datasets lists fetch --to /data/imagelists
    """
    from .imagelists import FetchResult, fetch_lists

    def report(result: FetchResult) -> None:
        typer.echo(f"{result.action:<16} {result.path} ({result.size:,} bytes, {result.source.describe()})")

    if timeout <= 0:
        raise OodbenchError(f"--timeout must be positive; got {timeout}")
    results = fetch_lists(to, timeout=timeout, progress=report)
    typer.echo(f"{len(results)} official image lists in {to}, checksums verified; use them with --lists {to}")


rehearse_app = typer.Typer(
    help="Rehearse the Fi-ImageNet-1k experiment on generated data at the real layouts and counts.",
    no_args_is_help=True,
)


@rehearse_app.command("make-root")
def rehearse_make_root(
    root: Path = typer.Argument(..., help="The data root to write (created; resumed where files are present)."),
    lists: Path = typer.Option(
        ..., "--lists", help="Folder of the official image lists (`oodbench datasets lists fetch --to DIR`)."
    ),
    sets: list[str] = typer.Option(
        [], "--sets", help="Only these sets (repeatable; default: all the Fi config reads)."
    ),
    scale: float = typer.Option(1.0, "--scale", help="Share of ImageNet-1k train (the fit set) to write, in (0, 1]."),
    fraction: float = typer.Option(1.0, "--fraction", help="Share of every test set to write, in (0, 1]."),
    workers: int | None = typer.Option(None, "--workers", help="Writer processes (default: the cores)."),
) -> None:
    """Write a data root holding every set the Fi config reads, with their real folders, file names and counts.

    Each file is a tiny image whose pixels derive from its path, plus deliberate defects (truncated, CMYK, 16-bit,
    EXIF-rotated, empty, HTML, unlisted files); rehearsal.json in the root lists them. docs/rehearsal.md shows the
    run on it with stand-in models (OODBENCH_STAND_INS=1).

    Example: oodbench rehearse make-root /data/rehearsal --lists /data/imagelists --scale 0.1
    """
    from .rehearsal import make_root

    report = make_root(root, lists=lists, sets=sets or None, scale=scale, fraction=fraction, workers=workers)
    typer.echo(
        f"{report.files:,} files under {report.root} ({report.written:,} written, {report.present:,} already there, "
        f"{report.bytes / 1e6:,.1f} MB) in {report.seconds:,.1f} s ({report.files_per_second:,.0f} files/s); "
        f"what was written: {report.manifest}"
    )


def register(app: typer.Typer) -> None:
    """Add `extract`, `probe` and the `datasets` and `rehearse` groups to the main CLI."""
    app.command("extract")(extract_command)
    app.command("probe")(probe_command)
    app.add_typer(datasets_app, name="datasets")
    app.add_typer(rehearse_app, name="rehearse")
