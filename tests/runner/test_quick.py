"""`oodbench.evaluate_model` and `oodbench evaluate-model`: one call from a model and image data to results.

A tiny random timm model (test_resnet, pretrained=False) runs on real images: scikit-learn's digits (upsampled,
three classes) as the ID data and scikit-image's photographs as the OOD set. The cache is proven by
instrumentation: on the second call the model's forward raises if it is ever called.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import oodbench
import oodbench as ob
from oodbench.cli.main import main
from oodbench.core import metrics as ob_metrics
from oodbench.core.errors import ExtractError, OodbenchError
from oodbench.core.store import Store
from oodbench.evaluation import evaluate_store
from oodbench.extract.backbones.timm_backbone import TimmBackbone, load_timm
from oodbench.runner.quick import ModuleBackbone

from .. import reference

DETECTORS = ["msp", "energy", "maha"]
SIZE = 32


def _digits(root, per_class: int, offset: int) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    for label in range(3):
        folder = root / str(label)
        folder.mkdir(parents=True)
        images = digits.images[digits.target == label][offset : offset + per_class]
        for i, image in enumerate(images):
            pixels = (image / 16 * 255).astype(np.uint8)
            Image.fromarray(pixels).resize((SIZE, SIZE), Image.NEAREST).convert("RGB").save(folder / f"{i}.png")


def _photos(root) -> None:
    from skimage import data

    root.mkdir(parents=True)
    for name in ("astronaut", "coffee", "chelsea", "rocket", "camera", "moon", "coins", "page"):
        image = Image.fromarray(getattr(data, name)()).convert("RGB")
        for k, box in enumerate([(0, 0, 0.5, 0.5), (0.5, 0.5, 1, 1)]):
            w, h = image.size
            crop = image.crop((int(box[0] * w), int(box[1] * h), int(box[2] * w), int(box[3] * h)))
            crop.resize((SIZE, SIZE)).save(root / f"{name}-{k}.png")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    _digits(root / "train", 12, 0)
    _digits(root / "val", 6, 12)
    _photos(root / "photos")
    return root


def _call(folders, store, **kwargs):
    return oodbench.evaluate_model(
        "test_resnet",
        pretrained=False,
        image_size=SIZE,
        fit=folders / "train",
        id=folders / "val",
        ood={"photos": folders / "photos"},
        store=store,
        detectors=DETECTORS,
        batch_size=16,
        progress=False,
        **kwargs,
    )


def _assert_run_scores_are_definitions(tmp_path, detectors=("msp", "energy")) -> None:
    """A CLI run's saved MSP/energy scores are those of the store's logits, and its AUROC theirs (not plumbing only)."""
    run = tmp_path / "run"
    info = json.loads((run / "run.json").read_text())
    store, reported = Store(tmp_path / "store"), reference.run_results(run)
    for name in detectors:
        saved = {ds: reference.run_scores(run, ds)[name] for ds in ("id", "photos")}
        for ds, scores in saved.items():
            logits = store.read(info["model"], ds).logits
            definition = getattr(reference, name)
            np.testing.assert_allclose(scores, definition(logits), rtol=reference.SCORE_RTOL)
        expected = reference.auroc(saved["id"], saved["photos"])
        assert reported[(name, "photos", "auroc")] == pytest.approx(expected, abs=reference.AUROC_ABS)


def test_first_call_extracts_second_call_is_cached(folders, tmp_path, monkeypatch):
    first = _call(folders, tmp_path / "store")
    assert first.extracted == {"fit": 36, "id": 18, "photos": 16}
    assert first.store == tmp_path / "store"
    auroc = {(r.detector, r.ood_dataset): r.value for r in first.rows if r.metric == "auroc"}
    assert set(auroc) == {(d, "photos") for d in DETECTORS}
    # MSP recomputed from the store's logits: the scores and the AUROC reported are the definition's.
    store = Store(tmp_path / "store")
    for ds in ("id", "photos"):
        expected = reference.msp(store.read(first.model_id, ds).logits)
        np.testing.assert_allclose(first.scores[ds]["msp"], expected, rtol=reference.SCORE_RTOL)
    expected_auroc = reference.auroc(first.scores["id"]["msp"], first.scores["photos"]["msp"])
    assert auroc[("msp", "photos")] == pytest.approx(expected_auroc, abs=reference.AUROC_ABS)

    def forbidden(*args, **kwargs):
        raise AssertionError("the second call ran the model")

    monkeypatch.setattr(TimmBackbone, "infer", forbidden)
    second = _call(folders, tmp_path / "store")
    assert second.extracted == {"fit": 0, "id": 0, "photos": 0}
    assert [(r.detector, r.metric, r.value) for r in second.rows] == [
        (r.detector, r.metric, r.value) for r in first.rows
    ]


def test_temporary_store_and_module_on_torch_datasets(folders, tmp_path):
    """Any nn.Module with forward -> (features, logits), on a TensorDataset and a DataLoader; the temp store is gone."""
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 16), torch.nn.ReLU())
    head = torch.nn.Linear(16, 3)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.fc = body, head

        def forward(self, x):
            features = self.body(x)
            return features, self.fc(features)

    generator = torch.Generator().manual_seed(1)
    fit = torch.utils.data.TensorDataset(torch.randn(40, 3, 8, 8, generator=generator), torch.arange(40) % 3)
    test = torch.utils.data.TensorDataset(torch.randn(20, 3, 8, 8, generator=generator), torch.arange(20) % 3)
    ood = torch.utils.data.TensorDataset(3 + torch.randn(15, 3, 8, 8, generator=generator))
    net = Net()
    result = oodbench.evaluate_model(
        net,
        head=net.fc,
        fit=fit,
        id=torch.utils.data.DataLoader(test, batch_size=7),
        ood={"shifted": ood},
        detectors=DETECTORS,
        device="cpu",  # the reference below is float32 on the CPU (no mixed precision)
        progress=False,
    )
    assert result.store is None and result.extracted == {"fit": 40, "id": 20, "shifted": 15}
    # Independent reference: MSP from the module's own logits on the ID and OOD tensors.
    with torch.no_grad():
        msp_id = torch.softmax(net(test.tensors[0])[1], 1).max(1).values.numpy()
        msp_ood = torch.softmax(net(ood.tensors[0])[1], 1).max(1).values.numpy()
    # torch's float32 softmax over C = 3 classes (exp, sum, divide) vs float64 from the same float32 logits:
    # ≤ (C + 3)·eps32 ≈ 7e-7 relative on MSP values in [1/3, 1].
    np.testing.assert_allclose(result.scores["id"]["msp"], msp_id, rtol=2e-6)
    np.testing.assert_allclose(result.scores["shifted"]["msp"], msp_ood, rtol=2e-6)
    expected = np.mean(msp_id[:, None] > msp_ood[None, :]) + 0.5 * np.mean(msp_id[:, None] == msp_ood[None, :])
    auroc = next(r.value for r in result.rows if r.detector == "msp" and r.metric == "auroc")
    assert auroc == pytest.approx(expected, abs=1e-12)


def test_module_without_a_feature_source_is_one_clear_error(tmp_path):
    backbone = ModuleBackbone(torch.nn.Linear(4, 2), forward=None, transform=lambda x: x)
    with pytest.raises(ExtractError, match="not \\(features, logits\\)"):
        backbone.infer(torch.zeros(2, 4))


def test_cli_evaluate_model(folders, tmp_path, capsys):
    args = _cli_args(folders, tmp_path, "-d", ",".join(DETECTORS))
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "photos" in out and "msp" in out
    # The CLI's table is the library's evaluation of the entries it extracted, number for number.
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    direct = evaluate_store(tmp_path / "store", info["model"], "fit", "id", ["photos"], DETECTORS, progress=False)
    expected = {(r.detector, r.ood_dataset, r.metric): r.value for r in direct.rows}
    np.testing.assert_equal(reference.run_results(tmp_path / "run"), expected)
    _assert_run_scores_are_definitions(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--ood", "photos"])  # a second --ood without NAME=DIR
    assert exit_info.value.code == 2
    assert "NAME=DIR" in capsys.readouterr().err


def test_missing_folder_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["evaluate-model", "test_resnet", "--no-pretrained", "--fit", str(tmp_path / "nope"), "--id", str(tmp_path)]
            + ["--ood", f"x={tmp_path}", "--no-progress"]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope" in err and len(err.strip().splitlines()) == 1


def test_unknown_detector_fails_before_any_extraction(folders, tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran before the detectors were checked")

    monkeypatch.setattr(TimmBackbone, "infer", forbidden)
    with pytest.raises(OodbenchError, match="unknown detector 'mps'"):
        oodbench.evaluate_model(
            "test_resnet",
            pretrained=False,
            fit=folders / "train",
            id=folders / "val",
            ood={"photos": folders / "photos"},
            store=tmp_path / "store",
            detectors=["mps"],
            progress=False,
        )
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


def test_cli_suggests_the_detector_meant(folders, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "evaluate-model",
                "test_resnet",
                "--no-pretrained",
                "--fit",
                str(folders / "train"),
                "--id",
                str(folders / "val"),
                "--ood",
                f"photos={folders / 'photos'}",
                "-d",
                "mps",
                "--no-progress",
            ]
        )
    assert exit_info.value.code == 2
    assert "did you mean 'msp'" in capsys.readouterr().err


def _cli_args(folders, tmp_path, *extra):
    args = [
        "evaluate-model",
        "test_resnet",
        "--no-pretrained",
        "--image-size",
        str(SIZE),
        "--fit",
        str(folders / "train"),
    ]
    args += ["--id", str(folders / "val"), "--ood", f"photos={folders / 'photos'}", "--store", str(tmp_path / "store")]
    return [*args, "--out", str(tmp_path / "run"), "--no-progress", *extra]


def test_defaults_on_a_small_fit_set_fail_before_any_extraction_naming_every_parameter(
    folders, tmp_path, monkeypatch, capsys
):
    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran before the parameters were checked")

    monkeypatch.setattr(TimmBackbone, "infer", forbidden)
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    # 36 fit images (3 classes of 12 digits); test_resnet's features are D = 64 wide.
    assert err.startswith("error: the fit set (36 rows, 3 classes) is too small for: ")
    for problem in (
        "knn: k=1000 exceeds the fit set's 36 rows",
        "neco: dim=100",
        "nnguide: the bank holds 0 rows",
        "she: the fit set has rows of 3 classes but the model's head has 1000",
    ):
        assert problem in err
    assert "--small-fit-set adapt" in err
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


# Per-class patterns of every head class (she, openmax) cannot be built from 3 of 1000 classes, and the network
# detectors need arrays that only `extract --net` makes: neither can run on this study, whatever its size.
NOT_ON_THIS_STUDY = {"she", "openmax", "odin", "rankfeat", "gram", "mds_ensemble"}


def test_small_fit_set_adapt_runs_every_detector_and_records_its_choices(folders, tmp_path, capsys):
    chosen = [name for name in oodbench.detectors.available() if name not in NOT_ON_THIS_STUDY]
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "--small-fit-set", "adapt", "--workers", "0", "-d", ",".join(chosen)))
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    assert "adapted to the small fit set: knn.k 1000 -> 1" in captured.err
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["adapted_parameters"]["knn"] == {"k": {"from": 1000, "to": 1}}
    assert info["adapted_parameters"]["nnguide"] == {"alpha": {"from": 0.01, "to": 1.0}, "k": {"from": 100, "to": 1}}
    # Resolved parameters (defaults filled in), the adapted value among them.
    assert info["detectors"]["knn"] == {**ob.detectors.create("knn").get_params(), "k": 1}
    assert info["failed_detectors"] == {}
    ran = {
        row.split("|")[1].strip() for row in captured.out.splitlines() if row.startswith("| ") and "detector" not in row
    }
    assert ran == set(chosen)
    _assert_run_scores_are_definitions(tmp_path)


def test_adapt_leaves_out_the_per_class_detectors_the_fit_set_cannot_support(folders, tmp_path, capsys):
    """she and openmax need rows of every head class: adapt leaves them out with one line each (and in run.json)
    and runs the others; without adapt the same run fails before any image is read, naming them."""
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "--small-fit-set", "adapt", "-d", "knn,she,openmax"))
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    for name in ("she", "openmax"):
        reason = "the fit set has rows of 3 classes but the model's head has 1000"
        assert (
            reason in info["skipped_detectors"][name]
            and "left out by --small-fit-set adapt" in info["skipped_detectors"][name]
        )
        assert f"skipped {name}: left out by --small-fit-set adapt" in captured.err
        assert name not in info["detectors"]
    assert info["adapted_parameters"]["knn"]["k"]["to"] < 1000 and "| knn" in captured.out
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path / "again", "-d", "knn,she,openmax"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "she: the fit set has rows of 3 classes" in err


def test_a_run_where_no_detector_can_run_exits_2_before_extraction(folders, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(TimmBackbone, "infer", lambda *a, **k: pytest.fail("the model ran"))
    args = _cli_args(folders, tmp_path, "-d", "maha,rmaha")
    args[args.index(str(folders / "train"))] = str(folders / "photos")  # a fit set without class folders
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "no detector could be evaluated: maha skipped: fit set lacks labels; rmaha skipped: fit set lacks" in err


def test_num_workers_is_the_hidden_old_name_of_workers(folders, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "-d", "msp", "--num-workers", "0"))
    assert exit_info.value.code == 0
    assert "--num-workers is now --workers" in capsys.readouterr().err
    _assert_run_scores_are_definitions(tmp_path, ["msp"])  # the run under the old name is a real run
    from typer.testing import CliRunner

    from oodbench.cli.main import app

    help_text = CliRunner().invoke(app, ["evaluate-model", "--help"]).output
    assert "--workers" in help_text and "--num-workers" not in help_text


def test_top1_is_not_computed_for_folder_labels_that_do_not_index_the_head(folders, tmp_path, capsys):
    """Three digit folders (labels 0-2) and test_resnet's 1000-class head: no Top-1, and the reason is given."""
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "-d", "msp"))
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert "Top-1 on id (original labels): not computed: its labels number its 3 class folders (0-2)" in out
    (row,) = json.loads((tmp_path / "run" / "accuracy.json").read_text())["rows"]
    assert row["top1"] is None and "1000 classes of the model's head" in row["reason"]
    _assert_run_scores_are_definitions(tmp_path, ["msp"])  # the OOD results beside the refused Top-1 are real


