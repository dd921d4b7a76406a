"""An annotation project on disk: configuration, class list, secret, database, image roots.

Layout of a project folder::

    project.json    image roots, database URL, example root, public URL template, LLM settings
    classes.json    the ID class list (names, optional folder ids)
    secret.key      random key that signs login CSRF cookies (created with mode 0600)
    annotate.db     SQLite database (unless project.json or OODBENCH_ANNOTATE_DB_URL names another)
    examples.json   example image paths per ID class (evidence D), when an example root is set
    llm-cache/      cached LLM answers (evidence A)
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..core.errors import AnnotateError
from ..text.classes import ClassList
from ..util.atomic import atomic_path, read_regular, read_text_file
from .db import AnnotationStore, ImageInfo
from .evidence import (
    IMAGE_SUFFIXES,
    absent,
    confusion_evidence,
    example_images,
    original_evidence,
    reverse_search_evidence,
    top_confusions,
    vlm_evidence,
    vlm_topk,
)
from .importers import Candidate, Import, merge_candidates

PROJECT_FILE = "project.json"
DB_URL_ENV = "OODBENCH_ANNOTATE_DB_URL"
DEFAULT_ROOT = "images"
# Size limits of the project's own files, checked before reading (a class list of ImageNet-21k is about 1 MB).
JSON_LIMIT = 64 * 2**20
SECRET_LIMIT = 4096
ITEMS_LIMIT = 2**30
NOT_YET = {
    "vlm": absent("no VLM embeddings given yet (oodbench annotate evidence PROJECT --image-embeddings …)"),
    "llm": absent("no LLM description yet (oodbench annotate describe PROJECT)"),
}


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write a text file through a temporary file and a rename (optionally with a file mode)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
        if mode is not None:
            os.chmod(tmp, mode)


def read_project_file(path: Path, limit: int = JSON_LIMIT) -> str:
    """The UTF-8 text of a file of the project folder: a regular file reached without a link, at most `limit` bytes.

    A project folder can come from someone else: a link is never followed, a FIFO never blocks the app and a
    device is never read (see `read_regular`); each is one AnnotateError line.
    """
    try:
        data = read_regular(path, limit)
    except OSError as exc:
        raise AnnotateError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AnnotateError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_project_json(path: Path) -> Any:
    """The JSON content of a file of the project folder (see `read_project_file`); AnnotateError when malformed."""
    text = read_project_file(path)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise AnnotateError(f"{path} is not valid JSON: {exc}"[:500]) from None


def safe_join(root: Path, relpath: str) -> Path | None:
    """The file `relpath` inside `root`, or None if it escapes the root (.., absolute, symlinks) or is missing."""
    if not relpath or "\x00" in relpath or "\\" in relpath:
        return None
    pure = PurePosixPath(relpath)
    if pure.is_absolute() or ".." in pure.parts:
        return None
    base = root.resolve()
    try:
        target = (base / pure).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not target.is_relative_to(base) or not target.is_file():
        return None
    return target


@dataclass
class ProjectConfig:
    """Settings stored in project.json (secrets such as API keys stay in the environment)."""

    image_roots: dict[str, str]
    db_url: str | None = None
    example_root: str | None = None
    public_url_template: str | None = None  # e.g. "https://host/val/{key}"; also {path}
    llm: dict[str, Any] = field(default_factory=dict)  # base_url, model, timeout, max_retries
    session_hours: float = 12.0
    cookie_secure: bool = False
    title: str = "oodbench annotate"

    @classmethod
    def from_json(cls, data: dict[str, Any], source: Path) -> ProjectConfig:
        """Validated config from project.json content."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise AnnotateError(f"{source}: unknown keys {sorted(unknown)}")
        if not isinstance(data.get("image_roots"), dict) or not data["image_roots"]:
            raise AnnotateError(f"{source}: 'image_roots' must map root names to folders")
        return cls(**data)


