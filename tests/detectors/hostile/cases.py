"""Hostile saved detectors: each case turns a valid saved detector (or an empty directory) into a crafted one.

`build(out, victim, plugin_dir)` writes every case into ``out/<case>/`` from valid saves it makes itself, so the
directory can be handed to any oodbench (``python -m tests.detectors.hostile.cases OUT``). Every case must be
refused by ``oodbench.detectors.load`` and ``oodbench score`` with one line (exit 2), leave `victim` (a file
outside the artefacts) untouched, and import nothing: `plugin_dir` holds a module that, if imported, writes a
marker file next to itself.

The cases come from an adversarial review of the earlier format (which named classes by dotted paths and kept
faiss indexes as serialised blobs) and from every field of the current one: the JSON, the parameters, the fit's
shape, each declared array's dtype, shape and layout, the numbers, the faiss indexes and the safetensors file.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from oodbench import __version__
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import create, save
from oodbench.detectors.artefact import ARRAYS_FILE, META_FILE
from oodbench.util.atomic import sha256_file

EVIL_MODULE = "oodbench_hostile_probe"
EVIL_SOURCE = f'''"""Imported only if a loader runs code a file names: leaves a marker behind."""
from pathlib import Path

Path(__file__).with_name("{EVIL_MODULE}.imported").write_text("imported")


class Evil:
    pass
'''

Case = Callable[[Path, Path], None]  # (artefact directory to turn hostile, victim file) -> None
CASES: dict[str, tuple[str, Case]] = {}  # name -> (source detector, mutation)


def case(source: str) -> Callable[[Case], Case]:
    """Register a mutation of a valid save of detector `source` ('none': an empty directory)."""

    def register(function: Case) -> Case:
        CASES[function.__name__] = (source, function)
        return function

    return register


# ----------------------------------------------------------------------------------------------- helpers
def read(path: Path) -> dict[str, Any]:
    return json.loads((path / META_FILE).read_text())


def write(path: Path, meta: Any) -> None:
    (path / META_FILE).write_text(json.dumps(meta))


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = read(path)
    change(meta)
    write(path, meta)


def arrays(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path / ARRAYS_FILE))


def write_arrays(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Replace the arrays and record their new digest, as a forger would."""
    from safetensors.numpy import save_file

    save_file(tensors, str(path / ARRAYS_FILE))
    reseal(path)


def reseal(path: Path) -> None:
    meta = read(path)
    meta["arrays_sha256"] = sha256_file(path / ARRAYS_FILE)
    write(path, meta)


def raw_safetensors(path: Path, header: dict[str, Any], data: bytes) -> None:
    """A safetensors file with a hand-written header (its 8-byte length, the JSON, the data)."""
    encoded = json.dumps(header).encode()
    (path / ARRAYS_FILE).write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    reseal(path)


def legacy(path: Path, state: dict[str, Any], tensors: dict[str, np.ndarray] | None = None, **origin: Any) -> None:
    """A detector file in the earlier format (1), complete enough for that format's loader to decode its state."""
    from safetensors.numpy import save_file

    save_file(tensors or {}, str(path / ARRAYS_FILE))
    record = {
        "class": "oodbench.detectors.logit:Energy",
        "registered": True,
        "module": "oodbench.detectors.logit",
        "distribution": "oodbench",
        "version": __version__,
        "builtin": True,
        "source_hash": None,
        "path": None,
    }
    record.update(origin)
    meta = {
        "format": 1,
        "detector": "energy",
        "origin": record,
        "params": {"temperature": 1.0},
        "state": state,
        "arrays_sha256": sha256_file(path / ARRAYS_FILE),
        "provenance": {"model_id": "tiny", "model": "tiny-net", "checkpoint": "sha256:abc", "preprocessing": None},
    }
    write(path, meta)


# ----------------------------------------------------------------------------------------------- the earlier format
@case("none")
def legacy_object_deletes_a_file(path: Path, victim: Path) -> None:
    """The review's attack: a dotted path from an oodbench module to tempfile's closer, which unlinks its name
    when collected (even when the load is then refused)."""
    closer = "oodbench.detectors.testing:tempfile._TemporaryFileCloser"
    harmless = {"$object": closer, "state": {"close_called": True}}
    evil = {"$object": closer, "state": {"file": harmless, "name": str(victim), "delete": True}}
    legacy(path, {"trap_": evil})


