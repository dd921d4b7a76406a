"""End to end with a tiny random open_clip model: extract, build and import vocabularies, evaluate, tabulate (CLI)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

os.environ["HF_HUB_OFFLINE"] = "1"
open_clip = pytest.importorskip("open_clip")

from oodbench.core.store import Store  # noqa: E402
from oodbench.text.templates import SEED_TEMPLATES  # noqa: E402
from oodbench.zeroshot import scores as S  # noqa: E402
from oodbench.zeroshot.cli import register  # noqa: E402

TINY = "oodbench-zs-tiny-clip"
CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / f"{TINY}.json"
    path.write_text(json.dumps(CONFIG))
    open_clip.add_model_config(path)
    from oodbench.extract.openclip import load_openclip

    return load_openclip(TINY, None, "cpu", seed=0)


def _images(root, classes, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name, (low, high) in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(low, high, size=(40, 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_clip):
    from oodbench.extract.datasets import image_folder
    from oodbench.extract.openclip import OpenClipBackbone
    from oodbench.extract.pipeline import extract

    root = tmp_path_factory.mktemp("zs")
    store = Store(root / "store")
    backbone = OpenClipBackbone(tiny_clip, patches=True)
    for dataset_id, classes, seed in (
        ("id-test", {"red": (150, 255), "blue": (0, 100)}, 0),
        ("ood-textures", {"striped": (0, 255), "dotted": (60, 200)}, 1),
    ):
        folder = _images(root / dataset_id, classes, seed)
        extract(
            store,
            backbone,
            image_folder(folder),
            dataset_id=dataset_id,
            model_id="tiny",
            num_workers=0,
            device="cpu",
            amp=False,
            progress=False,
            batch_size=8,
        )
    (root / "classes.txt").write_text("red\nblue\n")
    from oodbench.zeroshot.vocab.lexicon import Lexicon, Synset

    Lexicon(
        [
            Synset("n", i + 1, "noun.artifact", (w,))
            for i, w in enumerate(["hammer", "violin", "desert", "glacier", "teapot", "red", "crimson"])
        ]
        + [Synset("a", 20, "adj.all", ("furry",)), Synset("a", 21, "adj.all", ("icy",))]
    ).write(root / "lex.tsv.gz")
    (root / "siblings.json").write_text(json.dumps({"red": ["scarlet", "maroon", "blue"], "blue": ["navy", "teal"]}))
    return root


def _run(app, *args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.stdout


def test_vocabularies_evaluation_and_table_from_the_cli(workspace, tiny_clip):
    from oodbench.extract.label_embedder import embedder_for
    from oodbench.zeroshot.cli import use_text_embedder

    app = typer.Typer()
    register(app)
    use_text_embedder(embedder_for)  # what the main CLI wires in
    store, vocab = workspace / "store", workspace / "vocab"
    common = ["--vocab-dir", vocab, "--classes", workspace / "classes.txt"]

    out = _run(
        app,
        "zeroshot",
        "vocab",
        "build",
        "wordnet",
        "--store",
        store,
        "--model",
        "tiny",
        "--m",
        "4",
        "--lexicon",
        workspace / "lex.tsv.gz",
        "--name",
        "wn",
        *common,
    )
    assert "wn@v1: 4 labels, kind wordnet" in out
    _run(
        app,
        "zeroshot",
        "vocab",
        "import",
        workspace / "siblings.json",
        "--name",
        "llm",
        "--kind",
        "siblings",
        "--k",
        "2",
        *common,
    )
    _run(
        app,
        "zeroshot",
        "vocab",
        "build",
        "union",
        "--wordnet",
        "wn",
        "--siblings",
        "llm",
        "--name",
        "wn+llm",
        "--vocab-dir",
        vocab,
    )
    out = _run(
        app,
        "zeroshot",
        "vocab",
        "build",
        "oracle",
        "--store",
        store,
        "--model",
        "tiny",
        "--dataset",
        "ood-textures",
        "--name",
        "oracle",
        *common,
    )
    assert "non-deployable" in out
    listing = _run(app, "zeroshot", "vocab", "list", "--vocab-dir", vocab)
    assert {line.split()[0] for line in listing.splitlines()} == {"llm@v1", "oracle@v1", "wn@v1", "wn+llm@v1"}
    shown = _run(app, "zeroshot", "vocab", "show", "llm", "--vocab-dir", vocab)
    assert "navy" in shown and "blue" not in shown.split("labels:")[1]  # an ID name never becomes a negative

    text_before = {d for d in Store(store).datasets("tiny") if d.startswith("text-")}
    assert len(text_before) == 3  # mining prompts: ID names, nouns, adjectives
    runs = workspace / "runs"
    evaluate = ["zeroshot", "evaluate", "--store", store, "--model", "tiny", "--id", "id-test", "--ood", "ood-textures"]
    evaluate += ["--vocab", "all", "--sweep-k", "1", "--sweep-m", "2", "-p", "neglabel.groups=2"]
    evaluate += ["--out", runs, "--no-progress", *common]
    table = _run(app, *evaluate)
    header, _, row = table.splitlines()[:3]
    assert header.startswith("| model | best logit-space | EOE | WN | LLM siblings | WN+LLM | oracle† |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "tiny" and cells[2] == "–"  # no EOE list was built
    assert all(re.fullmatch(r"\*{0,2}\d+\.\d\*{0,2}", c) for c in cells[3:])
    assert sum(c.startswith("**") for c in cells) == 1

    run = runs / "tiny"
    info = json.loads((run / "run.json").read_text())
    detectors = info["zeroshot"]["detectors"]
    assert {
        "glmcm",
        "neglabel@wn",
        "neglabel@wn[m=2]",
        "neglabel@llm[k=1]",
        "neglabel@wn+llm",
        "neglabel@oracle",
    } <= set(detectors)
    assert info["zeroshot"]["vocabularies"]["wn"]["provenance"]["model"] == "tiny"
    assert len(info["zeroshot"]["vocabularies"]["wn"]["hash"]) == 64

    # Independent path: the model's own text embeddings and the score function on the stored image embeddings.
    from oodbench.core.scores import load_scores
    from oodbench.extract.openclip import text_embeddings

    image = Store(store).read("tiny", "ood-textures")
    id_text = text_embeddings(tiny_clip, ["red", "blue"], SEED_TEMPLATES)
    oracle_labels = json.loads(next((vocab / "oracle").glob("v001-*.json")).read_text())["labels"]
    expected = S.neglabel_scores(
        image.features, id_text, text_embeddings(tiny_clip, oracle_labels, SEED_TEMPLATES), groups=2
    )
    # Text embeddings recomputed by the same float32 tower (≤ a few eps32 ≈ 5e-7 apart on unit vectors) and scaled
    # by NegLabel's 1/τ = 100 before its softmax: ≤ ~1e-4 on a logit would be the worst case, 1e-5 relative holds
    # because the run batches the labels as this call does (equal embeddings; float64 scoring, eps64 differences).
    np.testing.assert_allclose(load_scores(run, "tiny", "ood-textures")["neglabel@oracle"], expected, rtol=1e-5)

    # A second run answers from the run directory and the store's text cache.
    text_after = {d for d in Store(store).datasets("tiny") if d.startswith("text-")}
    again = _run(app, *evaluate)
    assert again.splitlines()[:3] == table.splitlines()[:3]
    assert {d for d in Store(store).datasets("tiny") if d.startswith("text-")} == text_after

    printed = _run(app, "zeroshot", "table", runs, "--sweeps", "--metric", "auroc")
    assert "AUROC (%)" in printed and "by siblings per class k" in printed and "by WordNet prefix size M" in printed


def test_missing_text_embeddings_without_a_model_fail_clearly(workspace, tmp_path):
    from oodbench.core.errors import ExtractError
    from oodbench.extract.label_embedder import store_embedder

    embed = store_embedder(Store(workspace / "store"), "tiny")
    with pytest.raises(ExtractError, match="no cached text embeddings"):
        embed(["never embedded"], SEED_TEMPLATES)
