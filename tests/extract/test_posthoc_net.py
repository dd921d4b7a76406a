"""Network-time detector arrays (ODIN, RankFeat, GRAM, Mahalanobis ensemble) against per-image float64 references.

The references are written from the papers' definitions, one image at a time: the ODIN gradient of −log S_ŷ by
autograd on the single image, the rank-1 removal by numpy's SVD of the (C × HW) / (tokens × D) matrix, the full
(channels × channels) Gram matrices by explicit products, the pooled maps by numpy means. The network runs in
float64 on both sides, so the tolerances are float64 rounding: a few hundred operations deep, relative
error ≲ 1e-13; 1e-9 leaves four orders of margin and still fails on any wrong formula (those differ at 1e-2).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oodbench.core.errors import ExtractError
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.posthoc_net import NetSpec, gram_rows, network_arrays, odin_logits, remove_rank1

from .helpers import single_torch_thread

RTOL = 1e-9

MODELS = {
    # name: (image size, last-stage layer, layers for gram / mds)
    "test_resnet": (48, "layer4", ("layer2", "layer4")),
    "test_vit": (None, "blocks.5", ("blocks.1", "blocks.5")),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def network(request):
    """(name, float64 eval-mode model, float64 pixels, preprocessing std) of a tiny random timm network."""
    name = request.param
    size = MODELS[name][0]
    with single_torch_thread():
        backbone = load_timm(name, pretrained=False, image_size=size)
        torch.manual_seed(0)
        pixels = torch.randn(3, *backbone.input_size(), dtype=torch.float64)
        yield name, backbone.model.double().eval(), pixels, backbone.preprocessing["std"]


def _layer_output(model, image, layer, replace=None):
    """(logits, layer output) of one image; `replace` maps the layer output (numpy) to the one the pass continues with."""
    seen = {}
    module = dict(model.named_modules())[layer]

    def hook(_m, _i, out):
        seen["out"] = out.detach().clone()
        if replace is not None:
            return torch.from_numpy(replace(out[0].detach().numpy()))[None]
        return None

    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = model(image[None])[0]
    finally:
        handle.remove()
    return logits.numpy(), seen["out"][0].numpy()


def _as_channels(output: np.ndarray) -> np.ndarray:
    """(channels, positions) of one image's layer output: (C, H, W) maps or (tokens, D) transformer blocks."""
    return output.reshape(output.shape[0], -1) if output.ndim == 3 else output.T


# ----------------------------------------------------------------------------------------------- ODIN
def _odin_reference(model, image, temperature, epsilon, std):
    x = image.clone().requires_grad_(True)
    logits = model(x[None])[0] / temperature
    predicted = int(torch.argmax(logits))
    log_prob = logits[predicted] - torch.log(torch.exp(logits).sum())
    (gradient,) = torch.autograd.grad(-log_prob, x)
    perturbed = image.clone()
    for channel in range(image.shape[0]):
        perturbed[channel] -= epsilon * torch.sign(gradient[channel]) / std[channel]
    with torch.no_grad():
        return (model(perturbed[None])[0] / temperature).numpy(), gradient


@pytest.mark.parametrize("temperature,epsilon", [(1000.0, 0.0014), (1.0, 0.05)])
def test_odin_matches_the_per_image_definition(network, temperature, epsilon):
    _name, model, pixels, std = network
    with single_torch_thread():
        batch = odin_logits(model, pixels, temperature, epsilon, std).numpy()
        references = [_odin_reference(model, pixels[i], temperature, epsilon, std) for i in range(len(pixels))]
    reference = np.stack([r[0] for r in references])
    # A sign taken of a gradient within rounding of zero would differ between batch and image: none is that small.
    assert min(float(r[1].abs().min()) for r in references) > 0 or epsilon == 0
    scale = np.abs(reference).max()
    np.testing.assert_allclose(batch, reference, rtol=RTOL, atol=RTOL * scale)
    # The perturbation moves the logits (the comparison is informative), and ε = 0 is temperature scaling alone.
    with torch.no_grad():
        plain = model(pixels).numpy() / temperature
    assert np.abs(batch - plain).max() > 1e-6 * scale
    np.testing.assert_allclose(odin_logits(model, pixels, temperature, 0.0, std).numpy(), plain, rtol=RTOL)