@case("none")
def legacy_object_names_os_system(path: Path, victim: Path) -> None:
    """A state value naming a callable of the standard library."""
    legacy(path, {"x_": {"$object": "os:system", "state": {}}})


@case("none")
def legacy_class_imports_a_module_on_the_path(path: Path, victim: Path) -> None:
    """origin.class names a module on sys.path: the earlier loader imported it before checking it was a detector."""
    legacy(path, {}, registered=False, **{"class": f"{EVIL_MODULE}:Evil", "module": EVIL_MODULE})


def _legacy_faiss(path: Path, blob: bytes) -> None:
    legacy(path, {"index_": {"$faiss": "index_"}}, {"index_": np.frombuffer(blob, dtype=np.uint8).copy()})


@case("none")
def legacy_faiss_blob_garbage(path: Path, victim: Path) -> None:
    """A serialised faiss index that is random bytes."""
    _legacy_faiss(path, np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())


@case("none")
def legacy_faiss_blob_empty(path: Path, victim: Path) -> None:
    """A serialised faiss index of zero bytes (faiss raised an empty AssertionError on it)."""
    legacy(path, {"index_": {"$faiss": "index_"}}, {"index_": np.zeros(0, dtype=np.uint8)})


@case("none")
def legacy_faiss_blob_truncated(path: Path, victim: Path) -> None:
    """A real serialised IndexFlatIP cut short."""
    import faiss

    index = faiss.IndexFlatIP(8)
    index.add(np.eye(8, dtype=np.float32))
    _legacy_faiss(path, faiss.serialize_index(index).tobytes()[:-17])


@case("none")
def legacy_faiss_blob_claims_huge_index(path: Path, victim: Path) -> None:
    """A serialised IndexFlatIP whose header claims 2^40 vectors."""
    import faiss

    index = faiss.IndexFlatIP(8)
    index.add(np.eye(8, dtype=np.float32))
    blob = bytearray(faiss.serialize_index(index).tobytes())
    blob[8:16] = struct.pack("<q", 1 << 40)
    _legacy_faiss(path, bytes(blob))


# ----------------------------------------------------------------------------------------------- detector.json
@case("maha")
def meta_not_json(path: Path, victim: Path) -> None:
    """Not JSON at all."""
    (path / META_FILE).write_text("{'detector': maha")


@case("maha")
def meta_not_utf8(path: Path, victim: Path) -> None:
    """Bytes that are not UTF-8."""
    (path / META_FILE).write_bytes(b'{"detector": "\xff\xfe"}')


@case("maha")
def meta_a_list(path: Path, victim: Path) -> None:
    """A JSON list instead of an object."""
    write(path, [read(path)])


@case("maha")
def meta_nested_5000_deep(path: Path, victim: Path) -> None:
    """A value nested 5,000 lists deep (the parser's recursion)."""
    (path / META_FILE).write_text('{"format": 2, "params": ' + "[" * 5000 + "]" * 5000 + "}")


@case("maha")
def meta_nested_200_deep(path: Path, victim: Path) -> None:
    """Provenance nested 200 objects deep: parses, but nothing legitimate is so deep."""
    deep: Any = {}
    for _ in range(200):
        deep = {"x": deep}
    edit(path, lambda m: m.update(provenance=deep))


@case("maha")
def meta_nan_token(path: Path, victim: Path) -> None:
    """A NaN token, which JSON does not have."""
    text = (path / META_FILE).read_text().replace('"format": 2', '"format": NaN', 1)
    (path / META_FILE).write_text(text)


@case("maha")
def meta_too_large(path: Path, victim: Path) -> None:
    """Provenance padded to 10 MB."""
    edit(path, lambda m: m.update(provenance={"pad": "x" * (10 << 20)}))


@case("maha")
def meta_unknown_field(path: Path, victim: Path) -> None:
    """A top-level field the format does not have."""
    edit(path, lambda m: m.update(code="import os; os.system('true')"))


@case("maha")
def meta_missing_state(path: Path, victim: Path) -> None:
    """No state at all."""
    edit(path, lambda m: m.pop("state"))


@case("maha")
def meta_future_format(path: Path, victim: Path) -> None:
    """A format this version does not read."""
    edit(path, lambda m: m.update(format=99))