class Project:
    """A project folder, opened."""

    def __init__(self, directory: Path, config: ProjectConfig, classes: ClassList) -> None:
        self.dir = directory
        self.config = config
        self.classes = classes
        self._store: AnnotationStore | None = None
        self._examples: dict[int, list[str]] | None = None

    @classmethod
    def create(
        cls,
        directory: str | Path,
        image_root: str | Path,
        classes: ClassList,
        **settings: Any,
    ) -> Project:
        """Create (or update the settings of) a project folder and its database schema."""
        directory = Path(directory).absolute()
        root = Path(image_root).absolute()
        if not root.is_dir():
            raise AnnotateError(f"image root is not a folder: {root}")
        config_path = directory / PROJECT_FILE
        if config_path.is_file():
            config = Project.open(directory).config
            config.image_roots[DEFAULT_ROOT] = str(root)
            for key, value in settings.items():
                if value is not None:
                    setattr(config, key, value)
        else:
            given = {k: v for k, v in settings.items() if v is not None}
            config = ProjectConfig(image_roots={DEFAULT_ROOT: str(root)}, **given)
        if config.example_root is not None:
            config.example_root = str(Path(config.example_root).absolute())
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / "classes.json", json.dumps(classes.to_json()))
        if not (directory / "secret.key").is_file():
            write_atomic(directory / "secret.key", secrets.token_urlsafe(48), mode=0o600)
        write_atomic(config_path, json.dumps(asdict(config), indent=2))
        project = cls(directory, config, classes)
        project.store()  # creates the schema
        if config.example_root is not None:
            project.index_examples()
        return project

    @classmethod
    def open(cls, directory: str | Path) -> Project:
        """Open an existing project folder."""
        directory = Path(directory).absolute()
        config_path = directory / PROJECT_FILE
        if not os.path.lexists(config_path):  # anything planted there is judged (and refused) by the read below
            raise AnnotateError(
                f"{directory} is not an annotation project (no {PROJECT_FILE}); run `oodbench annotate init`"
            )
        config_data = read_project_json(config_path)
        classes_path = directory / "classes.json"
        classes_data = read_project_json(classes_path)
        if not isinstance(config_data, dict):
            raise AnnotateError(f"{config_path} must hold a JSON object, not {type(config_data).__name__}")
        if not isinstance(classes_data, dict):
            raise AnnotateError(f"{classes_path} must hold a JSON object, not {type(classes_data).__name__}")
        try:
            config = ProjectConfig.from_json(config_data, config_path)
            classes = ClassList.from_json(classes_data)
        except (KeyError, TypeError, ValueError) as exc:  # ClassListError is a ValueError
            raise AnnotateError(f"{directory}: damaged project files ({exc})"[:500]) from None
        return cls(directory, config, classes)

    @property
    def db_url(self) -> str:
        """Database URL: the environment, then project.json, then SQLite in the folder."""
        return os.environ.get(DB_URL_ENV) or self.config.db_url or f"sqlite:///{self.dir / 'annotate.db'}"

    @property
    def secret(self) -> str:
        """The project's signing secret."""
        path = self.dir / "secret.key"
        secret = read_project_file(path, SECRET_LIMIT).strip()
        if not secret:
            raise AnnotateError(f"{path} is empty; delete it and run `oodbench annotate init` again to create one")
        return secret

    @property
    def llm_cache(self) -> Path:
        """Where LLM answers are cached."""
        return self.dir / "llm-cache"

    def store(self) -> AnnotationStore:
        """The project's database (one engine per opened project), its schema brought up to date on first use."""
        if self._store is None:
            store = AnnotationStore(self.db_url, session_hours=self.config.session_hours)
            try:
                store.migrate()
            except BaseException:
                store.close()
                raise
            self._store = store
        return self._store

    def close(self) -> None:
        """Release the database engine."""
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- files ----------------------------------------------------------------------------------
    def root(self, name: str) -> Path:
        """An image root by name."""
        try:
            return Path(self.config.image_roots[name])
        except KeyError:
            raise AnnotateError(f"unknown image root {name!r}") from None

    def image_file(self, image: ImageInfo) -> Path | None:
        """The image's file, only if it lies inside its configured root."""
        if image.root not in self.config.image_roots:
            return None
        return safe_join(self.root(image.root), image.path)

    @property
    def examples(self) -> dict[int, list[str]]:
        """Example image paths per class, relative to the example root."""
        if self._examples is None:
            path = self.dir / "examples.json"
            data = read_project_json(path) if os.path.lexists(path) else {}
            if not isinstance(data, dict) or not all(
                isinstance(v, list) and all(isinstance(p, str) for p in v) for v in data.values()
            ):
                raise AnnotateError(f"{path} must map class indices to lists of image paths")
            try:
                self._examples = {int(k): v for k, v in data.items()}
            except ValueError:
                raise AnnotateError(f"{path} must map class indices to lists of image paths") from None
        return self._examples

    def example_file(self, class_index: int, number: int) -> Path | None:
        """An example image of a class, only if it lies inside the example root."""
        if self.config.example_root is None:
            return None
        paths = self.examples.get(class_index, [])
        if not 0 <= number < len(paths):
            return None
        return safe_join(Path(self.config.example_root), paths[number])

    def index_examples(self, per_class: int = 3) -> int:
        """List example images per class under the example root; returns the number of classes found."""
        if self.config.example_root is None:
            raise AnnotateError("the project has no example root (init --examples DIR)")
        found = example_images(self.config.example_root, self.classes, per_class)
        write_atomic(self.dir / "examples.json", json.dumps({str(k): v for k, v in found.items()}))
        self._examples = found
        return len(found)

    def public_url(self, candidate: Candidate, relpath: str) -> str | None:
        """The public URL of an image: its source's URL, else the project's template."""
        if candidate.url:
            return candidate.url
        template = self.config.public_url_template
        return template.format(key=candidate.key, path=relpath) if template else None


