"""Agreement with pytorch-ood 0.4 (the `bench` extra) and OpenOOD v1.5 on the same arrays, where they have the method.

pytorch-ood scores are outlier scores (higher = more OOD) and run in float32; each test states the convention that
relates them to ours and the bound that limits the agreement; docs/detectors.md's table gives the differences
measured on these arrays. OpenOOD's postprocessors expect a CUDA network; its relation, residual, GradNorm and SHE
code runs on the arrays through a stand-in network where OpenOOD's source is given
(OODBENCH_OPENOOD=<checkout>/openood/postprocessors), else skipped; so do its ASH network (`../networks/ash_net.py`) and fDBD.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from oodbench.core.metrics import auroc
from oodbench.core.outputs import Head, Outputs
from oodbench.detectors import create

from .test_peer_detectors import well_classified

pytorch_ood = pytest.importorskip("pytorch_ood", reason="pytorch-ood (pip install oodbench[bench]) is not installed")


@pytest.fixture(scope="module")
def arrays() -> tuple[Outputs, Head, Outputs]:
    return well_classified(seed=3, num_classes=6, dim=24, rows=600)


def _linear(head: Head) -> torch.nn.Linear:
    layer = torch.nn.Linear(head.num_features, head.num_classes)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.asarray(head.weight)))
        layer.bias.copy_(torch.from_numpy(np.asarray(head.bias)))
    return layer


def _relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.max(np.abs(ours - theirs)) / np.max(np.abs(ours)))


def test_tempscale_agrees_with_pytorch_ood(problem):
    from pytorch_ood.detector import TemperatureScaling

    fit, test = problem.fit, problem.test
    ours = create("tempscale").fit(fit)
    logits, labels = torch.from_numpy(fit.logits).double(), torch.from_numpy(fit.labels)
    theirs = TemperatureScaling(None).fit_logits(logits.float(), labels)
    their_t = float(theirs.t.detach())

    def nll(temperature: float) -> float:
        return float(torch.nn.functional.cross_entropy(logits / temperature, labels))

    # Their L-BFGS (lr 0.01, 50 iterations, no line search; OpenOOD's is the same from T = 1.5) stops far short of
    # the minimiser here: T = 1.26 against 4.66. Its NLL is higher than at our T, which the same optimiser reaches
    # when it may converge (float64, strong-Wolfe line search).
    assert nll(ours.temperature_) < nll(their_t)
    temperature = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
    optimiser = torch.optim.LBFGS(
        [temperature], max_iter=500, line_search_fn="strong_wolfe", tolerance_grad=1e-14, tolerance_change=1e-16
    )

    def closure():
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / temperature, labels)
        loss.backward()
        return loss

    optimiser.step(closure)
    # Both minimise the same convex NLL in float64; L-BFGS stops on its gradient tolerance, which leaves T within
    # ~1e-7 of the minimiser on this problem (docs/detectors.md: to 1e-6).
    assert float(temperature.detach()) == pytest.approx(ours.temperature_, rel=1e-6)
    # Given a temperature, the score is the same MSP (float32 softmax: 1e-6).
    reference = create("msp", temperature=their_t).fit(fit).score(test)
    np.testing.assert_allclose(
        -theirs.predict_logits(torch.from_numpy(test.logits)).detach().numpy(), reference, rtol=1e-6
    )


def test_entropy_agrees_with_pytorch_ood(arrays):
    from pytorch_ood.detector import Entropy

    _, _, test = arrays
    ours = create("entropy").fit(test).score(test)
    theirs = -Entropy(None).predict_logits(torch.from_numpy(test.logits)).numpy()
    # float32 softmax and log, and probabilities clipped at 1e-7: each clipped class moves the sum by < 1.7e-6.
    assert np.max(np.abs(ours - theirs)) < 1.7e-6 * test.num_classes


def test_gradnorm_agrees_with_pytorch_ood(arrays):
    from pytorch_ood.detector import GradNorm

    _, head, test = arrays
    ours = create("gradnorm").fit(test).score(test)
    detector = GradNorm(_linear(head), param_filter=lambda name: name == "weight")
    theirs = -detector.predict(torch.from_numpy(test.features)).numpy()
    # Their loss is the cross-entropy to the uniform distribution, the KL up to a constant: the same gradient. Float32
    # autograd over D·C terms: ~1e-6 relative.
    assert _relative(ours, theirs) < 1e-5


@pytest.mark.parametrize("variant,percentile", [("p", 65), ("b", 65)])
def test_ash_variants_agree_with_pytorch_ood(arrays, variant, percentile):
    from pytorch_ood.detector import ASH

    fit, head, test = arrays
    ours = create(f"ash_{variant}", percentile=percentile).fit(fit, head).score(test)
    layer = _linear(head)
    detector = ASH(
        backbone=lambda x: x, head=lambda x: layer(x.flatten(1)), variant=f"ash-{variant}", percentile=percentile / 100
    )
    with torch.no_grad():
        theirs = -detector.predict_feature_maps(torch.from_numpy(test.features)[:, :, None, None]).numpy()
    # Both float32 head products; no ties in continuous features, so the same entries are kept.
    assert _relative(ours, theirs) < 1e-6


def test_she_agrees_with_pytorch_ood(arrays):
    from pytorch_ood.detector import SHE

    fit, head, test = arrays
    ours = create("she").fit(fit, head).score(test)
    layer = _linear(head)
    detector = SHE(encoder=lambda x: x, head=layer)
    with torch.no_grad():
        detector.fit_features(torch.from_numpy(fit.features), torch.from_numpy(fit.labels))
        theirs = -detector.predict_features(torch.from_numpy(test.features)).numpy()
    # Their patterns and inner products in float32, ours in float64: ~1e-7 relative.
    assert _relative(ours, theirs) < 1e-6


def test_openmax_agrees_with_pytorch_ood(arrays):
    from pytorch_ood.detector import OpenMax

    fit, _, test = arrays
    ours = create("openmax", tail=25, alpha=10, euclidean=1.0, cosine=0.0).fit(fit).score(test)
    # pytorch-ood fits each class on all its rows, the paper on the correctly classified ones: give it those only.
    correct = fit.logits.argmax(axis=1) == fit.labels
    detector = OpenMax(None, tailsize=25, alpha=10, euclid_weight=1.0)
    detector.fit_logits(torch.from_numpy(fit.logits[correct]), torch.from_numpy(fit.labels[correct]))
    theirs = detector.predict_logits(torch.from_numpy(test.logits)).numpy()  # P(unknown)
    # Ours is log(1 - P(unknown)). Their Weibull fit (scipy exponweib, Nelder-Mead) stops ~1e-6 (relative) short of
    # the likelihood's root in the shape; with shapes ~1e4 that moves P(unknown) by a few 1e-3 of itself.
    assert np.max(np.abs(-np.expm1(ours) - theirs)) < 1e-3
    assert np.max(np.abs(-np.expm1(ours) / theirs - 1.0)) < 5e-3  # measured: 3.6e-4 absolute, 2.3e-3 relative
    assert abs(auroc(ours[:100], ours[100:]) - auroc(-theirs[:100], -theirs[100:])) < 1e-3  # 0.8741 and 0.8744


# ----------------------------------------------------------------------------------------------- OpenOOD
def _openood_module(name: str) -> types.ModuleType:
    root = os.environ.get("OODBENCH_OPENOOD")
    if not root or not (Path(root) / f"{name}.py").is_file():
        pytest.skip("OpenOOD's source is not given (OODBENCH_OPENOOD=<checkout>/openood/postprocessors)")
    package = types.ModuleType("openood_postprocessors")
    package.__path__ = [root]
    base = types.ModuleType("openood_postprocessors.base_postprocessor")
    base.BasePostprocessor = type("BasePostprocessor", (), {"__init__": lambda self, config: None})
    info = types.ModuleType("openood_postprocessors.info")
    info.num_classes_dict = {}  # read only by constructors, which the tests bypass
    sys.modules.update({package.__name__: package, base.__name__: base, info.__name__: info})
    spec = importlib.util.spec_from_file_location(f"openood_postprocessors.{name}", Path(root) / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_relation_agrees_with_openood(arrays):
    module = _openood_module("relation_postprocessor")
    fit, head, test = arrays
    ours = create("relation").fit(fit, head).score(test)
    bank = module.normalize(torch.from_numpy(fit.features.copy()))
    probs = torch.softmax(torch.from_numpy(fit.logits), dim=1)
    features = module.normalize(torch.from_numpy(test.features.copy()))
    theirs = module.get_relation(features, bank, torch.softmax(torch.from_numpy(test.logits), dim=1), probs).numpy()
    # Their kernel in float32: an edge within ~1e-6 of the 0.03 threshold may flip (none here); otherwise ~1e-6.
    assert _relative(ours, theirs) < 1e-5


def test_residual_agrees_with_openood(arrays):
    module = _openood_module("residual_postprocessor")
    fit, head, test = arrays
    ours = create("residual", dim=12).fit(fit, head).score(test)
    postprocessor = module.ResidualPostprocessor.__new__(module.ResidualPostprocessor)
    postprocessor.dim = 12

    class Net:
        def get_fc(self):
            return np.asarray(head.weight, dtype=np.float64), np.asarray(head.bias, dtype=np.float64)

        def eval(self):
            return self

        def __call__(self, data, return_feature=True):
            return None, data

    batch = {"data": torch.from_numpy(fit.features)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "cuda", lambda self: self)
        postprocessor.setup(Net(), {"val": [batch], "test": [{"data": torch.from_numpy(test.features)}]}, {})
    theirs = postprocessor.score_id
    # Same algebra in float64 (pinv, the second moment about u, eig); float32 features: ~1e-10 relative.
    assert _relative(ours, theirs) < 1e-8


class _FeatureNet:
    """What OpenOOD's postprocessors call on a network, for cached arrays: the head, and (logits, features) of a batch."""

    def __init__(self, head: Head) -> None:
        self.layer = _linear(head)

    def get_fc(self):
        return np.asarray(self.layer.weight.detach()), np.asarray(self.layer.bias.detach())

    def eval(self):
        return self

    def __call__(self, data, return_feature=True):
        return self.layer(data), data