@case("maha")
def meta_format_a_string(path: Path, victim: Path) -> None:
    """The format as a string."""
    edit(path, lambda m: m.update(format="2"))


@case("maha")
def name_traverses_paths(path: Path, victim: Path) -> None:
    """A detector name with a path in it."""
    edit(path, lambda m: m.update(detector="../../maha"))


@case("maha")
def name_a_list(path: Path, victim: Path) -> None:
    """A detector name that is not a string."""
    edit(path, lambda m: m.update(detector=["maha"]))


@case("maha")
def name_of_an_unregistered_plugin_on_the_path(path: Path, victim: Path) -> None:
    """A detector registered nowhere, its origin naming a module on sys.path: nothing may import it."""

    def change(meta: dict[str, Any]) -> None:
        meta["detector"] = EVIL_MODULE
        meta["origin"].update({"class": f"{EVIL_MODULE}:Evil", "module": EVIL_MODULE, "registered": False})
        meta["origin"].update({"distribution": EVIL_MODULE, "builtin": False})

    edit(path, change)


@case("maha")
def name_of_another_builtin(path: Path, victim: Path) -> None:
    """maha's state under another detector's name (the recorded class then disagrees)."""
    edit(path, lambda m: m.update(detector="knn"))


@case("maha")
def class_mismatch(path: Path, victim: Path) -> None:
    """The recorded class is not the registered one."""
    edit(path, lambda m: m["origin"].update({"class": "os:system"}))


@case("maha")
def version_changed(path: Path, victim: Path) -> None:
    """Saved by another version of the detector's code."""
    edit(path, lambda m: m["origin"].update(version="0.0.0"))


@case("maha")
def provenance_a_string(path: Path, victim: Path) -> None:
    """Provenance that is not an object."""
    edit(path, lambda m: m.update(provenance="tiny"))


# ----------------------------------------------------------------------------------------------- parameters
@case("knn")
def param_unknown(path: Path, victim: Path) -> None:
    """A parameter the constructor does not take."""
    edit(path, lambda m: m["params"].update(__class__="os.system"))


@case("knn")
def param_object_marker(path: Path, victim: Path) -> None:
    """A parameter dressed as an object of the earlier format."""
    edit(path, lambda m: m["params"].update(index={"$object": "os:system", "state": {}}))


@case("knn")
def param_wrong_type(path: Path, victim: Path) -> None:
    """k as a string."""
    edit(path, lambda m: m["params"].update(k="5"))


@case("knn")
def param_huge_k(path: Path, victim: Path) -> None:
    """k far above the fit set's rows (faiss would allocate k results per query)."""
    edit(path, lambda m: m["params"].update(k=10**15))


@case("knn")
def param_negative(path: Path, victim: Path) -> None:
    """A negative k."""
    edit(path, lambda m: m["params"].update(k=-1))


@case("knn")
def param_float_for_int(path: Path, victim: Path) -> None:
    """k as a float."""
    edit(path, lambda m: m["params"].update(k=5.5))


@case("knn")
def params_a_list(path: Path, victim: Path) -> None:
    """Parameters as a list."""
    edit(path, lambda m: m.update(params=[5]))


@case("nac")
def param_layers_unhashable(path: Path, victim: Path) -> None:
    """nac layers as objects (unhashable, so a set of them raises TypeError)."""
    edit(path, lambda m: m["params"].update(layers=[{"a": 1}]))


# ----------------------------------------------------------------------------------------------- the fit's shape
@case("maha")
def fit_features_one_more(path: Path, victim: Path) -> None:
    """D one larger than the arrays: every D-shaped array disagrees."""
    edit(path, lambda m: m["fit"].update(num_features=m["fit"]["num_features"] + 1))


@case("maha")
def fit_features_zero(path: Path, victim: Path) -> None:
    """D = 0."""
    edit(path, lambda m: m["fit"].update(num_features=0))


@case("maha")
def fit_features_huge(path: Path, victim: Path) -> None:
    """D = 2^62."""
    edit(path, lambda m: m["fit"].update(num_features=1 << 62))


@case("maha")
def fit_features_bool(path: Path, victim: Path) -> None:
    """D = true."""
    edit(path, lambda m: m["fit"].update(num_features=True))


@case("maha")
def fit_rows_fewer_than_classes(path: Path, victim: Path) -> None:
    """N smaller than the classes present."""
    edit(path, lambda m: m["fit"].update(num_rows=2))


