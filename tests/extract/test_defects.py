"""Defective files and full disks in extraction: a 16-bit PNG keeps its pixels, each unreadable file is one line
naming it (once per store and process, however many models and passes read it), and a disk that fills up mid-run is one ExtractError line,
leaves no entry that reads as complete, and a rerun finishes byte-identical to a run that never failed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodbench import Store
from oodbench.core.errors import ExtractError
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.datasets import image_folder, load_rgb
from oodbench.extract.pipeline import GroupMember, extract, extract_group

from .helpers import write_images


def test_sixteen_bit_png_is_scaled_not_clipped(tmp_path) -> None:
    """PIL's convert("RGB") clips 16-bit greyscale at 255 (all but the darkest pixels white); v / 257 keeps it."""
    grey = np.arange(256, dtype=np.uint16).reshape(16, 16)
    path = tmp_path / "deep.png"
    Image.fromarray(grey * 257).save(path)  # 0, 257, ..., 65535: exactly k * 257
    assert Image.open(path).mode.startswith("I")
    rgb = np.asarray(load_rgb(path))
    assert rgb.shape == (16, 16, 3)
    np.testing.assert_array_equal(rgb[..., 0], grey.astype(np.uint8))
    np.testing.assert_array_equal(rgb[..., 1], rgb[..., 2])
    # rounding: 385 / 257 = 1.498 -> 1, 386 / 257 = 1.502 -> 2
    Image.fromarray(np.asarray([[385, 386]], dtype=np.uint16)).save(path)
    assert np.asarray(load_rgb(path))[0, :, 0].tolist() == [1, 2]


def test_each_unreadable_file_is_one_line(tmp_path, capsys) -> None:
    root = write_images(tmp_path / "d", {"a": 3, "b": 2}, corrupt=["a/bad.png", "b/empty.png"])
    (root / "b" / "empty.png").write_bytes(b"")
    dataset = image_folder(root)
    store = Store(tmp_path / "store")
    members = [
        GroupMember(load_timm("test_resnet", pretrained=False, image_size=32), "r0", 2),
        GroupMember(load_timm("test_resnet", pretrained=False, seed=1, image_size=32), "r1", 3),
    ]
    reports = extract_group(store, members, dataset, dataset_id="d", num_workers=0, progress=False, device="cpu")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("d: skipped ")]
    assert sorted(lines) == sorted(
        [
            f"d: skipped {root / 'a' / 'bad.png'}: {reports[0].skipped[0]['error']}",
            f"d: skipped {root / 'b' / 'empty.png'}: {reports[0].skipped[1]['error']}",
        ]
    )
    assert "d: 2 unreadable image(s) skipped" in err
    assert [len(r.skipped) for r in reports] == [2, 2]  # counted in each entry (meta.json)
    extract(store, members[0].backbone, dataset, dataset_id="d", model_id="r0", num_workers=0, progress=False)
    assert "skipped" not in capsys.readouterr().err  # complete: nothing read again, nothing said again
    # another pass over the same files into the same store (the runner makes one per group of models): no line again
    other = load_timm("test_resnet", pretrained=False, seed=2, image_size=32)
    extract(store, other, dataset, dataset_id="d", model_id="r2", num_workers=0, progress=False)
    err = capsys.readouterr().err
    assert "d: skipped" not in err and "2 unreadable image(s) skipped (2 of them listed by an earlier pass)" in err
    # another store is another run: its lines come again
    extract(Store(tmp_path / "other"), other, dataset, dataset_id="d", model_id="r2", num_workers=0, progress=False)
    assert capsys.readouterr().err.count("d: skipped") == 2


def _no_space(path: object) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def _fill_disk(monkeypatch, where: str, at: int | str) -> None:
    """Make the store's write `at` fail with ENOSPC, as a disk that fills up would: the n-th shard array
    (``shard``), a step of the merge that finalises the entry (``merge``), or its meta.json (``meta``)."""
    import oodbench.core.store as store_module

    if where == "shard":
        real, calls = store_module.atomic_save_npy, [0]

        def save(path, array):
            calls[0] += 1
            if calls[0] == at:
                raise _no_space(path)
            return real(path, array)

        monkeypatch.setattr(store_module, "atomic_save_npy", save)
    elif where == "merge":

        def step(name: str) -> None:
            if name == at:
                raise _no_space(name)

        monkeypatch.setattr(store_module, "_merge_step", step)
    else:
        real_json = store_module.atomic_write_json

        def write_json(path, payload):
            if str(path).endswith("meta.json") and payload.get("complete"):
                raise _no_space(path)
            return real_json(path, payload)

        monkeypatch.setattr(store_module, "atomic_write_json", write_json)