def test_gradnorm_agrees_with_openood(arrays):
    module = _openood_module("gradnorm_postprocessor")
    _, head, test = arrays
    ours = create("gradnorm").fit(test).score(test)
    postprocessor = module.GradNormPostprocessor.__new__(module.GradNormPostprocessor)
    postprocessor.num_classes = head.num_classes
    weight, bias = _FeatureNet(head).get_fc()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "cuda", lambda self: self)
        patch.setattr(torch.nn.Module, "cuda", lambda self: self)
        theirs = postprocessor.gradnorm(torch.from_numpy(test.features), weight, bias)
    # OpenOOD (as the official code) sums the cross-entropy over the C classes: C times the KL gradient, in float32.
    assert _relative(ours, theirs / head.num_classes) < 1e-5


def test_she_agrees_with_openood(arrays):
    module = _openood_module("she_postprocessor")
    fit, head, test = arrays
    ours = create("she").fit(fit, head).score(test)
    postprocessor = module.SHEPostprocessor.__new__(module.SHEPostprocessor)
    postprocessor.num_classes, postprocessor.setup_flag = head.num_classes, False
    postprocessor.args = types.SimpleNamespace(metric="inner_product")
    net = _FeatureNet(head)
    batch = {"data": torch.from_numpy(fit.features), "label": torch.from_numpy(fit.labels)}
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(torch.Tensor, "cuda", lambda self: self)
        postprocessor.setup(net, {"train": [batch]}, {})
        _, theirs = postprocessor.postprocess(net, torch.from_numpy(test.features))
    # Their patterns and products in float32.
    assert _relative(ours, theirs.numpy()) < 1e-6


