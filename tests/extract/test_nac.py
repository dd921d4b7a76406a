"""NAC neuron states against a per-image computation written from the definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oodbench.core.errors import ExtractError
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.nac import NacLayer, kl_to_uniform, pool_units


def _reference_states(model, image, layer, alpha, pool):
    """One image at a time: o = layer output, g = d KL(u || softmax(z)) / d o, state = sigmoid(α Σo Σg)."""
    store = {}
    module = dict(model.named_modules())[layer]
    handle = module.register_forward_hook(lambda _m, _i, out: store.__setitem__("o", out))
    try:
        logits = model(image[None])
    finally:
        handle.remove()
    probs = torch.softmax(logits[0].double(), dim=0)
    uniform = torch.full_like(probs, 1.0 / probs.numel())
    kl = (uniform * (uniform.log() - probs.log())).sum()
    (grad,) = torch.autograd.grad(kl, store["o"])
    o, g = store["o"][0].detach().double(), grad[0].double()
    if pool == "spatial":
        o, g = o.sum(dim=(1, 2)), g.sum(dim=(1, 2))
    elif pool == "tokens":
        o, g = o.sum(dim=0), g.sum(dim=0)
    elif pool == "first":
        o, g = o[0], g[0]
    return torch.sigmoid(alpha * o * g).numpy()


@pytest.mark.parametrize(
    "model_name,layer,alpha,pool,spec",
    [
        ("test_resnet", "layer3", 50.0, "spatial", "layer3:50"),
        ("test_resnet", "global_pool", 3000.0, "none", "global_pool:3000"),
        ("test_vit", "blocks.5.norm2", 10.0, "tokens", "blocks.5.norm2:10"),
        ("test_vit", "norm", 100.0, "first", "norm:100:first"),
    ],
)
def test_states_match_the_per_image_definition(model_name, layer, alpha, pool, spec):
    backbone = load_timm(
        model_name,
        pretrained=False,
        nac_layers=[NacLayer.parse(spec)],
        image_size=48 if model_name == "test_resnet" else None,
    )
    torch.manual_seed(0)
    pixels = torch.randn(3, *backbone.input_size())
    arrays = backbone.infer(pixels)
    states = arrays[f"extra.nac.{layer}"]
    assert states.dtype == np.float32 and states.shape[0] == 3
    reference = np.stack([_reference_states(backbone.model, pixels[i], layer, alpha, pool) for i in range(3)])
    # Batched float32 forward/backward vs one image at a time (float64 only after): o·g agree to ~1e-6 relative. The
    # sigmoid's slope is ≤ 1/4, and α·o·g ≲ 40 where a state is not saturated: ≤ 1e-5 absolute; a saturated state
    # s ≈ e^(−α·o·g) errs relatively by the absolute error of α·o·g, ≤ 1e-4 for α·o·g ≲ 100.
    np.testing.assert_allclose(states, reference, rtol=1e-4, atol=1e-5)
    # The states are not trivially saturated, so the comparison is informative.
    assert 0.05 < float(np.mean((states > 0.01) & (states < 0.99)))
    # Logits and features are unchanged by the gradient pass.
    plain = load_timm(model_name, pretrained=False, image_size=48 if model_name == "test_resnet" else None)
    # With autograd on, the forward may take other float32 kernels: a few layers of float32 sums of ≤ 100 terms each
    # on O(1) activations, ≲ 100·eps32 ≈ 1e-5 of the logits.
    np.testing.assert_allclose(plain.infer(pixels)["logits"], arrays["logits"], rtol=1e-5, atol=1e-5)


def test_kl_to_uniform_closed_form():
    logits = torch.zeros(2, 4)
    assert float(kl_to_uniform(logits)) == pytest.approx(0.0, abs=1e-7)
    one_hot_ish = torch.tensor([[10.0, 0.0]])
    p = torch.softmax(one_hot_ish, dim=1)[0]
    expected = 0.5 * (math.log(0.5 / float(p[0])) + math.log(0.5 / float(p[1])))
    # float32 softmax and logs of 2 classes vs float64 on the same float32 p: a few eps32 ≈ 3e-7 relative.
    assert float(kl_to_uniform(one_hot_ish)) == pytest.approx(expected, rel=1e-6)


def test_pooling_and_spec_errors():
    x = torch.arange(24.0).reshape(2, 3, 2, 2)
    assert pool_units(x, "auto").tolist() == x.sum(dim=(2, 3)).tolist()
    assert pool_units(x.permute(0, 2, 3, 1), "nhwc").tolist() == x.sum(dim=(2, 3)).tolist()
    with pytest.raises(ExtractError, match="needs"):
        pool_units(x, "first")
    assert NacLayer.parse("blocks.1.mlp:0.5:tokens") == NacLayer("blocks.1.mlp", 0.5, "tokens")
    for bad in ["layer:abc", "layer:-1", "layer:1:mean", ":1", "a:1:sum:x"]:
        with pytest.raises(ExtractError):
            NacLayer.parse(bad)


def test_unknown_layer_is_named():
    backbone = load_timm("test_resnet", pretrained=False, nac_layers=[NacLayer("layer9")], image_size=32)
    with pytest.raises(ExtractError, match="no module 'layer9'"):
        backbone.infer(torch.randn(1, 3, 32, 32))


def test_extracted_states_feed_the_nac_detector(tmp_path):
    from oodbench import Store, detectors
    from oodbench.extract.datasets import image_folder
    from oodbench.extract.pipeline import extract

    from .helpers import write_images

    store = Store(tmp_path / "store")
    backbone = load_timm("test_resnet", pretrained=False, image_size=32, nac_layers=["layer3:50"])
    extract(
        store,
        backbone,
        image_folder(write_images(tmp_path / "fit", {"a": 6, "b": 6})),
        dataset_id="fit",
        num_workers=0,
        progress=False,
    )
    extract(
        store,
        backbone,
        image_folder(write_images(tmp_path / "ood", {"x": 4}, seed=9)),
        dataset_id="ood",
        num_workers=0,
        progress=False,
    )
    fit = store.read("test_resnet", "fit")
    assert fit.extras["nac.layer3"].shape == (12, 192)
    detector = detectors.create("nac", layers=["layer3"]).fit(fit, store.read_head("test_resnet"))
    scores = detector.score(store.read("test_resnet", "ood"))
    assert scores.shape == (4,) and np.isfinite(scores).all()
