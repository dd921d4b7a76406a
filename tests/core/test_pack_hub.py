"""Push and pull through huggingface_hub against a local stand-in of the Hub (127.0.0.1, never the internet):
a pull downloads only the entries asked for, resumes a broken download from the bytes it has, and deletes a file
whose SHA-256 differs from the manifest's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from oodbench import Head, Outputs, Store
from oodbench.cli.main import main
from oodbench.core.errors import StoreError
from oodbench.core.pack import export_pack
from oodbench.core.packhub import pull_pack, push_pack

from .hub_server import HubServer

pytest.importorskip("huggingface_hub")

PROV = {"model": "toy", "checkpoint": "c1", "preprocessing": {"size": 8}}
REPO = "lab/toy-pack"


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    store = Store(tmp_path / "store")
    for model in ("toy", "other"):
        for name, n in (("fit", 300), ("test", 200), ("ood", 200)):
            z = rng.normal(size=(n, 64)).astype(np.float32)
            store.write_outputs(model, name, Outputs(z, z[:, :3].copy(), rng.integers(0, 3, n)), provenance=PROV)
        store.write_head(
            model, Head(rng.normal(size=(3, 64)).astype(np.float32), np.zeros(3, np.float32)), provenance=PROV
        )
    export_pack(store, tmp_path / "pack", [(m, d) for m in ("toy", "other") for d in ("fit", "test", "ood")])
    return tmp_path / "pack"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants as constants

    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token of the user's is read or sent
        monkeypatch.delenv("HF_TOKEN", raising=False)
        # The suite runs offline (HF_HUB_OFFLINE=1); these tests talk to 127.0.0.1 only. The stand-in speaks HTTP
        # LFS, not the Xet protocol.
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        # The client writes what it received in blocks of this size; a block cut short is received again. Blocks
        # smaller than these test files (10 MiB by default) let a cut leave bytes on disk, as on a real file.
        monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
        yield server


def _downloads(server: HubServer) -> list[str]:
    return [
        re.sub(r"^/datasets/[^/]+/[^/]+/resolve/[^/]+/", "", p)
        for m, p, _ in server.state.log
        if m == "GET" and "/resolve/" in p
    ]


def test_push_then_pull_only_the_entries_asked_for(pack, hub, tmp_path, capsys):
    with pytest.raises(SystemExit) as code:
        main(["pack", "push", str(pack), REPO])
    out = capsys.readouterr().out
    assert code.value.code == 0 and f"pushed {pack} to {REPO}" in out
    assert not hub.state.unknown
    files = hub.state.repos[REPO]["files"]
    assert set(files) == {p.relative_to(pack).as_posix() for p in pack.rglob("*") if p.is_file()}
    assert all(files[name] == (pack / name).read_bytes() for name in files)
    assert hub.state.cards and hub.state.cards[-1]["license"] == "other"  # the card's YAML as the Hub validated it
    with pytest.raises(SystemExit) as code:
        main(["pack", "pull", REPO, "--to", str(tmp_path / "pulled"), "--model", "toy", "--dataset", "ood"])
    assert code.value.code == 0, capsys.readouterr().err
    got = sorted(set(_downloads(hub)))
    assert got == ["README.md", "manifest.json", "toy/head/arrays.safetensors", "toy/head/meta.json"] + [
        "toy/ood/arrays.safetensors",
        "toy/ood/meta.json",
    ]
    pulled = Store(tmp_path / "pulled")
    assert pulled.models() == ["toy"] and pulled.datasets("toy") == ["ood"]
    assert np.array_equal(pulled.read("toy", "ood").features, Store(pack).read("toy", "ood").features)
    with pytest.raises(StoreError, match="not pulled"):
        pulled.read("toy", "fit")


def test_a_broken_pull_resumes_from_the_bytes_it_has(pack, hub, tmp_path, capsys):
    push_pack(pack, REPO)
    name = "other/fit/arrays.safetensors"
    size = len(hub.state.repos[REPO]["files"][name])
    cut = size // 3
    hub.state.break_after[name] = cut  # the connection drops after a third of the file
    hub.state.refuse[name] = 100  # and the server stays away for the client's own retries
    with pytest.raises(SystemExit) as code:
        main(["pack", "pull", REPO, "--to", str(tmp_path / "pulled"), "--model", "other", "--dataset", "fit"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip().startswith("error:")]
    assert code.value.code == 2 and len(lines) == 1 and "rerun the same command to resume" in lines[0], err
    assert not (tmp_path / "pulled" / name).exists()
    kept = (tmp_path / "pulled" / "other" / "fit" / ".arrays.safetensors.partial").stat().st_size
    assert 0 < kept <= cut
    hub.state.refuse.clear()
    hub.state.log.clear()
    summary = pull_pack(REPO, tmp_path / "pulled", models=["other"], datasets=["fit"])
    ranges = [h.get("Range") or h.get("range") for m, p, h in hub.state.log if m == "GET" and p.endswith(name)]
    assert ranges == [f"bytes={kept}-"]  # only the missing bytes were asked for
    assert (tmp_path / "pulled" / name).read_bytes() == (pack / name).read_bytes()
    assert summary.entries == ["other/fit", "other/head"]


def test_a_pulled_file_that_fails_its_checksum_is_deleted(pack, hub, tmp_path):
    push_pack(pack, REPO)
    name = "toy/test/arrays.safetensors"
    data = bytearray(hub.state.repos[REPO]["files"][name])
    data[-1] ^= 0xFF
    hub.state.repos[REPO]["files"][name] = bytes(data)
    with pytest.raises(StoreError, match="failed their checksums and were deleted") as info:
        pull_pack(REPO, tmp_path / "pulled", models=["toy"], datasets=["test"])
    assert "\n" not in str(info.value)
    assert not (tmp_path / "pulled" / name).exists()


def test_a_damaged_pack_is_not_pushed(pack, hub):
    victim = pack / "toy" / "fit" / "arrays.safetensors"
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="not pushed"):
        push_pack(pack, REPO)
    assert REPO not in hub.state.repos


def test_a_repository_named_for_evaluation_pulls_only_that_model_and_those_sets(pack, hub, tmp_path, monkeypatch):
    from oodbench.core.packhub import resolve_pack

    push_pack(pack, REPO)
    monkeypatch.setenv("OODBENCH_PACK_CACHE", str(tmp_path / "cache"))
    hub.state.log.clear()
    folder = resolve_pack(REPO, "other", ["fit", "test", "test"])
    assert folder == tmp_path / "cache" / REPO
    assert Store(folder).models() == ["other"] and Store(folder).datasets("other") == ["fit", "test"]
    assert {path.split("/")[0] for path in _downloads(hub)} == {"manifest.json", "README.md", "other"}
    assert not any(path.startswith("other/ood/") for path in _downloads(hub))
    assert resolve_pack(str(pack), "toy", ["fit"]) == pack  # a folder is used as it is
    with pytest.raises(StoreError, match="neither a pack folder nor a dataset repository"):
        resolve_pack("../x", "toy", ["fit"])


def test_a_server_sending_more_than_the_manifest_records_is_cut_off(pack, hub, tmp_path):
    push_pack(pack, REPO)
    name = "toy/fit/meta.json"
    files = hub.state.repos[REPO]["files"]
    files[name] = files[name] + b" " * 10_000_000  # served with its true length, but the manifest says less
    with pytest.raises(StoreError, match="more bytes than the manifest records"):
        pull_pack(REPO, tmp_path / "pulled", models=["toy"], datasets=["fit"])
    partial = tmp_path / "pulled" / "toy" / "fit" / ".meta.json.partial"
    assert not (tmp_path / "pulled" / name).exists()
    assert not partial.exists() or partial.stat().st_size <= len(files[name]) - 10_000_000