@pytest.mark.parametrize(
    "where, at",
    [("shard", 2), ("shard", 7), ("merge", "copied logits 1"), ("merge", "recorded features 2"), ("meta", 0)],
)
def test_a_full_disk_is_one_line_and_a_rerun_resumes_byte_identical(tmp_path, monkeypatch, where, at) -> None:
    """Shards of 4 items (3 shards, 4 arrays each): a write fails in the first or a later shard, in the merge that
    finalises the entry, or in its meta.json."""
    root = write_images(tmp_path / "d", {"a": 5, "b": 6})
    dataset = image_folder(root)
    backbone = load_timm("test_resnet", pretrained=False, image_size=32)
    options = {"dataset_id": "d", "num_workers": 0, "progress": False, "shard_size": 4, "batch_size": 3}
    clean = Store(tmp_path / "clean")
    extract(clean, backbone, dataset, **options)
    store = Store(tmp_path / "store")
    with monkeypatch.context() as patch:
        _fill_disk(patch, where, at)
        with pytest.raises(ExtractError, match=r"no space left on the device while writing test_resnet/d") as info:
            extract(store, backbone, dataset, **options)
    assert "\n" not in str(info.value) and "rerun to resume" in str(info.value)
    assert not store.exists("test_resnet", "d")  # nothing half-written reads as complete
    extract(store, backbone, dataset, **options)
    for name in ("features", "logits", "index", "labels"):
        np.testing.assert_array_equal(
            store.read_array("test_resnet", "d", name), clean.read_array("test_resnet", "d", name)
        )
        assert (
            store.read_array("test_resnet", "d", name).tobytes() == clean.read_array("test_resnet", "d", name).tobytes()
        )


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch) -> None:
    import oodbench.core.store as store_module

    def refuse(path, array):
        raise OSError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(store_module, "atomic_save_npy", refuse)
    root = write_images(tmp_path / "d", {"a": 2})
    backbone = load_timm("test_resnet", pretrained=False, image_size=32)
    with pytest.raises(PermissionError):
        extract(Store(tmp_path / "s"), backbone, image_folder(root), dataset_id="d", num_workers=0, progress=False)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
def test_open_files_do_not_grow_with_the_batch_size(tmp_path) -> None:
    """A tensor a loader worker hands over holds a file descriptor in the main process while it lives. Handed over
    one per image and model, a shared-decode pass held 2 x 32 x (batches in flight) of them (72 here; with the Fi
    config's passes of many models, 4 workers and batches of 64, past a 1,024-file limit). One tensor per transform
    and decode batch: at most (2 prefetched + 1 in use + 1 partly consumed) batches x 2 transforms = 8, plus the
    loader's own pipes and sockets (8 at most)."""
    root = write_images(tmp_path / "d", {"a": 64, "b": 64})
    peak = [0]

    def counting(backbone):
        infer = backbone.infer

        def wrapped(pixels, amp=True):
            peak[0] = max(peak[0], len(os.listdir("/proc/self/fd")))
            return infer(pixels, amp=amp)

        backbone.infer = wrapped
        return backbone

    members = [
        GroupMember(counting(load_timm("test_resnet", pretrained=False, image_size=32)), "r0", 32),
        GroupMember(counting(load_timm("test_efficientnet", pretrained=False, image_size=40)), "e0", 32),
    ]
    base = len(os.listdir("/proc/self/fd"))
    store = Store(tmp_path / "s")
    extract_group(store, members, image_folder(root), dataset_id="d", num_workers=1, progress=False, device="cpu")
    assert peak[0] - base <= 16
    alone = Store(tmp_path / "alone")  # the arrays are still those of a model extracted alone
    extract(
        alone,
        members[1].backbone,
        image_folder(root),
        dataset_id="d",
        model_id="e0",
        batch_size=32,
        num_workers=0,
        progress=False,
    )
    assert store.read_array("e0", "d", "features").tobytes() == alone.read_array("e0", "d", "features").tobytes()


def test_an_unreadable_image_is_described_the_same_on_every_read(tmp_path):
    """The reason is recorded in the store's meta.json: it names no in-memory object (whose repr holds an address)."""
    from oodbench.extract.datasets import UnreadableImage, load_rgb

    path = tmp_path / "zz.png"
    path.write_bytes(b"<html>not an image</html>")
    reasons = []
    for _ in range(2):
        with pytest.raises(UnreadableImage) as caught:
            load_rgb(path)
        reasons.append(str(caught.value))
    assert reasons[0] == reasons[1] and "0x" not in reasons[0] and reasons[0].startswith("UnidentifiedImageError: ")
