"""Images a user's download can hold: decompression bombs, truncated files, FIFOs, link loops, files changing
while read. Each is an `UnreadableImage` with one line naming the reason (the item is skipped and reported),
decided before anything large is decoded; nothing hangs and nothing is walked twice."""

from __future__ import annotations

import io
import os
import struct
import threading
import zlib

import numpy as np
import pytest

from oodbench.extract import datasets
from oodbench.extract.datasets import UnreadableImage, _walk_images, load_rgb

pytestmark = pytest.mark.hostile

MAX_IMAGE_PIXELS = getattr(datasets, "MAX_IMAGE_PIXELS", 0)

PIL = pytest.importorskip("PIL.Image")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png(width: int, height: int, *, rows: int | None = None) -> bytes:
    """A greyscale PNG declaring width x height; its pixel data holds `rows` zero rows (all of them by default)."""
    raw = zlib.compressobj(9)
    line = b"\x00" * (width + 1)
    body = b"".join(raw.compress(line) for _ in range(height if rows is None else rows)) + raw.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def jpeg(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header is rewritten to declare width x height."""
    buffer = io.BytesIO()
    PIL.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buffer, format="JPEG")
    data = bytearray(buffer.getvalue())
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


BOMBS = {
    "png 50000x50000": lambda: png(50_000, 50_000, rows=1),
    "jpeg 50000x50000": lambda: jpeg(50_000, 50_000),
    "png 65535x65535": lambda: png(65_535, 65_535, rows=1),
    "jpeg 65535x65535": lambda: jpeg(65_535, 65_535),
    "png just above the cap": lambda: png(9_460, 9_460),  # 89.5 MP: PIL only warns, then decodes it all
    "jpeg just above the cap": lambda: jpeg(9_460, 9_460),
    "png 1 x 2^31 - 1": lambda: png(1, 2**31 - 1, rows=1),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_a_decompression_bomb_is_refused_before_decoding(tmp_path, monkeypatch, case):
    path = tmp_path / ("bomb.png" if case.startswith("png") else "bomb.jpg")
    path.write_bytes(BOMBS[case]())
    decoded = []
    from PIL import ImageFile

    original = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self.size) or original(self))
    with pytest.raises(UnreadableImage) as info:
        load_rgb(path)
    assert decoded == [] and "\n" not in str(info.value), str(info.value)


def test_an_image_within_the_cap_loads(tmp_path):
    path = tmp_path / "ok.png"
    path.write_bytes(png(64, 32))
    assert load_rgb(path).size == (64, 32)
    assert MAX_IMAGE_PIXELS >= 8192 * 8192  # large photographs still load


def test_the_device_reader_refuses_a_jpeg_bomb_before_the_device_sees_it(tmp_path):
    pytest.importorskip("torch")
    from oodbench.extract.decode import read_for_device

    path = tmp_path / "bomb.jpg"
    path.write_bytes(jpeg(50_000, 50_000))
    with pytest.raises(UnreadableImage, match="decompression bomb"):
        read_for_device(path)


TRUNCATIONS = [0.0, 0.1, 0.5, 0.9, 0.99]


@pytest.mark.parametrize("keep", TRUNCATIONS)
@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_a_truncated_image_is_unreadable(tmp_path, kind, keep):
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    PIL.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, format=kind.upper())
    data = buffer.getvalue()
    path = tmp_path / f"cut.{kind}"
    path.write_bytes(data[: int(len(data) * keep)] if keep < 1 else data)
    with pytest.raises(UnreadableImage) as info:
        load_rgb(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "directory", "link-to-dev-zero", "link-loop"])
def test_an_image_that_is_not_a_regular_file_is_unreadable_at_once(tmp_path, kind):
    path = tmp_path / "x.jpg"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.symlink_to("x.jpg")
    outcome: list = []

    def read() -> None:
        try:
            load_rgb(path)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(60)  # a hang detector only
    if thread.is_alive():
        if kind == "fifo":
            with open(path, "wb"):
                pass
        pytest.fail(f"reading a {kind} blocked")
    assert isinstance(outcome[0], UnreadableImage), outcome


def test_a_file_that_changes_while_it_is_read_is_unreadable(tmp_path, monkeypatch):
    from oodbench.util import atomic

    path = tmp_path / "moving.png"
    path.write_bytes(png(8, 8))
    real_fstat, calls = os.fstat, []

    def fstat(fd):  # the second look (after the read) sees another modification time, as a writer would leave
        info = real_fstat(fd)
        calls.append(fd)
        if len(calls) == 2:
            values = list(info)
            return os.stat_result((*values[:8], info.st_mtime + 1, *values[9:]), {"st_mtime_ns": info.st_mtime_ns + 1})
        return info

    monkeypatch.setattr(atomic.os, "fstat", fstat)
    with pytest.raises(UnreadableImage, match="changed while it was read"):
        load_rgb(path)


def test_a_file_truncated_while_it_is_read_is_unreadable(tmp_path, monkeypatch):
    path = tmp_path / "shrinking.png"
    path.write_bytes(png(8, 8))
    original_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = original_fdopen(fd, mode, *args, **kwargs)
        os.truncate(path, 10)  # a writer truncates the file between our size check and our read
        return handle

    from oodbench.util import atomic

    monkeypatch.setattr(atomic.os, "fdopen", fdopen)
    with pytest.raises(UnreadableImage, match="changed while it was read"):
        load_rgb(path)


def test_a_folder_with_a_link_loop_is_walked_once(tmp_path):
    root = tmp_path / "images"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "one.png").write_bytes(png(4, 4))
    (root / "a" / "b" / "two.png").write_bytes(png(4, 4))
    (root / "a" / "b" / "up").symlink_to(root / "a")  # a loop: a/b/up/b/up/...
    (root / "a" / "self").symlink_to(".")
    (root / "loop.png").symlink_to("loop.png")  # a file link to itself: listed, then unreadable
    found = _walk_images(root)
    assert sorted(found) == ["a/b/two.png", "a/one.png", "loop.png"]
    with pytest.raises(UnreadableImage):
        load_rgb(root / "loop.png")
