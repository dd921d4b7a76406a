"""Evaluate a model on image data in one call: extract into a store (cached), fit, score, return the tidy results.

``evaluate_model(model, id=…, ood={…}, fit=…)`` is the store-backed counterpart of OpenOOD's ``Evaluator``: the
model is a timm name, a timm module, any ``torch.nn.Module`` with a ``forward`` that says where the features and
logits come from, or an extraction `Backbone`; the data are image folders, file lists, `ImageList`s, torch
datasets or data loaders. Covariate-shifted ID sets (``csid={…}``) are extracted and scored too, and counted as ID
in the full-spectrum table; ``net=["odin", …]`` extracts the arrays of the network-time detectors.

With a named ``store`` the second call with the same model and data extracts nothing: each entry is identified by
the model's provenance (name, weights hash, preprocessing) and the dataset's item hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import detectors as detector_registry
from ..core.errors import DataError, ExtractError, OodbenchError
from ..core.oodgroups import OodGroups
from ..core.outputs import Head
from ..core.store import Store
from ..detectors.fitsize import FitSize
from ..evaluation.evaluate import EvaluationResult, evaluate_spec, fit_size_plan, nothing_evaluated
from ..evaluation.spec import EvaluationSpec
from ..extract.backbones.base import Backbone, autocast, safe_id
from ..util.progress import note_work, work_topics

__all__ = ["ModelEvaluation", "ModuleBackbone", "evaluate_model", "as_backbone", "as_image_data"]

FIT, ID = "fit", "id"  # the default names (store dataset ids) of the fit set and the ID test set
# The option that names a set of each role, for the line that refuses a name the store holds for other images.
_NAMING = {"fit": ("--fit", "fit"), "id": ("--id", "id"), "csid": ("--csid", "csid"), "ood": ("--ood", "ood")}
# Items of a torch dataset whose bytes enter its fingerprint (evenly spaced, first and last included).
FINGERPRINT_ITEMS = 8
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass
class ModelEvaluation(EvaluationResult):
    """An `EvaluationResult` plus where it came from: the store, the model id and what this call extracted."""

    store: Path | None = None  # None when a temporary store was used (deleted on return)
    model_id: str = ""
    extracted: dict[str, int] = field(default_factory=dict)  # dataset id -> images run through the model now
    unreadable: dict[str, int] = field(default_factory=dict)  # dataset id -> of those, unreadable: no row stored
    notes: list[str] = field(default_factory=list)  # the preprocessing, checkpoint conversion, probe top-1 lines


def state_hash(module: Any) -> str:
    """SHA-256 of a module's state dict (names, dtypes, shapes and bytes): the identity of its weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def default_transform(image_size: int = 224) -> Callable[[Any], Any]:
    """Resize the short side to 256/224·size, centre crop, ImageNet normalisation: the usual evaluation transform."""
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize(int(round(image_size * 256 / 224))),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class ModuleBackbone(Backbone):
    """Any torch module: ``forward(module, pixels) -> (features, logits)`` says where the arrays come from."""

    kind = "module"

    def __init__(
        self,
        model: Any,
        *,
        forward: Callable[[Any, Any], tuple[Any, Any]] | None,
        head: Any = None,
        transform: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.forward = forward or _default_forward(model)
        self._head_module = head
        transform = transform or default_transform()
        digest = state_hash(model)
        super().__init__(
            model,
            name=name or type(model).__name__,
            checkpoint=f"sha256:{digest}",
            preprocessing={"transform": repr(transform)},
            transform=transform,
        )
        self.digest = digest
        if head is not None and not isinstance(head, torch.nn.Linear):
            raise ExtractError(f"head must be a torch.nn.Linear (features -> logits); got {type(head).__name__}")

    def default_model_id(self) -> str:
        return f"{safe_id(self.name)}@{self.digest[:12]}"

    def head(self) -> Any:
        if self._head_module is None:
            return None
        weight = self._head_module.weight.detach().float().cpu().numpy()
        bias = self._head_module.bias
        bias = np.zeros(weight.shape[0], np.float32) if bias is None else bias.detach().float().cpu().numpy()
        return Head(weight.astype(np.float32), bias.astype(np.float32))

    def infer(self, pixels: Any, *, amp: bool = True) -> dict[str, np.ndarray]:
        with torch.no_grad(), autocast(self.device, amp):
            features, logits = self.forward(self.model, pixels.to(self.device))
        arrays = {"features": _rows(features, "features")}
        if logits is not None:
            arrays["logits"] = _rows(logits, "logits")
        return arrays


def _rows(tensor: Any, what: str) -> np.ndarray:
    array = tensor.detach().float().cpu().numpy()
    if array.ndim == 4 and array.shape[2:] == (1, 1):
        array = array.reshape(array.shape[0], -1)
    if array.ndim != 2:
        raise ExtractError(f"the model's {what} have shape {array.shape}, not (batch, dim)")
    return array


def _default_forward(model: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
    """timm's convention (forward_features, then forward_head with and without pre_logits), else an error."""
    if hasattr(model, "forward_features") and hasattr(model, "forward_head"):

        def forward(module: Any, pixels: Any) -> tuple[Any, Any]:
            hidden = module.forward_features(pixels)
            return module.forward_head(hidden, pre_logits=True), module.forward_head(hidden)

        return forward

    def call(module: Any, pixels: Any) -> tuple[Any, Any]:
        result = module(pixels)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise ExtractError(
                f"cannot tell where the features of a {type(module).__name__} come from: its forward returns "
                f"{type(result).__name__}, not (features, logits); pass forward=fn with fn(module, pixels) -> "
                "(features, logits or None), or a model with forward_features/forward_head"
            )
        return result[0], result[1]

    return call


def as_backbone(
    model: Any,
    *,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    forward: Callable[[Any, Any], tuple[Any, Any]] | None = None,
    head: Any = None,
    transform: Callable[[Any], Any] | None = None,
    image_size: int | None = None,
    net: Sequence[Any] = (),
) -> Any:
    """A `Backbone` from a timm name, a timm module, any torch module (with `forward`) or a `Backbone` as is.

    `net`: the network-time detectors' settings (``--net`` values or `NetSpec`s), for a timm name or module."""
    timm_module = (
        isinstance(model, torch.nn.Module)
        and forward is None
        and head is None
        and hasattr(model, "get_classifier")
        and hasattr(model, "pretrained_cfg")
    )
    if net and not (timm_module or isinstance(model, (str, os.PathLike))):
        raise OodbenchError(
            "net: the network-time detectors' arrays are extracted from a timm model (a timm name or module); "
            f"got {type(model).__name__}"
        )
    if isinstance(model, Backbone):
        return model
    if isinstance(model, (str, os.PathLike)):
        from ..extract.backbones.timm_backbone import load_timm

        return load_timm(str(model), pretrained=pretrained, checkpoint=checkpoint, image_size=image_size, network=net)
    if not isinstance(model, torch.nn.Module):
        raise OodbenchError(f"model must be a timm name, a torch.nn.Module or a Backbone; got {type(model).__name__}")
    if timm_module:
        from ..extract.backbones.timm_backbone import TimmBackbone

        digest = state_hash(model)
        name = (model.pretrained_cfg or {}).get("architecture") or type(model).__name__
        return TimmBackbone(
            model,
            name=name,
            checkpoint=f"sha256:{digest}",
            checkpoint_sha256=digest,
            image_size=image_size,
            network=net,
        )
    if head is None and forward is None and hasattr(model, "get_classifier"):
        classifier = model.get_classifier()
        head = classifier if isinstance(classifier, torch.nn.Linear) else None
    transform = transform or default_transform(image_size or 224)
    return ModuleBackbone(model, forward=forward, head=head, transform=transform)


@dataclass
class _ImageData:
    """One data argument, resolved: an ImageList (possibly of virtual items) and, for torch data, its loader."""

    images: Any  # ImageList; labels filled lazily for torch datasets
    loader: Callable[[int], Any] | None = None
    labels: Callable[[], np.ndarray | None] | None = None


class _DatasetLoader:
    """Item `position` of a map-style torch dataset as a tensor (a PIL image goes through the model's transform)."""

    def __init__(self, dataset: Any, transform: Callable[[Any], Any]) -> None:
        self.dataset, self.transform = dataset, transform

    def describe(self, position: int) -> str:
        return f"item {position}"

    def __call__(self, position: int) -> Any:
        item = self.dataset[position]
        image = item[0] if isinstance(item, (tuple, list)) else item
        return image if isinstance(image, torch.Tensor) else self.transform(image)


def _dataset_labels(dataset: Any) -> np.ndarray | None:
    """Integer labels of a torch dataset: its ``targets`` (torchvision), else the second element of every item."""
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return np.asarray(targets, dtype=np.int64)
    labels = []
    for position in range(len(dataset)):
        item = dataset[position]
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            return None
        labels.append(int(item[1]))
    return np.asarray(labels, dtype=np.int64)


def _fingerprint(dataset: Any, loader: _DatasetLoader) -> str:
    """Length, type and the bytes of a few evenly spaced items: the identity of a torch dataset in the store."""
    digest = hashlib.sha256(f"{type(dataset).__qualname__}:{len(dataset)}".encode())
    for position in sorted({int(p) for p in np.linspace(0, len(dataset) - 1, FINGERPRINT_ITEMS)}):
        digest.update(loader(position).detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


def as_image_data(data: Any, *, name: str, labelled: bool, transform: Callable[[Any], Any]) -> _ImageData:
    """Resolve a data argument: a folder or file list path, an `ImageList`, a torch dataset or a data loader."""
    from ..extract.datasets import ImageList, file_list, image_folder

    if isinstance(data, ImageList):
        return _ImageData(data)
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if path.is_dir():
            return _ImageData(image_folder(path, labels=labelled))
        if path.is_file():
            return _ImageData(file_list(path))
        raise DataError(f"{name}: {path} does not exist (give an image folder, a file list, or a torch dataset)")
    dataset = getattr(data, "dataset", data)  # a DataLoader: its map-style dataset, read in the store's order
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise DataError(f"{name}: expected a folder, a file list, an ImageList, a torch dataset or a DataLoader")
    if len(dataset) == 0:
        raise DataError(f"{name}: the dataset is empty")
    loader = _DatasetLoader(dataset, transform)
    tag = _fingerprint(dataset, loader)[:16]
    items = tuple(f"torch-dataset-{tag}/{position}" for position in range(len(dataset)))
    source = {"format": "torch dataset", "type": type(dataset).__qualname__}
    images = ImageList(Path("."), items, None, None, source)
    return _ImageData(images, loader, (lambda: _dataset_labels(dataset)) if labelled else None)


def content_fingerprint(images: Any) -> str | None:
    """SHA-256 of every item's relative path, size and modification time: the identity of image files on disk
    (None for a torch dataset, whose items already carry a fingerprint of its data)."""
    if images.source.get("format") == "torch dataset":
        return None
    digest = hashlib.sha256()
    for position, item in enumerate(images.items):
        try:
            info = os.stat(images.path(position))
            digest.update(f"{item}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
        except OSError:  # a missing file is reported by the extraction; here it is only a different content
            digest.update(f"{item}\0missing\n".encode())
    return digest.hexdigest()


def _with_content(images: Any) -> Any:
    """The image list with its content fingerprint in `source` (recorded in the store entry's meta.json)."""
    from ..extract.datasets import ImageList

    content = content_fingerprint(images)
    if content is None:
        return images
    return ImageList(
        images.root, images.items, images.labels, images.class_names, {**images.source, "content": content}
    )


def _entry_done(
    store: Store, model_id: str, dataset_id: str, provenance: Mapping[str, Any], images: Any, role: str
) -> bool:
    """True when the store already holds this set under this name, complete; other images under the name, or the
    name under other preprocessing, is one line saying what to do."""
    if not store.exists(model_id, dataset_id):
        return False
    meta = store.meta(model_id, dataset_id)
    if meta.get("provenance") != _as_stored(provenance):
        raise DataError(
            f"store {store.root} holds {dataset_id!r} for model {model_id} under other preprocessing, weights or "
            "--net arrays; use another store"
        )
    described = meta.get("dataset") if isinstance(meta.get("dataset"), dict) else {}
    content = images.source.get("content")
    stored_content = described.get("content")  # absent in entries written by `oodbench extract`
    if meta.get("item_hash") != images.item_hash() or (content and stored_content and content != stored_content):
        option, keyword = _NAMING[role]
        free = next(f"{dataset_id}-{n}" for n in range(2, 10**6) if not store.exists(model_id, f"{dataset_id}-{n}"))
        where = f" (stored from {described['root']})" if described.get("root") else ""
        raise DataError(
            f"store {store.root} holds other images under the name {dataset_id!r} for model {model_id}{where}; "
            f"name this set differently, e.g. {option} {free}=DIR ({keyword}={{{free!r}: ...}} in Python), "
            "or use another store"
        )
    return bool(meta.get("complete"))


def _named_set(value: Any, default: str, what: str) -> tuple[str, Any]:
    """(name, data) of a fit or ID argument: a one-entry mapping ``{name: data}``, or the data under `default`."""
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise OodbenchError(f"{what}: give one set, as {{'name': data}}; got {len(value)} entries")
        ((name, data),) = value.items()
        if not isinstance(name, str) or not name.strip():
            raise OodbenchError(f"{what}: the set's name must be a non-empty string; got {name!r}")
        return name.strip(), data
    return default, value


def _as_stored(value: Mapping[str, Any]) -> Any:
    """Provenance as the store records it (JSON round trip: tuples become lists)."""
    return json.loads(json.dumps(dict(value), default=str))


def evaluate_model(
    model: Any,
    *,
    id: Any,  # noqa: A002 - the name users know from the CLI (--id)
    ood: Mapping[str, Any],
    fit: Any,
    csid: Mapping[str, Any] | None = None,
    store: str | os.PathLike[str] | None = None,
    detectors: Sequence[str] | Mapping[str, Mapping[str, Any]] | None = None,
    out: str | os.PathLike[str] | None = None,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    forward: Callable[[Any, Any], tuple[Any, Any]] | None = None,
    head: Any = None,
    transform: Callable[[Any], Any] | None = None,
    image_size: int | None = None,
    net: Sequence[str] = (),
    model_id: str | None = None,
    batch_size: int = 64,
    num_workers: int | None = None,
    device: str = "auto",
    amp: bool = True,
    tpr: float = 0.95,
    progress: bool = True,
    small_fit_set: str = "fail",
    convention: str = "oodbench",
    aupr: bool = False,
    groups: str | os.PathLike[str] | OodGroups | None = None,
    gram_dtype: str = "float64",
    strict: bool = False,
    verify: bool = False,
    spec: EvaluationSpec | None = None,
    save_detectors: str | os.PathLike[str] | None = None,
    report: Callable[[str], None] | None = None,
) -> ModelEvaluation:
    """Extract `fit`, `id` and every `ood` set with `model` into `store`, fit the detectors, score, return results.

    `model`: a timm name (with `pretrained`/`checkpoint`), a timm module, a torch module with `forward(module,
    pixels) -> (features, logits)` (and optionally `head`, the final `nn.Linear`), or a `Backbone`. Data: an image
    folder (class sub-folders give labels), a file list, an `ImageList`, a torch dataset or a `DataLoader` (its
    dataset). `fit` and `id` may be named, ``id={"imnet": data}`` (default names "fit" and "id"); every set is stored
    under its name. `csid` names covariate-shifted ID sets (``{"imagenet-v2": data}``): extracted, scored, and
    counted as ID in a full-spectrum table beside the standard one. `image_size` overrides the input resolution.
    `net`: the network-time detectors' settings, as ``oodbench extract --net`` takes them (``["odin", "mds"]``; a
    timm model only), extracted with the features under the model id plus their digest (``resnet50+net-odin.mds-…``).
    Without `store` a temporary store is used and deleted; with one, a set already there under its name, with the
    same files (paths, sizes, modification times), is reused (no forward pass: `result.extracted` counts what ran);
    other files under a stored name are refused.
    `num_workers`: image decoding processes (None: one less than the cores available, at most 4).

    Before any image is read, every detector's parameters are checked against the fit set (its image count, the
    model's feature width, the arrays it will have); the error names every parameter to change.
    ``small_fit_set="adapt"`` instead scales the defaults a small fit set cannot support (`result.adapted`).
    A detector that fails leaves the others' results (`result.failed` says why).
    `convention`, `aupr`, `groups` (default with ``convention="openood"``: OpenOOD's near / far), `gram_dtype`,
    `strict` and `verify` are `oodbench evaluate`'s options (one `EvaluationSpec`, validated before any image is read);
    a built `spec` (the fit, ID and OOD sets' names) replaces `detectors`, `tpr` and those options.
    The checks that guard against wrong features, as `oodbench extract` prints them (the preprocessing, a converted
    checkpoint's naming, a checkpoint's top-1 class names on the first ID images), are in `result.notes` and are
    handed line by line to `report` before any image is extracted.
    """
    fit_name, fit = _named_set(fit, FIT, "fit")
    id_name, id = _named_set(id, ID, "id")  # noqa: A001
    csid = dict(csid or {})
    options = {"tpr": tpr, "small_fit_set": small_fit_set, "convention": convention, "aupr": aupr, "groups": groups}
    options |= {"gram_dtype": gram_dtype, "strict": strict, "verify": verify}
    spec = _checked_spec((fit_name, id_name), ood, csid, detectors, spec, **options)
    weights = {"pretrained": pretrained, "checkpoint": checkpoint, "forward": forward, "head": head}
    net = [net] if isinstance(net, str) else list(net)
    backbone = as_backbone(model, **weights, transform=transform, image_size=image_size, net=net)
    sets = {fit_name: (fit, "fit"), id_name: (id, "id"), **{name: (value, "csid") for name, value in csid.items()}}
    resolved, roles = _resolved(sets | {name: (value, "ood") for name, value in ood.items()}, backbone.transform)
    _check_before_extraction(spec.detectors, backbone, resolved[fit_name], spec.small_fit_set)
    notes = model_checks(backbone, resolved[id_name], probe=checkpoint is not None, report=report)
    run = {"model_id": model_id, "out": out, "batch_size": batch_size, "num_workers": num_workers, "device": device}
    run["save_detectors"] = save_detectors
    result = _in_store(store, backbone, resolved, spec, roles=roles, amp=amp, progress=progress, **run)
    result.notes = notes
    return result


def _resolved(
    sets: Mapping[str, tuple[Any, str]], transform: Callable[[Any], Any]
) -> tuple[dict[str, _ImageData], dict[str, str]]:
    """Each set's data resolved ({name: (data, role)}; OOD sets unlabelled), and each set's role."""
    resolved = {
        name: as_image_data(value, name=name, labelled=role != "ood", transform=transform)
        for name, (value, role) in sets.items()
    }
    return resolved, {name: role for name, (_, role) in sets.items()}


def _in_store(
    store: str | os.PathLike[str] | None,
    backbone: Any,
    resolved: Mapping[str, _ImageData],
    spec: EvaluationSpec,
    **run: Any,
) -> ModelEvaluation:
    """Extract and evaluate in `store`, or in a temporary store deleted on the way out (`result.store` is None)."""
    with (
        tempfile.TemporaryDirectory(prefix="oodbench-store-")
        if store is None
        else contextlib.nullcontext(store) as root,
        _temporary_store_notes(store is None),
    ):
        result = _extract_and_evaluate(Store(root), backbone, resolved, spec, **run)
        result.store = None if store is None else Path(root)
        return result


def model_checks(
    backbone: Any, id_data: _ImageData, *, probe: bool, report: Callable[[str], None] | None = None
) -> list[str]:
    """The lines `oodbench extract` prints before extracting: the preprocessing, the naming a checkpoint was
    converted from, and (`probe`: a checkpoint on a labelled ID folder) the top-1 class names of its first images."""
    from ..extract.backbones.base import describe_preprocessing

    overrides = getattr(backbone, "preprocessing_overrides", None)
    lines = [f"preprocessing of {backbone.name}: {describe_preprocessing(backbone.preprocessing, overrides)}"]
    converted = getattr(backbone, "checkpoint_format", None)
    if converted:
        lines.append(f"checkpoint converted from the {converted} naming (keys renamed; tensors unchanged)")
    if probe and backbone.kind == "timm" and id_data.loader is None and id_data.images.labels is not None:
        from ..extract.checks import probe_predictions

        check = probe_predictions(backbone, id_data.images)
        if check is not None:
            hits = "" if check.correct is None else f", {check.correct} matching their labels"
            lines.append(f"probe: top-1 of the first {check.n} images: {check.shown()}{hits}")
            lines += [f"warning: {message}" for message in check.warnings]
    for line in lines if report is not None else ():
        report(line)
    return lines


def _checked_spec(
    names: tuple[str, str],
    ood: Mapping[str, Any],
    csid: Mapping[str, Any],
    detectors: Sequence[str] | Mapping[str, Mapping[str, Any]] | None,
    spec: EvaluationSpec | None,
    **options: Any,
) -> EvaluationSpec:
    """The evaluation's specification (`spec` as given, else built), once the arguments are checked (before any
    image is read); `names`: the fit and ID sets' names."""
    fit, id_name = names
    if spec is not None:
        if (spec.fit, spec.id, list(spec.csid), list(spec.ood)) != (fit, id_name, list(csid), list(ood)):
            raise OodbenchError(
                f"spec: expected fit {fit!r}, ID {id_name!r}, the covariate-shifted ID sets {list(csid)} and the "
                f"OOD sets {list(ood)}"
            )
        return spec
    if not ood:
        raise OodbenchError("no OOD sets given: pass ood={'name': data, ...}")
    if fit == id_name:
        raise OodbenchError(f"the fit and ID test sets are both named {fit!r}; name them differently")
    for what, sets in (("covariate-shifted ID", csid), ("OOD", ood)):
        clash = sorted({fit, id_name} & set(sets))
        if clash:
            raise OodbenchError(f"{what} set names {clash} are those of the fit or ID test set; rename them")
    both = sorted(set(csid) & set(ood))
    if both:
        raise OodbenchError(f"the names {both} are given both to covariate-shifted ID and to OOD sets; rename them")
    # Unknown names, bad parameters and options fail here, before any extraction.
    return EvaluationSpec.build(detectors, fit=fit, id=id_name, ood=list(ood), csid=list(csid), **options)


def _default_model_id(backbone: Any) -> str:
    """The store's model id of a backbone; with network-time arrays (`net`), plus their methods and a digest of
    their settings: such entries are another model's (their provenance differs), so one store keeps both."""
    base = backbone.default_model_id()
    network = getattr(backbone, "network", ())
    if not network:
        return base
    settings = json.dumps([spec.as_dict() for spec in network], sort_keys=True).encode()
    return f"{base}+net-{'.'.join(spec.method for spec in network)}-{hashlib.sha256(settings).hexdigest()[:8]}"


@contextlib.contextmanager
def _temporary_store_notes(temporary: bool) -> Iterator[None]:
    """On Ctrl-C, say that extractions into a temporary store are gone (it is deleted on the way out)."""
    try:
        yield
    except KeyboardInterrupt:
        if temporary:
            for topic in work_topics():
                if topic.startswith("extract "):
                    note_work(topic, kept="")  # the temporary store is deleted on the way out
            note_work(
                "temporary store", lost="the extracted features with the temporary store (keep them with --store)"
            )
        raise


def _fit_size(backbone: Any, fit: _ImageData) -> tuple[FitSize, bool | None]:
    """The fit set as far as it is known before extraction, and whether the model has a head (None: unknown)."""
    images = fit.images
    head = backbone.head()
    features = (
        head.num_features if head is not None else getattr(getattr(backbone, "model", None), "num_features", None)
    )
    classes = None
    if images.labels is not None:
        classes = len(np.unique(images.labels))
    arrays = {"features"}
    if head is not None:
        arrays.add("logits")
    # The network-time detectors' arrays that `net` extracts with the features.
    arrays |= {f"extra.{name}" for spec in getattr(backbone, "network", ()) for name in spec.extra_names()}
    if images.labels is not None or fit.labels is not None:
        arrays.add("labels")  # a torch dataset's labels are read at extraction; assume they exist
    known_head = True if head is not None or not isinstance(backbone, ModuleBackbone) else None
    size = FitSize(
        len(images),
        classes,
        features if isinstance(features, int) else None,
        frozenset(arrays),
        head.num_classes if head is not None else None,
    )
    return size, known_head


def _check_before_extraction(
    plan: Mapping[str, Mapping[str, Any]], backbone: Any, fit: _ImageData, small_fit_set: str
) -> None:
    """Fail before any image is read when no detector can run, or when parameters exceed the fit set."""
    size, has_head = _fit_size(backbone, fit)
    will_skip: dict[str, str] = {}
    if has_head is not None:  # a plain module's logits are known only once it ran
        for name, params in plan.items():
            detector = detector_registry.create(name, **params)
            reasons = detector.unmet(size.arrays, {ID: size.arrays - {"labels"}}, has_head=has_head)
            if reasons:
                will_skip[name] = "; ".join(reasons)
        if len(will_skip) == len(plan):
            raise nothing_evaluated(will_skip, {})
    _, _, left_out = fit_size_plan(plan, size, small_fit_set, ignore=will_skip)
    if len(left_out) + len(will_skip) == len(plan):  # adapt leaves out what cannot run; something must remain
        raise nothing_evaluated({**will_skip, **left_out}, {})


def _extract_and_evaluate(
    store: Store,
    backbone: Any,
    resolved: Mapping[str, _ImageData],
    spec: EvaluationSpec,
    *,
    roles: Mapping[str, str],
    model_id: str | None,
    out: str | os.PathLike[str] | None,
    batch_size: int,
    num_workers: int | None,
    device: str,
    amp: bool,
    progress: bool,
    save_detectors: str | os.PathLike[str] | None = None,
) -> ModelEvaluation:
    from ..extract.datasets import ImageList
    from ..extract.pipeline import extract

    model_id = model_id or _default_model_id(backbone)
    provenance = backbone.provenance()
    extracted: dict[str, int] = {}
    unreadable: dict[str, int] = {}
    listed = {dataset_id: _with_content(data.images) for dataset_id, data in resolved.items()}
    # Every name is checked against the store before any set is extracted: a refused name costs no extraction.
    done = {
        dataset_id: _entry_done(store, model_id, dataset_id, provenance, images, roles[dataset_id])
        for dataset_id, images in listed.items()
    }
    for dataset_id, data in resolved.items():
        images = listed[dataset_id]
        if done[dataset_id]:
            extracted[dataset_id] = 0  # cached: the model is not run, the images are not read
            continue
        if data.labels is not None:
            images = ImageList(images.root, images.items, data.labels(), None, images.source)
        report = extract(
            store,
            backbone,
            images,
            dataset_id=dataset_id,
            model_id=model_id,
            batch_size=batch_size,
            num_workers=num_workers,
            device=device,
            amp=amp,
            progress=progress,
            loader=data.loader,
        )
        extracted[dataset_id] = report.processed
        unreadable[dataset_id] = len(report.skipped)  # each has its line already; counted again in the summary
    evaluation = evaluate_spec(store, model_id, spec, out_dir=out, progress=progress, save_detectors=save_detectors)
    return ModelEvaluation(
        rows=evaluation.rows,
        scores=evaluation.scores,
        table_markdown=evaluation.table_markdown,
        skipped=evaluation.skipped,
        run_dir=evaluation.run_dir,
        failed=evaluation.failed,
        adapted=evaluation.adapted,
        accuracy=evaluation.accuracy,
        model_id=model_id,
        extracted=extracted,
        unreadable=unreadable,
    )