def test_without_out_top1_is_printed_and_returned_and_evaluate_options_apply(folders, tmp_path, capsys):
    """Top-1 needs no run directory; --convention, --aupr and a -d selection are `evaluate`'s, on the quick path."""
    args = _cli_args(folders, tmp_path, "-d", "msp,energy,maha,-maha", "--convention", "openood", "--aupr")
    at = args.index("--out")
    del args[at : at + 2]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "Top-1 on id (original labels)" in out and "AUPR" in out and "openood" in out
    assert "| maha" not in out and "| energy" in out
    result = _call(folders, tmp_path / "store", convention="openood")
    assert result.run_dir is None and [row.labels for row in result.accuracy][:1] == ["original"]
    openood = {r.detector: r.value for r in result.rows if r.metric == "openood.fpr95"}
    id_scores, ood_scores = result.scores["id"], result.scores["photos"]
    for name in DETECTORS:
        assert openood[name] == ob_metrics.fpr_at_tpr_ood_positive(id_scores[name], ood_scores[name])


def test_the_checks_against_wrong_features_are_printed_before_extraction(folders, tmp_path, capsys):
    """As `oodbench extract`: the preprocessing, and with a checkpoint the top-1 class names of the first ID images."""
    model = load_timm("test_resnet", pretrained=False, image_size=SIZE)
    checkpoint = tmp_path / "weights.pth"
    torch.save(model.model.state_dict(), checkpoint)
    args = _cli_args(folders, tmp_path, "-d", "msp", "--checkpoint", str(checkpoint))
    args[args.index("--no-pretrained")] = "--pretrained"
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 0, err
    assert "preprocessing of test_resnet: " in err and "probe: top-1 of the first" in err
    lines = err.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("preprocessing of"))
    assert lines[first + 1].startswith("probe: top-1 of the first 16 images: ")