def test_odin_raises_the_predicted_class_probability(network):
    # The step descends the cross-entropy of ŷ: for a small ε its tempered softmax probability goes up.
    _name, model, pixels, std = network
    with torch.no_grad():
        before = torch.softmax(model(pixels), dim=1)
    after = torch.softmax(odin_logits(model, pixels, 1.0, 1e-4, std), dim=1)
    predicted = before.argmax(dim=1)
    rows = torch.arange(len(pixels))
    assert bool((after[rows, predicted] > before[rows, predicted]).all())


# ----------------------------------------------------------------------------------------------- RankFeat
def _rank1_removed(matrix_like: np.ndarray) -> np.ndarray:
    matrix = matrix_like.reshape(matrix_like.shape[0], -1)
    u, s, vt = np.linalg.svd(matrix, full_matrices=False)
    return (matrix - s[0] * np.outer(u[:, 0], vt[0])).reshape(matrix_like.shape)


def test_rankfeat_matches_the_per_image_definition(network):
    name, model, pixels, _std = network
    layer = MODELS[name][1]
    with single_torch_thread():
        arrays = network_arrays(model, pixels, [NetSpec.of("rankfeat", layers=(layer,))])
        reference = np.stack([_layer_output(model, pixels[i], layer, _rank1_removed)[0] for i in range(len(pixels))])
        plain = np.stack([_layer_output(model, pixels[i], layer)[0] for i in range(len(pixels))])
    stored = arrays[f"extra.rankfeat.{layer}"]
    assert stored.dtype == np.float32 and stored.shape == reference.shape
    # Stored as float32: relative rounding 2^-24 of each logit on top of the float64 computation.
    np.testing.assert_allclose(stored, reference, rtol=1e-6, atol=1e-6 * np.abs(reference).max())
    assert np.abs(reference - plain).max() > 1e-3 * np.abs(plain).max()  # the removal changes the logits


def test_remove_rank1_leaves_the_other_singular_values():
    rng = np.random.default_rng(0)
    maps = torch.from_numpy(rng.normal(size=(2, 5, 3, 4)))
    removed = remove_rank1(maps)
    for i in range(2):
        before = np.linalg.svd(maps[i].reshape(5, 12).numpy(), compute_uv=False)
        after = np.linalg.svd(removed[i].reshape(5, 12).numpy(), compute_uv=False)
        np.testing.assert_allclose(after[:-1], before[1:], rtol=1e-12)
        assert after[-1] < 1e-12 * before[0]


# ----------------------------------------------------------------------------------------------- GRAM, MDS
def _gram_reference(output: np.ndarray, powers: int) -> np.ndarray:
    fmap = _as_channels(output)
    values = []
    for p in range(1, powers + 1):
        fp = fmap**p
        row_sums = (fp @ fp.T).sum(axis=1)  # the full channels × channels Gram matrix, then its row sums
        values.append(np.sign(row_sums) * np.abs(row_sums) ** (1.0 / p))
    return np.concatenate(values)


def test_gram_and_pooled_maps_match_the_per_image_definition(network):
    name, model, pixels, _std = network
    layers = MODELS[name][2]
    specs = [NetSpec.of("gram", layers=layers, powers=4), NetSpec.of("mds", layers=layers)]
    with single_torch_thread():
        arrays = network_arrays(model, pixels, specs)
        outputs = {layer: [_layer_output(model, pixels[i], layer)[1] for i in range(len(pixels))] for layer in layers}
    for layer in layers:
        gram = np.stack([_gram_reference(out, 4) for out in outputs[layer]])
        pooled = np.stack([_as_channels(out).mean(axis=1) for out in outputs[layer]])
        for key, reference in ((f"extra.gram.{layer}", gram), (f"extra.mds.{layer}", pooled)):
            assert arrays[key].dtype == np.float32 and arrays[key].shape == reference.shape
            # float32 storage of float64 values: relative rounding 2^-24 per value.
            np.testing.assert_allclose(arrays[key], reference, rtol=1e-6, atol=1e-6 * np.abs(reference).max())
        # In float64, before storage, gram_rows equals the explicit Gram matrices to float64 rounding.
        out = torch.from_numpy(np.stack(outputs[layer]))
        np.testing.assert_allclose(gram_rows(out, 4).numpy(), gram, rtol=RTOL, atol=RTOL * np.abs(gram).max())