def _openood_file(relative: str, name: str) -> types.ModuleType:
    """A module of OpenOOD's source outside the postprocessors (e.g. ``../networks/ash_net.py``), or skip."""
    root = os.environ.get("OODBENCH_OPENOOD")
    path = Path(root or ".") / relative
    if not root or not path.is_file():
        pytest.skip(
            f"OpenOOD's source is not given (OODBENCH_OPENOOD=<checkout>/openood/postprocessors, with {relative})"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openoods_ash_is_ash_b_at_percentile_90(arrays):
    """OpenOOD's `ash` postprocessor (configs/postprocessors/ash.yml: percentile 90) scores the energy of
    `ASHNet.forward_threshold`, which applies `ash_b`: oodbench's `ash_b` with percentile=90, not `ash_s`."""
    module = _openood_file("../networks/ash_net.py", "openood_ash_net")
    fit, head, test = arrays
    ours = create("ash_b", percentile=90).fit(fit, head).score(test)
    layer = _linear(head)
    with torch.no_grad():
        features = torch.from_numpy(test.features.copy())
        shaped = module.ash_b(features.view(len(features), -1, 1, 1), 90).view(len(features), -1)
        theirs = torch.logsumexp(layer(shaped), dim=1).numpy()
    # Their head product and energy in float32: ~1e-7 relative.
    assert _relative(ours, theirs) < 1e-5
    ash_s = create("ash_s", percentile=90).fit(fit, head).score(test)
    assert _relative(ash_s, theirs) > 1e-2  # ASH-S is another score


def test_openoods_fdbd_is_c_minus_1_times_ours(arrays):
    """OpenOOD's fDBD sums |f_ŷ − f_c| / ‖w_ŷ − w_c‖ over all c (the c = ŷ term is 0): (C − 1) × oodbench's mean
    over c ≠ ŷ, with distance_as_normalizer=True (its fdbd.yml default) dividing by ‖z − mean_fit(z)‖."""
    module = _openood_module("fdbd_postprocessor")
    fit, head, test = arrays
    ours = create("fdbd").fit(fit, head).score(test)
    postprocessor = module.fDBDPostprocessor.__new__(module.fDBDPostprocessor)
    postprocessor.setup_flag, postprocessor.distance_as_normalizer = False, True
    net = _FeatureNet(head)
    net.fc = net.layer
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(torch.Tensor, "cuda", lambda self: self)
        postprocessor.setup(net, {"train": [{"data": torch.from_numpy(fit.features)}]}, {})
        _, theirs = postprocessor.postprocess(net, torch.from_numpy(test.features))
    # Their logits and norms in float32 (the denominators in float64): ~1e-7 relative.
    assert _relative(ours, theirs.numpy() / (head.num_classes - 1)) < 1e-5