@case("maha")
def fit_missing_rows(path: Path, victim: Path) -> None:
    """The fit record without its row count field."""
    edit(path, lambda m: m["fit"].pop("num_rows"))


# ----------------------------------------------------------------------------------------------- state fields
@case("maha")
def state_undeclared_key(path: Path, victim: Path) -> None:
    """An undeclared state value naming a callable."""
    edit(path, lambda m: m["state"].update(x_={"$object": "os:system", "state": {}}))


@case("maha")
def state_missing_key(path: Path, victim: Path) -> None:
    """A declared state value left out."""
    edit(path, lambda m: m["state"].pop("covariance_"))


@case("maha")
def state_zero_strides(path: Path, victim: Path) -> None:
    """An array with zero strides (every element aliasing the first)."""
    edit(path, lambda m: m["state"]["means_"].update(strides=[0, 0]))


@case("maha")
def state_layout_unknown(path: Path, victim: Path) -> None:
    """An array layout that is neither C nor Fortran."""
    edit(path, lambda m: m["state"]["means_"].update(layout="K"))


@case("maha")
def state_array_renamed(path: Path, victim: Path) -> None:
    """An array reference pointing at another array of the file."""
    edit(path, lambda m: m["state"].update(means_={"$array": "covariance_"}))


@case("maha")
def state_object_extra_attribute(path: Path, victim: Path) -> None:
    """An undeclared attribute on a nested object (its class, say)."""
    edit(path, lambda m: m["state"]["gaussians_"].update(__class__="os.system"))


@case("maha")
def state_flag_a_string(path: Path, victim: Path) -> None:
    """A boolean as a string."""
    edit(path, lambda m: m["state"]["gaussians_"].update(triangular="yes"))


@case("rmaha")
def state_triangular_with_background(path: Path, victim: Path) -> None:
    """The triangular fast path claimed for a whitener that carries a background."""
    edit(path, lambda m: m["state"]["gaussians_"].update(triangular=True))


@case("maha")
def state_error_bound_forged(path: Path, victim: Path) -> None:
    """The class search's error bound set to zero (it would skip the float64 check of near ties)."""
    edit(path, lambda m: m["state"]["gaussians_"].update(error_scale_=0.0))


@case("maha")
def state_radius_nan(path: Path, victim: Path) -> None:
    """A non-finite number where a finite one belongs."""
    edit(path, lambda m: m["state"]["gaussians_"].update(radius_={"float": "nan"}))


@case("ash_s")
def state_kept_beyond_features(path: Path, victim: Path) -> None:
    """ASH's kept count above D."""
    edit(path, lambda m: m["state"].update(kept_=10**6))


@case("knn")
def state_faiss_other_kind(path: Path, victim: Path) -> None:
    """A faiss index of another kind than declared."""
    edit(path, lambda m: m["state"].update(index_={"faiss": "IndexHNSWFlat"}))


@case("knn")
def state_faiss_blob(path: Path, victim: Path) -> None:
    """A serialised faiss blob in the current format."""
    edit(path, lambda m: m["state"].update(index_={"$faiss": "index_"}))


# ----------------------------------------------------------------------------------------------- the arrays
def _replace(path: Path, key: str, value: np.ndarray) -> None:
    tensors = arrays(path)
    tensors[key] = value
    write_arrays(path, tensors)


@case("maha")
def whitener_one_column_short(path: Path, victim: Path) -> None:
    """The whitener one column short (the review's case)."""
    whitener = arrays(path)["gaussians_.whitener"]
    _replace(path, "gaussians_.whitener", np.ascontiguousarray(whitener[:-1]))  # stored transposed (Fortran)


@case("maha")
def means_integer(path: Path, victim: Path) -> None:
    """Integers where float64 belongs (the review's case)."""
    _replace(path, "means_", arrays(path)["means_"].astype(np.int64))


@case("maha")
def means_float32(path: Path, victim: Path) -> None:
    """float32 where float64 belongs."""
    _replace(path, "means_", arrays(path)["means_"].astype(np.float32))


@case("maha")
def means_one_dimensional(path: Path, victim: Path) -> None:
    """The right number of values in the wrong rank."""
    _replace(path, "means_", arrays(path)["means_"].ravel())