# ----------------------------------------------------------------------------------------------- the backbone
def test_backbone_stores_the_arrays_and_records_the_settings():
    specs = ["odin:epsilon=0", "rankfeat", "gram:layers=layer3+layer4,powers=3", "mds:layers=layer3"]
    with single_torch_thread():
        backbone = load_timm("test_resnet", pretrained=False, image_size=48, network=specs)
        torch.manual_seed(1)
        pixels = torch.randn(2, *backbone.input_size())
        arrays = backbone.infer(pixels)
        plain = load_timm("test_resnet", pretrained=False, image_size=48).infer(pixels)
    assert set(arrays) == {
        "features",
        "logits",
        "extra.odin",
        "extra.rankfeat.layer4",
        "extra.gram.layer3",
        "extra.gram.layer4",
        "extra.mds.layer3",
    }
    # The extra passes leave features and logits as they are; with ε = 0 ODIN stores logits / T.
    np.testing.assert_array_equal(arrays["logits"], plain["logits"])
    # ODIN's pass reruns the float32 forward (autograd on: other kernels, ≲ 1e-5 relative as the logits in
    # test_nac) and divides by T in float32; atol 1e-9 covers logits / T within 1e-5·|logit|/T of 0.
    np.testing.assert_allclose(arrays["extra.odin"], plain["logits"] / 1000.0, rtol=1e-5, atol=1e-9)
    network = backbone.provenance()["network"]
    assert network[0] == {
        "method": "odin",
        "temperature": 1000.0,
        "epsilon": 0.0,
        "perturbation": "epsilon * sign(gradient) / preprocessing std, per channel",
    }
    assert network[2] == {"method": "gram", "layers": ["layer3", "layer4"], "powers": 3}


@pytest.mark.parametrize(
    "spec,message",
    [
        ("sobel", "unknown network detector 'sobel'"),
        ("odin:temperature=0", "temperature must be a positive number"),
        ("odin:epsilon=-1", "epsilon must be a number >= 0"),
        ("odin:eps=0.1", "odin has no parameter 'eps'"),
        ("odin:epsilon", "bad network detector spec"),
        ("gram:powers=x", "is not a number"),
        ("gram:powers=0", "powers must be an integer in"),
        ("mds:layers=a+a", "distinct non-empty layer names"),
    ],
)
def test_bad_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(ExtractError, match=message):
        NetSpec.parse(spec)


def test_unknown_layer_and_duplicate_settings_are_refused():
    with pytest.raises(ExtractError, match="model has no module 'layer9'"):
        backbone = load_timm("test_resnet", pretrained=False, image_size=48, network=["rankfeat:layers=layer9"])
        backbone.infer(torch.randn(1, *backbone.input_size()))
    with pytest.raises(ExtractError, match="two network detector settings store extra.odin"):
        load_timm("test_resnet", pretrained=False, image_size=48, network=["odin", "odin:epsilon=0.01"])


