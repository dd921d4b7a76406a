"""Feature packs: the demo's store round-trips byte for byte, a pack evaluates as its store does, and opens without
oodbench; export streams; import verifies everything before anything enters the store and resumes; float16 packs
stay within float16's rounding; a pack of another network or other images is refused for a comparison."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from oodbench import Outputs, Store
from oodbench.cli.main import main
from oodbench.core import pack as pack_module
from oodbench.core.errors import StoreError
from oodbench.core.pack import PackStore, export_pack, import_pack
from oodbench.core.rundir import RunDir

MODEL = "digits-cnn"


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's store (its CNN trained for 2 epochs: the same entries, arrays and head as the full demo's)."""
    from oodbench.demo import prepare

    root = tmp_path_factory.mktemp("demo")
    prepare(root, seed=0, epochs=2)
    return root / "store"


@pytest.fixture(scope="module")
def demo_pack(demo_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("packs") / "demo"
    store = Store(demo_store)
    export_pack(store, dest, [(MODEL, d) for d in store.datasets(MODEL)])
    return dest


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------- round trip
def test_demo_store_round_trips_through_a_pack_byte_for_byte(demo_store, tmp_path, capsys):
    code, out, err = _run(
        ["pack", "export", "--store", str(demo_store), "--to", str(tmp_path / "p"), "--no-progress"], capsys
    )
    assert code == 0, err
    assert "exported 7 entries and heads" in out
    code, out, err = _run(
        ["pack", "import", str(tmp_path / "p"), "--store", str(tmp_path / "s"), "--no-progress"], capsys
    )
    assert code == 0, err
    original, imported = _tree(demo_store), _tree(tmp_path / "s")
    assert sorted(imported) == sorted(original)  # every entry file, head file and lock file; no staging left
    assert all(imported[name] == original[name] for name in original)
    for dataset in Store(tmp_path / "s").datasets(MODEL):
        assert Store(tmp_path / "s").verify(MODEL, dataset).ok


def test_a_pack_reads_as_its_store_does_memory_mapped_and_read_only(demo_store, demo_pack):
    store, pack = Store(demo_store), Store(demo_pack)
    assert isinstance(pack, PackStore) and not isinstance(store, PackStore)
    assert pack.models() == store.models() and pack.datasets(MODEL) == store.datasets(MODEL)
    for dataset in store.datasets(MODEL):
        ours, theirs = pack.read(MODEL, dataset), store.read(MODEL, dataset)
        assert isinstance(ours.features, np.memmap)
        for name in ("features", "logits", "labels"):
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b))
        assert set(ours.extras) == set(theirs.extras)
        assert all(np.array_equal(ours.extras[k], theirs.extras[k]) for k in ours.extras)
        assert np.array_equal(pack.read_array(MODEL, dataset, "index"), store.read_array(MODEL, dataset, "index"))
        assert pack.meta(MODEL, dataset) == store.meta(MODEL, dataset)
    head_a, head_b = pack.read_head(MODEL), store.read_head(MODEL)
    assert np.array_equal(head_a.weight, head_b.weight) and np.array_equal(head_a.bias, head_b.bias)
    with pytest.raises(StoreError, match="is a pack \\(read-only\\)"):
        pack.write_outputs(MODEL, "x", Outputs(np.zeros((2, 3), np.float32)), provenance={})
    with pytest.raises(StoreError, match="no entry"):
        pack.read(MODEL, "imagenet")


def test_evaluate_on_a_pack_equals_evaluate_on_its_store(demo_store, demo_pack, tmp_path, capsys):
    import pandas as pd

    common = ["--model", MODEL, "--fit", "digits-fit", "--id", "digits-id-test", "--ood", "digits-6to9"]
    common += ["--ood", "lfw-faces", "--ood", "noise", "-d", "msp,energy,maha,knn,odin", "-p", "knn.k=10"]
    tables = []
    for option, source, out in (("--store", demo_store, tmp_path / "a"), ("--pack", demo_pack, tmp_path / "b")):
        code, _, err = _run(["evaluate", option, str(source), *common, "--out", str(out), "--no-progress"], capsys)
        assert code == 0, err
        tables.append(((out / "table.md").read_text(), pd.read_parquet(out / "results.parquet")))
    assert tables[0][0] == tables[1][0]
    pd.testing.assert_frame_equal(tables[0][1], tables[1][1], check_exact=True)
    both = ["evaluate", "--store", str(demo_store), "--pack", str(demo_pack), *common, "--out", str(tmp_path / "c")]
    code, _, err = _run(both, capsys)
    assert code == 2 and "one of them" in _one_error_line(err) and not (tmp_path / "c").exists()