@case("maha")
def search_operand_short(path: Path, victim: Path) -> None:
    """The class search operand one row short of r + 1."""
    _replace(path, "gaussians_.search_", np.ascontiguousarray(arrays(path)["gaussians_.search_"][:-1]))


@case("maha")
def classes_more_than_rows(path: Path, victim: Path) -> None:
    """More classes than the fit had rows, consistently in every array."""
    tensors = arrays(path)
    for key in ("classes_", "means_", "gaussians_.means", "gaussians_.means_sq"):
        tensors[key] = np.repeat(tensors[key], 200, axis=0)
    tensors["gaussians_.search_"] = np.repeat(tensors["gaussians_.search_"], 200, axis=1)
    write_arrays(path, tensors)


@case("maha")
def array_with_nan(path: Path, victim: Path) -> None:
    """A NaN in the whitener (it would become NaN or plausible scores)."""
    tensors = arrays(path)
    tensors["gaussians_.whitener"][0, 0] = np.nan
    write_arrays(path, tensors)


@case("maha")
def array_extra(path: Path, victim: Path) -> None:
    """An array no declared state uses."""
    _replace(path, "payload", np.zeros(8))


@case("maha")
def array_missing(path: Path, victim: Path) -> None:
    """A declared array left out of the file."""
    tensors = arrays(path)
    del tensors["covariance_"]
    write_arrays(path, tensors)


@case("maha")
def arrays_digest_mismatch(path: Path, victim: Path) -> None:
    """One flipped byte in the arrays, digest not updated."""
    data = bytearray((path / ARRAYS_FILE).read_bytes())
    data[-1] ^= 1
    (path / ARRAYS_FILE).write_bytes(bytes(data))