# ----------------------------------------------------------------------------------------------- end to end
def test_extract_then_evaluate_from_the_command_line(tmp_path):
    """`oodbench extract --net …` on image folders, then `oodbench evaluate` with the four detectors."""
    import json

    from typer.testing import CliRunner

    from oodbench import Store
    from oodbench.cli.main import app
    from oodbench.core.results import read_rows
    from oodbench.evaluation import evaluate_store

    from .. import reference
    from .helpers import write_images

    folders = {
        "fit": write_images(tmp_path / "fit", {"a": 8, "b": 8, "c": 8}, seed=1),
        "val": write_images(tmp_path / "val", {"a": 3, "b": 3, "c": 3}, seed=2),
        "ood": write_images(tmp_path / "ood", {"x": 9}, size=(40, 12), seed=3),
    }
    store_dir = tmp_path / "store"
    nets = ["odin", "rankfeat", "gram:layers=layer3+layer4,powers=3", "mds:layers=layer3+layer4"]
    runner = CliRunner()
    for name, folder in folders.items():
        args = ["extract", "--model", "test_resnet", "--no-pretrained", "--image-size", "32", "--num-classes", "3"]
        args += ["--store", str(store_dir), "--data", str(folder), "--dataset-id", name, "--workers", "0"]
        args += ["--no-progress"] + [part for spec in nets for part in ("--net", spec)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    store = Store(store_dir)
    entry = store.read("test_resnet", "val")
    assert set(entry.extras) == {"odin", "rankfeat.layer4", "gram.layer3", "gram.layer4", "mds.layer3", "mds.layer4"}
    network = store.meta("test_resnet", "val")["provenance"]["network"]
    assert [item["method"] for item in network] == ["odin", "rankfeat", "gram", "mds"]
    assert network[0]["temperature"] == 1000.0 and network[0]["epsilon"] == 0.0014
    layers = json.dumps(["layer3", "layer4"])
    args = ["evaluate", "--store", str(store_dir), "--model", "test_resnet", "--fit", "fit", "--id", "val"]
    args += ["--ood", "ood", "-d", "odin,rankfeat,gram,mds_ensemble", "--out", str(tmp_path / "run"), "--strict"]
    args += ["-p", f"gram.layers={layers}", "-p", f"mds_ensemble.layers={layers}", "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = read_rows(tmp_path / "run" / "results.parquet")
    assert {r.detector for r in rows} == {"odin", "rankfeat", "gram", "mds_ensemble"}
    # The CLI's rows are the library's evaluation of the same entries and parameters, number for number.
    plan = {"odin": {}, "rankfeat": {}, "gram": {"layers": ["layer3", "layer4"]}}
    plan["mds_ensemble"] = {"layers": ["layer3", "layer4"]}
    direct = evaluate_store(store, "test_resnet", "fit", "val", ["ood"], plan, strict=True, progress=False)
    expected = {(r.detector, r.ood_dataset, r.metric): r.value for r in direct.rows}
    np.testing.assert_equal({(r.detector, r.ood_dataset, r.metric): r.value for r in rows}, expected)
    # ODIN's score is the max softmax of the stored tempered logits of the perturbed images; its AUROC theirs.
    odin = {ds: reference.run_scores(tmp_path / "run", ds)["odin"] for ds in ("val", "ood")}
    for ds, scores in odin.items():
        extras = store.read("test_resnet", ds).extras
        np.testing.assert_allclose(scores, reference.msp(extras["odin"]), rtol=reference.SCORE_RTOL)
    auroc = next(r.value for r in rows if r.detector == "odin" and r.metric == "auroc")
    assert auroc == pytest.approx(reference.auroc(odin["val"], odin["ood"]), abs=reference.AUROC_ABS)
    # A spec error is one line and exit status 2, before anything is written.
    bad = runner.invoke(
        app,
        ["extract", "--model", "test_resnet", "--no-pretrained", "--store", str(tmp_path / "s2")]
        + ["--data", str(folders["val"]), "--net", "odin:eps=1"],
    )
    assert bad.exit_code == 2 and "odin has no parameter 'eps'" in bad.output
    assert not (tmp_path / "s2").exists()


def test_a_layer_the_forward_pass_never_calls_is_refused():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = torch.nn.Conv2d(3, 4, 3)
            self.unused = torch.nn.Conv2d(3, 4, 3)
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.used(x).mean(dim=(2, 3)))

    pixels = torch.randn(2, 3, 6, 6)
    for spec in ("rankfeat:layers=unused", "gram:layers=unused", "mds:layers=used+unused"):
        with pytest.raises(ExtractError, match="'unused' is not called in the forward pass"):
            network_arrays(Net().eval(), pixels, [NetSpec.parse(spec)])
