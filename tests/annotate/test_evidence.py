"""Evidence sources: VLM top-k, confusions, reverse-search links, example images, VLM import."""

from __future__ import annotations

from collections import Counter
from urllib.parse import unquote

import numpy as np
import pytest

from oodbench.annotate.evidence import (
    confusion_evidence,
    example_images,
    reverse_search_evidence,
    top_confusions,
    vlm_topk,
)
from oodbench.core.errors import AnnotateError

from .helpers import CLASSES, build_project, write_png


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_vlm_topk_matches_brute_force_across_chunks():
    rng = np.random.default_rng(0)
    images, texts = unit(rng.normal(size=(103, 16))), unit(rng.normal(size=(40, 16)))
    top, sims = vlm_topk(images, texts, k=5, chunk=10)
    full = images @ texts.T
    expected = np.argsort(-full, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(top, expected)
    # vlm_topk re-normalises and multiplies in float32 (D = 16): cosines within (D + 2)·eps32 ≈ 2e-6 of the float64
    # ones, relative for the top-5 cosines of 40 labels (none near 0); rtol 1e-5 is 5 times that.
    np.testing.assert_allclose(sims, np.take_along_axis(full, expected, axis=1), rtol=1e-5)
    # Unnormalised input gives the same ranking (cosine), and an .npy path works like an array.
    top2, sims2 = vlm_topk(images * 7.0, texts * 0.1, k=5)
    np.testing.assert_array_equal(top2, top)
    np.testing.assert_allclose(sims2, sims, rtol=1e-5)  # both float32 paths: the same 2e-6 bound each, as above


def test_vlm_topk_reads_npy(tmp_path):
    rng = np.random.default_rng(1)
    images, texts = unit(rng.normal(size=(7, 4))).astype(np.float32), unit(rng.normal(size=(5, 4)))
    np.save(tmp_path / "img.npy", images)
    np.save(tmp_path / "txt.npy", texts)
    top, _ = vlm_topk(tmp_path / "img.npy", tmp_path / "txt.npy", k=2)
    np.testing.assert_array_equal(top, vlm_topk(images, texts, k=2)[0])


@pytest.mark.parametrize(
    "images, texts, k, message",
    [
        (np.ones((3, 4)), np.ones((5, 3)), 2, "dims"),
        (np.ones((3, 4)), np.ones((5, 4)), 6, "k must be between"),
        (np.ones(4), np.ones((5, 4)), 2, "2-D"),
        (np.array([[np.nan, 1.0]]), np.ones((2, 2)), 1, "NaN"),
        (np.zeros((1, 2)), np.ones((2, 2)), 1, "all-zero"),
    ],
)
def test_vlm_topk_rejects_bad_input(images, texts, k, message):
    with pytest.raises(AnnotateError, match=message):
        vlm_topk(images, texts, k=k)


def test_top_confusions_against_counter():
    rng = np.random.default_rng(2)
    pairs = rng.integers(0, 6, size=(500, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    result = top_confusions(pairs, [0, 3, 9], k=3)
    for label in (0, 3):
        counts = Counter(int(b) for a, b in pairs if a == label)
        expected = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        assert result[label] == expected
    assert result[9] == []
    assert top_confusions(np.zeros((0, 2)), [1]) == {1: []}


def test_confusion_and_reverse_search_evidence_show_absence():
    assert "absent" in confusion_evidence(None, {}, CLASSES, "real")
    assert "no re-annotation" in confusion_evidence(2, {}, CLASSES, "real")["absent"]
    assert "never re-assigned" in confusion_evidence(2, {2: []}, CLASSES, "real")["absent"]
    ev = confusion_evidence(2, {2: [(5, 9)]}, CLASSES, "real")
    assert ev["classes"] == [{"class": 5, "name": "class-5", "count": 9}]
    assert "no public URL" in reverse_search_evidence(None)["absent"]
    url = "https://example.org/val/img 1.jpg?x=1&y=2"
    links = reverse_search_evidence(url)["links"]
    assert {link["name"] for link in links} == {"Google Lens", "Bing", "TinEye", "Yandex"}
    for link in links:
        assert link["href"].startswith("https://") and url in unquote(link["href"])
        assert "&y=2" not in link["href"]  # the image URL is encoded, not spliced in
    with pytest.raises(AnnotateError, match="http"):
        reverse_search_evidence("file:///etc/passwd")


def test_example_images_by_folder_id_and_sorted_folders(tmp_path):
    for c in (0, 2):
        for j in range(4):
            write_png(tmp_path / f"c{c:02d}" / f"e{j}.png", j)
    (tmp_path / "c00" / "notes.txt").write_text("not an image")
    found = example_images(tmp_path, CLASSES, per_class=2)
    assert found == {0: ["c00/e0.png", "c00/e1.png"], 2: ["c02/e0.png", "c02/e1.png"]}
    assert example_images(tmp_path, CLASSES, per_class=1, wanted=[2]) == {2: ["c02/e0.png"]}
    from oodbench.text.classes import ClassList

    with pytest.raises(AnnotateError, match="2 class folders but the class list has 3"):
        example_images(tmp_path, ClassList(("a", "b", "c")))


def test_vlm_evidence_is_stored_per_image(tmp_path):
    project = build_project(tmp_path, n_images=3)
    rng = np.random.default_rng(3)
    texts = unit(rng.normal(size=(len(CLASSES), 8)))
    images = unit(rng.normal(size=(5, 8)))
    keys = ["other.png", "img002.png", "sub0/img000.png", "img001.png", "unrelated.png"]
    from oodbench.annotate.project import add_vlm_evidence

    assert add_vlm_evidence(project, keys, images, texts, k=3, model="toy") == 3
    expected_top, _ = vlm_topk(images, texts, k=3)
    by_key = {img.key: img for img in project.store().images()}
    for key, row in (("img000.png", 2), ("img001.png", 3), ("img002.png", 1)):
        vlm = by_key[key].evidence["vlm"]
        assert [c["class"] for c in vlm["classes"]] == expected_top[row].tolist() and vlm["model"] == "toy"
        assert "absent" not in by_key[key].evidence["original"]
    with pytest.raises(AnnotateError, match="3 keys for 5 embedding rows"):
        add_vlm_evidence(project, keys[:3], images, texts)
    with pytest.raises(AnnotateError, match="class-name embeddings for 10 classes"):
        add_vlm_evidence(project, keys, images, texts[:4])
    project.close()