def _named_args(folders, tmp_path, fit, id_set, *extra):
    args = ["evaluate-model", "test_resnet", "--no-pretrained", "--image-size", str(SIZE), "--fit", fit, "--id", id_set]
    return [*args, "--ood", f"photos={folders / 'photos'}", "--store", str(tmp_path / "store"), "--no-progress", *extra]


def test_named_sets_are_cached_by_name_and_content(folders, tmp_path, capsys):
    """--id NAME=DIR and --fit NAME=DIR: a second ID folder under another name extracts only itself; the same folder
    under its name is reused; other files under a stored name are refused in one line naming a free name."""
    other = tmp_path / "val-b"
    _digits(other, 6, 18)  # the same file names as val (0/0.png …), other digits: only the content tells them apart
    fit = f"train={folders / 'train'}"

    def run(*args):
        with pytest.raises(SystemExit) as exit_info:
            main(_named_args(folders, tmp_path, *args, "-d", "msp,energy"))
        captured = capsys.readouterr()
        return exit_info.value.code, captured.out, captured.err

    code, out, err = run(fit, f"imnet={folders / 'val'}")
    assert code == 0, err
    assert "extracted 70 images" in out  # 36 fit + 18 ID + 16 OOD
    code, out, err = run(fit, f"imnet-b={other}")
    assert code == 0, err
    assert "extracted 18 images" in out  # only the new ID set: the fit and OOD sets are the store's
    store = Store(tmp_path / "store")
    (model,) = store.models()
    assert set(store.datasets(model)) == {"train", "imnet", "imnet-b", "photos"}
    code, out, err = run(fit, f"imnet={folders / 'val'}")
    assert code == 0 and "extracted nothing: every set was in the store" in out
    for args, option in (((fit, f"imnet={other}"), "--id"), ((f"train={other}", f"imnet={folders / 'val'}"), "--fit")):
        code, out, err = run(*args)
        lines = [line for line in err.splitlines() if not line.startswith("preprocessing of")]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
        name = "imnet" if option == "--id" else "train"
        assert f"other images under the name {name!r}" in lines[0]
        assert f"e.g. {option} {name}-2=DIR" in lines[0]
    # A bare folder keeps its default name; the results name the sets as given.
    code, out, err = run(str(folders / "train"), f"imnet={folders / 'val'}")
    assert code == 0 and "extracted 36 images" in out and "Top-1 on imnet" in out
    assert "fit" in Store(tmp_path / "store").datasets(model)
    result = oodbench.evaluate_model(
        "test_resnet",
        pretrained=False,
        image_size=SIZE,
        fit={"train": folders / "train"},
        id={"imnet-b": other},
        ood={"photos": folders / "photos"},
        store=tmp_path / "store",
        detectors=["msp"],
        progress=False,
    )
    assert result.extracted == {"train": 0, "imnet-b": 0, "photos": 0}
    assert set(result.scores) == {"imnet-b", "photos"}