def _file_index(root: Path) -> dict[str, str | None]:
    """File name -> path relative to root for every image below root (None when a name repeats)."""
    index: dict[str, str | None] = {}
    for folder, _dirs, files in os.walk(root, followlinks=False):
        rel = Path(folder).relative_to(root)
        for name in files:
            if name.lower().endswith(IMAGE_SUFFIXES):
                index[name] = None if name in index else (rel / name).as_posix()
    return index


def import_candidates(
    project: Project, imports: Sequence[Import], *, skip_missing: bool = False, confusion_k: int = 5
) -> dict[str, int]:
    """Add the candidates of several importers to a project, with evidence C, E and B.

    Each candidate's file is found under the image root by its relative path, else by file name.
    Missing files are an error unless `skip_missing`. Returns counts (added, updated, skipped).
    """
    candidates = merge_candidates(imp.candidates for imp in imports)
    if not candidates:
        raise AnnotateError("the candidate sources selected no images")
    root = project.root(DEFAULT_ROOT).resolve()
    index: dict[str, str | None] | None = None
    rows: list[tuple[Candidate, str, str, dict]] = []
    missing: list[str] = []
    with_pairs = [imp for imp in imports if imp.confusion_pairs.size]
    pairs = np.concatenate([imp.confusion_pairs for imp in with_pairs]) if with_pairs else np.zeros((0, 2), np.int64)
    labels = [c.original_label for c in candidates if c.original_label is not None]
    confusions = top_confusions(pairs, labels, confusion_k) if with_pairs else {}
    source = "+".join(imp.source for imp in with_pairs)
    for cand in candidates:
        relpath = cand.path if safe_join(root, cand.path) is not None else None
        if relpath is None:
            if index is None:
                index = _file_index(root)
            name = PurePosixPath(cand.path).name
            if name in index and index[name] is None:
                raise AnnotateError(f"{name} occurs more than once under {root}; give candidates relative paths")
            relpath = index.get(name)
        if relpath is None:
            missing.append(cand.path)
            continue
        if cand.original_label is not None and cand.original_label >= len(project.classes):
            raise AnnotateError(f"{cand.key}: original label {cand.original_label} is outside the class list")
        evidence = {
            "original": original_evidence(cand.original_label, project.classes),
            "confusions": confusion_evidence(cand.original_label, confusions, project.classes, source),
            "reverse_search": reverse_search_evidence(project.public_url(cand, relpath)),
        }
        rows.append((cand, DEFAULT_ROOT, relpath, evidence))
    if missing and not skip_missing:
        shown = ", ".join(missing[:5])
        raise AnnotateError(
            f"{len(missing)} of {len(candidates)} candidate images are not under {root} (e.g. {shown}); "
            "pass --skip-missing to import the others"
        )
    if not rows:
        raise AnnotateError(f"none of the {len(candidates)} candidate images is under {root}")
    added, updated = project.store().add_images(rows, defaults=NOT_YET)
    return {"added": added, "updated": updated, "skipped": len(missing)}