@case("maha")
def arrays_truncated(path: Path, victim: Path) -> None:
    """The arrays file cut short (digest updated)."""
    data = (path / ARRAYS_FILE).read_bytes()
    (path / ARRAYS_FILE).write_bytes(data[: len(data) // 2])
    reseal(path)


@case("maha")
def arrays_empty_file(path: Path, victim: Path) -> None:
    """An empty arrays file."""
    (path / ARRAYS_FILE).write_bytes(b"")
    reseal(path)


@case("maha")
def arrays_missing_file(path: Path, victim: Path) -> None:
    """No arrays file."""
    (path / ARRAYS_FILE).unlink()


@case("maha")
def arrays_a_directory(path: Path, victim: Path) -> None:
    """The arrays file is a directory."""
    (path / ARRAYS_FILE).unlink()
    (path / ARRAYS_FILE).mkdir()


@case("maha")
def arrays_header_overlapping(path: Path, victim: Path) -> None:
    """Two arrays claiming the same bytes."""
    header = {
        "means_": {"dtype": "F64", "shape": [5, 12], "data_offsets": [0, 480]},
        "covariance_": {"dtype": "F64", "shape": [12, 12], "data_offsets": [0, 1152]},
    }
    raw_safetensors(path, header, bytes(1152))


@case("maha")
def arrays_header_huge_shape(path: Path, victim: Path) -> None:
    """A header claiming an array of 2^60 elements over 8 bytes of data."""
    raw_safetensors(path, {"means_": {"dtype": "F64", "shape": [1 << 30, 1 << 30], "data_offsets": [0, 8]}}, bytes(8))


@case("maha")
def arrays_header_not_json(path: Path, victim: Path) -> None:
    """A header that is not JSON."""
    (path / ARRAYS_FILE).write_bytes(struct.pack("<Q", 5) + b"{{{{{" + bytes(8))
    reseal(path)


@case("maha")
def arrays_header_length_huge(path: Path, victim: Path) -> None:
    """A header length of 2^63 bytes."""
    (path / ARRAYS_FILE).write_bytes(struct.pack("<Q", 1 << 63) + b"{}")
    reseal(path)


@case("maha")
def arrays_object_dtype(path: Path, victim: Path) -> None:
    """An array of a dtype no detector declares (bfloat16), the others intact."""
    tensors = arrays(path)
    header, data, offset = {}, b"", 0
    for key, array in tensors.items():
        raw = bytes(array.size * 2) if key == "means_" else array.tobytes()
        dtype = "BF16" if key == "means_" else {"f": "F", "i": "I", "b": "BOOL"}[array.dtype.kind]
        dtype += "" if dtype in ("BF16", "BOOL") else str(array.dtype.itemsize * 8)
        header[key] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    raw_safetensors(path, header, data)


@case("knn")
def faiss_vectors_wrong_width(path: Path, victim: Path) -> None:
    """The flat index's vectors one column short."""
    _replace(path, "index_", np.ascontiguousarray(arrays(path)["index_"][:, :-1]))


@case("knn")
def faiss_vectors_float64(path: Path, victim: Path) -> None:
    """The flat index's vectors as float64."""
    _replace(path, "index_", arrays(path)["index_"].astype(np.float64))


@case("knn_ivf")
def ivf_ids_out_of_range(path: Path, victim: Path) -> None:
    """Inverted-list ids that do not number the rows."""
    tensors = arrays(path)
    tensors["index_.ids"][0] = 10**12
    write_arrays(path, tensors)


@case("knn_ivf")
def ivf_list_sizes_negative(path: Path, victim: Path) -> None:
    """List sizes that do not add up (one negative)."""
    tensors = arrays(path)
    tensors["index_.list_sizes"][0] = -1
    tensors["index_.list_sizes"][1] += 1
    write_arrays(path, tensors)


@case("nac")
def nac_coverage_short(path: Path, victim: Path) -> None:
    """nac's padded coverage one cell short (lookups would run past it)."""
    key = next(k for k in arrays(path) if k.startswith("padded_coverage_"))
    _replace(path, key, arrays(path)[key][:-1].copy())


@case("nac")
def nac_layer_renamed(path: Path, victim: Path) -> None:
    """Per-layer state under a layer the parameters do not name."""
    edit(path, lambda m: m["state"].update(edges_={"elsewhere": m["state"]["edges_"]["penultimate"]}))


# ----------------------------------------------------------------------------------------------- building
SOURCES = {
    "maha": ("maha", {}),
    "rmaha": ("rmaha", {}),
    "knn": ("knn", {"k": 5}),
    "knn_ivf": ("knn", {"k": 5, "index": "ivf", "nlist": 4, "nprobe": 4}),
    "nac": ("nac", {"fit_rows": 100, "alpha": 50.0}),
    "ash_s": ("ash_s", {"percentile": 80}),
}


def fit_data(seed: int = 0) -> tuple[Outputs, Head]:
    """A small fit set (12 features, 5 classes, 300 rows) with its head."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(5, 12)) * 2.0 + 1.0
    labels = rng.integers(0, 5, 300)
    features = np.maximum(centres[labels] + rng.normal(size=(300, 12)), 0.0).astype(np.float32)
    head = Head((0.4 * centres).astype(np.float32), rng.normal(size=5).astype(np.float32))
    return Outputs(features, head.logits(features).astype(np.float32), labels.astype(np.int64)), head


PROVENANCE = {"model_id": "tiny", "fit_dataset": "fit", "model": "tiny-net", "checkpoint": "sha256:abc"}


def build(
    out: Path, victim: Path, plugin_dir: Path, provenance: dict[str, Any] | None = None, only: str = ""
) -> list[Path]:
    """Write every case (whose name starts with `only`) into out/<case>; the probe module into plugin_dir."""
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / f"{EVIL_MODULE}.py").write_text(EVIL_SOURCE)
    fit, head = fit_data()
    valid = out / "_valid"
    for source, (name, params) in SOURCES.items():
        if any(s == source and n.startswith(only) for n, (s, _) in CASES.items()):
            save(create(name, **params).fit(fit, head), valid / source, provenance=provenance or PROVENANCE)
    paths = []
    for name, (source, mutate) in CASES.items():
        if not name.startswith(only):
            continue
        path = out / name
        if path.exists():
            shutil.rmtree(path)
        if source == "none":
            path.mkdir(parents=True)
        else:
            shutil.copytree(valid / source, path)
        mutate(path, victim)
        paths.append(path)
    shutil.rmtree(valid, ignore_errors=True)
    return paths


if __name__ == "__main__":
    root = Path(sys.argv[1])
    written = build(root, root / "victim.txt", root / "plugins", only=sys.argv[2] if len(sys.argv) > 2 else "")
    (root / "victim.txt").write_text("must survive\n")
    print(
        f"{len(written)} hostile detectors in {root} (victim {root / 'victim.txt'}; probe module in {root / 'plugins'})"
    )