def test_csid_folders_are_extracted_scored_and_counted_as_id_as_evaluate_does(folders, tmp_path, capsys):
    """--csid NAME=DIR: the folder is extracted under its name, scored, and joined to the ID side of a full-spectrum
    table beside the standard one; the run is `oodbench evaluate --csid`'s on the same entries, file for file."""
    shifted = tmp_path / "shifted"
    _digits(shifted, 4, 18)
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "-d", "msp,energy", "--csid", f"shifted={shifted}"))
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    assert "extracted 82 images" in captured.out  # 36 fit + 18 ID + 12 covariate-shifted + 16 OOD
    assert "Full-spectrum" in captured.out and "(shifted) count as ID" in captured.out
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["csid_datasets"] == ["shifted"] and info["ood_datasets"] == ["photos"]
    store = Store(tmp_path / "store")
    logits = store.read(info["model"], "shifted").logits
    assert logits.shape[0] == 12
    saved = reference.run_scores(tmp_path / "run", "shifted")
    for name in ("msp", "energy"):
        np.testing.assert_allclose(saved[name], getattr(reference, name)(logits), rtol=reference.SCORE_RTOL)
    args = ["evaluate", "--store", str(tmp_path / "store"), "--model", info["model"], "--fit", "fit", "--id", "id"]
    args += ["--ood", "photos", "--csid", "shifted", "-d", "msp,energy", "--out", str(tmp_path / "again")]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--no-progress"])
    assert exit_info.value.code == 0
    for name in ("table.md", "results.parquet", "scores/test_resnet/shifted.npz"):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    for bad, message in (("shifted", "expected NAME=DIR"), (f"photos={shifted}", "also given to --ood")):
        with pytest.raises(SystemExit) as exit_info:
            main(_cli_args(folders, tmp_path, "-d", "msp", "--csid", bad))
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_net_extracts_the_network_time_detectors_arrays(folders, tmp_path, capsys):
    """--net METHOD (as `oodbench extract --net`): the arrays are extracted with the features under the model id
    plus their settings, and the detectors that read them run; their scores are the definitions' of those arrays."""
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "-d", "msp,odin,mds_ensemble", "--net", "odin:epsilon=0.002", "--net", "mds"))
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    assert "skipped" not in captured.err and "| odin " in captured.out and "| mds_ensemble " in captured.out
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["model"].startswith("test_resnet+net-odin.mds-")
    store = Store(tmp_path / "store")
    meta = store.meta(info["model"], "photos")
    assert [spec["method"] for spec in meta["provenance"]["network"]] == ["odin", "mds"]
    assert meta["provenance"]["network"][0]["epsilon"] == 0.002
    for dataset in ("id", "photos"):
        outputs = store.read(info["model"], dataset)
        assert {"odin", "mds.layer1", "mds.layer2", "mds.layer3", "mds.layer4"} <= set(outputs.extras)
        # ODIN's score is the largest softmax probability of the stored tempered logits f(x̃)/T.
        expected = reference.msp(outputs.extras["odin"])
        np.testing.assert_allclose(reference.run_scores(tmp_path / "run", dataset)["odin"], expected, rtol=1e-12)
    # The same store keeps the entries without --net under the plain model id, beside these.
    plain = _cli_args(folders, tmp_path, "-d", "msp")
    plain[plain.index("--out") + 1] = str(tmp_path / "plain")
    with pytest.raises(SystemExit) as exit_info:
        main(plain)
    err = capsys.readouterr().err
    assert exit_info.value.code == 0, err
    assert set(Store(tmp_path / "store").models()) == {"test_resnet", info["model"]}
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path / "bad", "-d", "msp", "--net", "odin:epsilon=-1"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and "--net: odin epsilon must be" in err
    with pytest.raises(OodbenchError, match="net: the network-time detectors' arrays are extracted from a timm"):
        oodbench.evaluate_model(
            torch.nn.Linear(4, 2), forward=lambda m, x: (x, m(x)), fit=[], id=[], ood={"x": []}, net=["odin"]
        )