def add_vlm_evidence(
    project: Project,
    keys: Sequence[str],
    image_embeddings: np.ndarray | str | Path,
    text_embeddings: np.ndarray | str | Path,
    *,
    k: int = 5,
    model: str | None = None,
) -> int:
    """Evidence (D) from cached embeddings: `keys[i]` names the image of row i. Returns images updated."""
    from .evidence import open_matrix

    images = open_matrix(image_embeddings, "image embeddings")
    if len(keys) != images.shape[0]:
        raise AnnotateError(f"{len(keys)} keys for {images.shape[0]} embedding rows")
    row_of: dict[str, int] = {}
    for row, key in enumerate(keys):
        row_of.setdefault(str(key), row)
        row_of.setdefault(PurePosixPath(str(key)).name, row)
    targets: list[tuple[int, int]] = []
    for image in project.store().images():
        row = row_of.get(image.key, row_of.get(image.path, row_of.get(PurePosixPath(image.path).name)))
        if row is not None:
            targets.append((image.id, row))
    if not targets:
        raise AnnotateError("none of the embedding keys matches an image of the project")
    texts = open_matrix(text_embeddings, "class-name embeddings")
    if texts.shape[0] != len(project.classes):
        raise AnnotateError(f"{texts.shape[0]} class-name embeddings for {len(project.classes)} classes")
    rows = np.asarray([r for _, r in targets])
    order = np.argsort(rows, kind="stable")  # memory-maps read fastest in file order
    top, sims = vlm_topk(images[rows[order]], texts, k)
    packs = vlm_evidence(top, sims, project.classes, model)
    project.store().set_evidence({targets[i][0]: {"vlm": packs[j]} for j, i in enumerate(order)})
    return len(targets)


def candidate_names(evidence: dict[str, Any]) -> list[str]:
    """Class names an image's evidence points at (original, VLM, confusions), for the LLM's closed world."""
    names: list[str] = []
    original = evidence.get("original", {})
    if "name" in original:
        names.append(original["name"])
    for source in ("vlm", "confusions"):
        names += [c["name"] for c in evidence.get(source, {}).get("classes", [])]
    return list(dict.fromkeys(names))


def describe_images(
    project: Project, describer: Any, *, limit: int | None = None, redo: bool = False, progress: Any = None
) -> int:
    """Evidence (A) for images that lack it or hold an unparseable reply; returns how many were described.

    With `redo`, every image is described again and the endpoint is asked again (the cache is refreshed).
    """
    store = project.store()

    def wanted(evidence: dict) -> bool:
        llm = evidence.get("llm", {"absent": ""})
        return redo or "absent" in llm or llm.get("parse_error") is not False

    todo = [img for img in store.images() if wanted(img.evidence)]
    if limit is not None:
        todo = todo[:limit]
    done = 0
    for image in todo:
        path = project.image_file(image)
        if path is None:
            raise AnnotateError(f"image {image.key} is missing from its root")
        answer = describer.describe(path, candidate_names(image.evidence), refresh=redo)
        store.set_evidence({image.id: {"llm": answer}})
        done += 1
        if progress is not None:
            progress()
    return done


def read_keys(path: str | Path) -> list[str]:
    """Image keys, one per line (the rows of an embedding file)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise AnnotateError(f"keys file not found: {path}")
    try:
        text = read_text_file(path)  # a file the user named: a link is followed, a FIFO is refused
    except ValueError as why:
        raise AnnotateError(f"keys file {path}: {why}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def store_evidence_inputs(
    store_root: str | Path, model_id: str, dataset_id: str
) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """The inputs of `add_vlm_evidence` from a feature-store entry: (keys, image embeddings, class embeddings).

    Row r of the entry's `features` is the image `items.txt[index[r]]` (paths relative to the dataset root,
    which `add_vlm_evidence` matches by key, path or file name). The class embeddings are the rows of the
    model's stored classifier head, or None when it has none (then pass class-name embeddings yourself).
    """
    from ..core.errors import StoreError
    from ..core.store import Store

    store = Store(store_root)
    try:
        if not store.exists(model_id, dataset_id):
            raise AnnotateError(f"{store_root} has no entry {model_id}/{dataset_id}; see `oodbench store ls`")
        items_file = store.entry_path(model_id, dataset_id) / "items.txt"
        if not os.path.lexists(items_file):
            raise AnnotateError(f"{model_id}/{dataset_id} records no item list (items.txt): rows cannot be matched")
        items = read_project_file(items_file, ITEMS_LIMIT).splitlines()
        index = np.asarray(store.read_array(model_id, dataset_id, "index"))
        features = store.read_array(model_id, dataset_id, "features")
        head = store.read_head(model_id).weight if store.has_head(model_id) else None
    except StoreError as exc:
        raise AnnotateError(str(exc)) from None
    if index.size and (index.min() < 0 or index.max() >= len(items)):
        raise AnnotateError(f"{model_id}/{dataset_id}: its index points outside its {len(items)} items")
    return np.asarray(items, dtype=object)[index].tolist(), features, None if head is None else np.asarray(head)