def test_a_pack_opens_without_oodbench(demo_store, demo_pack):
    from safetensors.numpy import load_file

    manifest = json.loads((demo_pack / "manifest.json").read_text())
    for name, record in manifest["files"].items():
        data = (demo_pack / name).read_bytes()
        assert len(data) == record["size"] and hashlib.sha256(data).hexdigest() == record["sha256"]
    arrays = load_file(str(demo_pack / MODEL / "digits-fit" / "arrays.safetensors"))
    stored = Store(demo_store).read(MODEL, "digits-fit")
    assert np.array_equal(arrays["features"], stored.features) and np.array_equal(arrays["labels"], stored.labels)
    model = manifest["models"][MODEL]
    provenance = Store(demo_store).meta(MODEL, "digits-fit")["provenance"]
    assert model["weights"] == provenance["checkpoint"] and model["preprocessing"] == provenance["preprocessing"]
    entry = model["datasets"]["digits-fit"]
    assert entry["image_list_sha256"] == Store(demo_store).meta(MODEL, "digits-fit")["item_hash"]
    assert manifest["oodbench_version"] and manifest["format"] == "oodbench-pack"
    import yaml

    card = (demo_pack / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "other" and "oodbench" in front["tags"] and front["size_categories"] == ["1K<n<10K"]


# ----------------------------------------------------------------------------------------------- streaming
def test_export_writes_in_bounded_chunks_and_the_bytes_do_not_depend_on_them(demo_store, tmp_path, monkeypatch):
    store = Store(demo_store)
    entries = [(MODEL, "digits-fit")]
    export_pack(store, tmp_path / "big", entries)
    written: list[int] = []
    original_write = pack_module._HashingWriter.write

    def recording(self, data):
        written.append(len(data))
        return original_write(self, data)

    monkeypatch.setattr(pack_module, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(pack_module._HashingWriter, "write", recording)
    export_pack(store, tmp_path / "small", entries)
    arrays = "digits-cnn/digits-fit/arrays.safetensors"
    assert (tmp_path / "small" / arrays).read_bytes() == (tmp_path / "big" / arrays).read_bytes()
    header = struct.unpack("<Q", (tmp_path / "small" / arrays).read_bytes()[:8])[0] + 8
    # Every write is one chunk of rows (at most 4096 bytes, a row being 2,560 bytes at most) or the header.
    assert max(n for n in written if n != header) <= 4096 and len(written) > 100


# ----------------------------------------------------------------------------------------------- import
def test_import_verifies_every_entry_before_any_enters_the_store_and_resumes(
    demo_store, demo_pack, tmp_path, monkeypatch
):
    import shutil

    pack = tmp_path / "pack"
    shutil.copytree(demo_pack, pack)
    victim = pack / MODEL / "noise" / "arrays.safetensors"  # the last entry in import order
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0x40
    victim.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="noise") as info:
        import_pack(pack, tmp_path / "store")
    assert "\n" not in str(info.value)
    assert Store(tmp_path / "store").models() == []  # nothing entered the store
    staged = sorted(
        p.name for p in (tmp_path / "store" / ".pack-import" / MODEL).iterdir() if not p.name.startswith(".")
    )
    assert "digits-fit" in staged and "noise" not in staged
    data[-3] ^= 0x40
    victim.write_bytes(bytes(data))
    copied: list[str] = []
    original = pack_module._stage_entry
    monkeypatch.setattr(
        pack_module, "_stage_entry", lambda p, m, d, *rest: (copied.append(d), original(p, m, d, *rest))[1]
    )
    summary = import_pack(pack, tmp_path / "store")
    assert set(copied) == {"noise", "head"}  # the entries verified and staged before are kept
    assert len(summary.entries) == 7
    for dataset in ("digits-fit", "noise", "head"):
        assert _tree(tmp_path / "store" / MODEL / dataset) == _tree(demo_store / MODEL / dataset)
    assert not (tmp_path / "store" / ".pack-import").exists()


def test_a_pack_of_another_network_or_other_images_is_refused_unless_allowed(demo_pack, tmp_path, capsys):
    store = Store(tmp_path / "store")
    rng = np.random.default_rng(0)
    outputs = Outputs(rng.normal(size=(4, 64)).astype(np.float32))
    provenance = dict(Store(demo_pack).meta(MODEL, "noise")["provenance"], checkpoint="other-weights")
    store.write_outputs(MODEL, "mine", outputs, provenance=provenance)
    code, _, err = _run(["pack", "import", str(demo_pack), "--store", str(tmp_path / "store"), "--no-progress"], capsys)
    line = _one_error_line(err)
    assert code == 2 and "weights" in line and "other-weights" in line and "--allow-different" in line
    assert store.datasets(MODEL) == ["mine"]
    code, out, err = _run(
        ["pack", "verify", str(demo_pack), "--against", str(tmp_path / "store"), "--no-progress"], capsys
    )
    assert code == 2 and "other-weights" in _one_error_line(err)
    # Same network, but another image list under the same dataset id.
    same = Store(tmp_path / "same")
    same.write_outputs(
        MODEL, "noise", outputs, provenance=Store(demo_pack).meta(MODEL, "noise")["provenance"], item_hash="0" * 64
    )
    with pytest.raises(StoreError, match="image list"):
        import_pack(demo_pack, tmp_path / "same", datasets=["digits-fit"])
    summary = import_pack(demo_pack, tmp_path / "store", allow_different=True)
    assert len(summary.entries) == 7


def test_import_refuses_an_entry_the_store_holds_with_other_data(demo_pack, tmp_path):
    store = Store(tmp_path / "store")
    provenance = Store(demo_pack).meta(MODEL, "noise")["provenance"]
    item_hash = Store(demo_pack).meta(MODEL, "noise")["item_hash"]
    store.write_outputs(
        MODEL, "noise", Outputs(np.ones((3, 64), np.float32)), provenance=provenance, item_hash=item_hash
    )
    before = _tree(tmp_path / "store")
    with pytest.raises(StoreError, match="already holds digits-cnn/noise with other data"):
        import_pack(demo_pack, tmp_path / "store")
    assert _tree(tmp_path / "store") == before


# ----------------------------------------------------------------------------------------------- float16
def test_float16_packs_halve_the_floats_within_float16_rounding_and_are_not_imported(demo_store, tmp_path, capsys):
    store = Store(demo_store)
    entries = [(MODEL, d) for d in store.datasets(MODEL)]
    export_pack(store, tmp_path / "p16", entries, float16=True)
    export_pack(store, tmp_path / "p32", entries)
    half = Store(tmp_path / "p16")
    for dataset in store.datasets(MODEL):
        exact, rounded = store.read(MODEL, dataset), half.read(MODEL, dataset)
        assert rounded.features.dtype == np.float16 and rounded.logits.dtype == np.float16
        assert exact.labels is None or np.array_equal(rounded.labels, exact.labels)  # labels stay exact
        x = np.asarray(exact.features, np.float64)
        # Round to nearest float16: relative error at most 2^-11 for normal numbers, absolute 2^-25 below 2^-14.
        bound = np.maximum(np.abs(x) * 2.0**-11, 2.0**-25)
        assert (np.abs(np.asarray(rounded.features, np.float64) - x) <= bound).all()
    size = lambda p: sum(f.stat().st_size for f in p.rglob("arrays.safetensors"))  # noqa: E731
    assert size(tmp_path / "p16") < 0.55 * size(tmp_path / "p32")
    code, _, err = _run(
        ["pack", "import", str(tmp_path / "p16"), "--store", str(tmp_path / "s"), "--no-progress"], capsys
    )
    assert code == 2 and "float16 pack" in _one_error_line(err)
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------------------------- verify and ls
def test_verify_finds_a_flipped_byte_and_ls_marks_entries_not_here(demo_pack, tmp_path, capsys):
    import shutil

    pack = tmp_path / "pack"
    shutil.copytree(demo_pack, pack)
    code, out, err = _run(["pack", "verify", str(pack), "--no-progress"], capsys)
    assert code == 0 and "all intact" in out, err
    victim = pack / MODEL / "digits-id-test" / "arrays.safetensors"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    code, out, err = _run(["pack", "verify", str(pack), "--no-progress"], capsys)
    assert code == 2 and "digits-id-test/arrays.safetensors" in out and "1 files damaged" in _one_error_line(err)
    with pytest.raises(StoreError, match=r"damaged.*pack again \(`oodbench pack verify`"):
        Store(pack).read(MODEL, "digits-id-test")  # checked before first use, with a pack's remedy
    with pytest.raises(StoreError, match=r"damaged.*pack again \(`oodbench pack verify`"):
        RunDir(tmp_path / "run").verify_store(Store(pack, verify=False), MODEL, ["digits-id-test"])
    shutil.rmtree(pack / MODEL / "lfw-faces")
    code, out, err = _run(["pack", "ls", str(pack)], capsys)
    assert code == 0 and "lfw-faces: 200 rows" in out and "not pulled" in out
    assert "lfw-faces" not in Store(pack).datasets(MODEL)
    with pytest.raises(StoreError, match="not pulled"):
        Store(pack).read(MODEL, "lfw-faces")