def test_skipped_network_time_detectors_are_one_line_saying_how_to_extract_their_arrays(folders, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(_cli_args(folders, tmp_path, "-d", "msp,odin,rankfeat,gram,mds_ensemble"))
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    skipped = [line for line in captured.err.splitlines() if line.startswith("skipped")]
    assert skipped == [
        "skipped 4 network-time detectors (odin, rankfeat, gram, mds_ensemble): their arrays are not extracted; "
        "add --net odin --net rankfeat --net gram --net mds to extract them"
    ]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["skipped_detectors"]["gram"] == "its arrays are not extracted (--net gram)"


def test_plugin_detectors_and_saved_detectors_on_the_quick_path(folders, tmp_path, capsys, request):
    """--plugin registers a file's detector for this run; --save-detectors keeps each fit, reloadable by `score`."""
    import sys

    from oodbench.detectors import registry

    from .test_plugins import PLUGIN

    saved_registry, modules = registry._snapshot(), set(sys.modules)
    request.addfinalizer(lambda: registry._restore(saved_registry))  # the plugin stays out of later tests
    request.addfinalizer(lambda: [sys.modules.pop(m) for m in set(sys.modules) - modules])
    plugin = tmp_path / "quick_norm_plugin.py"
    plugin.write_text(PLUGIN.format(suffix="").replace('"neg_norm"', '"quick_neg_norm"'))
    saved = tmp_path / "saved"
    args = _cli_args(folders, tmp_path, "-d", "msp,quick_neg_norm", "--plugin", str(plugin))
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--save-detectors", str(saved)])
    assert exit_info.value.code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "quick_neg_norm" in out and "msp" in out
    assert sorted(p.name for p in saved.iterdir()) == ["msp", "quick_neg_norm"]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    with pytest.raises(SystemExit) as exit_info:  # the saved fit scores the stored ID set as the run did
        main(
            [
                "score",
                "--detector",
                str(saved / "msp"),
                "--store",
                str(tmp_path / "store"),
                "--model",
                info["model"],
                "--dataset",
                "id",
                "--out",
                str(tmp_path / "rescored"),
            ]
        )
    assert exit_info.value.code == 0, capsys.readouterr().err
    run_scores = reference.run_scores(tmp_path / "run", "id")
    np.testing.assert_array_equal(np.load(tmp_path / "rescored" / "id.npy"), run_scores["msp"])
    assert np.isfinite(run_scores["quick_neg_norm"]).all()
