"""Detectors that need the network at test time: ODIN, RankFeat, GRAM and the Mahalanobis ensemble.

Their per-image arrays are computed during extraction (`oodbench.extract.posthoc_net`: ``oodbench extract
--net …``, or ``network = [...]`` in an experiment's model table) and stored as extras; these classes fit and
score those arrays. A hyper-parameter that changes the forward pass (ODIN's T and ε, RankFeat's layer, GRAM's
orders, the layers) belongs to the extraction, so sweeping it re-extracts; what is left here is fitted from the
stored arrays.

When no set has any of a detector's arrays, its one reason for being skipped is `NOT_EXTRACTED` with the ``--net``
setting that extracts them (`net_setting` reads it back), so that front ends can say it once for all of them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import ClassVar

import numpy as np

from ..core.errors import DetectorError
from ..core.numerics import logsumexp_in_place
from ..core.outputs import Head, Outputs
from ._gaussian import ClassGaussians, ScatterAccumulator, class_gaussians_state, pinv_sqrt, triangular_whitener
from ._streaming import fit_chunks, gather_rows, sample_rows
from .base import Detector, Paper, Requirements, Summary, _array_names, _FitInfo
from .logit import max_softmax
from .registry import register
from .state import Array, Keyed, Spec

__all__ = ["NOT_EXTRACTED", "ODIN", "RankFeat", "Gram", "MahalanobisEnsemble", "gram_deviation", "net_setting"]

_STAGES = ("layer1", "layer2", "layer3", "layer4")  # the four stages of a (timm / torchvision) ResNet
# The most layers an ensemble declares state for: each layer's whitener ranks are free dimensions of their own.
_MAX_LAYERS = 16


def _extra_width(detector: Detector, fit: _FitInfo, name: str) -> int:
    """Values per row of the extra `name` recorded at fit (its shape without the row axis)."""
    shape = fit.extras.get(name)
    if shape is None:
        raise DetectorError(f"{detector.name}: the fit recorded no extra {name}")
    return int(np.prod(shape))


def _check_layers(detector: Detector, layers: object) -> None:
    if isinstance(layers, str) or not isinstance(layers, Sequence) or not layers:
        raise DetectorError(f"{detector.name}: layers must be a non-empty sequence of layer names; got {layers!r}")
    if len(set(layers)) != len(layers) or not all(isinstance(name, str) and name for name in layers):
        raise DetectorError(f"{detector.name}: layers must be distinct non-empty names; got {layers!r}")


def _rows(array: np.ndarray, rows: slice | np.ndarray) -> np.ndarray:
    """Rows (a slice, or sorted indices into a memory map) as a float64 block."""
    return np.asarray(array[rows], dtype=np.float64) if isinstance(rows, slice) else gather_rows(array, rows)


# The skip reason of a network-time detector none of whose arrays any set has: this, then "(--net SETTING)".
NOT_EXTRACTED = "its arrays are not extracted"
_NOT_EXTRACTED = re.compile(re.escape(NOT_EXTRACTED) + r" \(--net ([^\s()]+)\)")


def net_setting(reason: str) -> str | None:
    """The ``--net`` setting a skipped detector's reason asks for, when arrays not extracted are all its reason."""
    match = _NOT_EXTRACTED.fullmatch(reason)
    return match.group(1) if match else None


class _NetworkTime(Detector):
    """A detector over arrays the network computes at extraction (``--net METHOD``, METHOD its `net_method`)."""

    net_method: ClassVar[str]

    def net_setting(self) -> str:
        """The ``--net`` value that extracts this instance's arrays: ``gram``, or ``gram:layers=layer3+layer4``."""
        layers = getattr(self, "layers", None)
        if layers is None or tuple(layers) == tuple(self.default_params()["layers"]):
            return self.net_method
        return f"{self.net_method}:layers={'+'.join(layers)}"

    def unmet(
        self,
        fit: Outputs | Collection[str],
        tests: Mapping[str, Outputs | Collection[str]] | None = None,
        *,
        has_head: bool,
    ) -> list[str]:
        """As `Detector.unmet`, but when no set has any of the arrays, one reason (`NOT_EXTRACTED`) says so and
        names the setting that extracts them, instead of every array of every set."""
        reasons = super().unmet(fit, tests, has_head=has_head)
        requires = self.requirements()
        extras = {name for name in requires.fit | requires.score if name.startswith("extra.")}
        sets = [fit, *(tests or {}).values()]
        if not reasons or any(extras & _array_names(arrays) for arrays in sets):
            return reasons  # some are extracted: which set lacks which array is the useful reason
        with_extras = {name: _array_names(arrays) | extras for name, arrays in (tests or {}).items()}
        others = super().unmet(_array_names(fit) | extras, with_extras, has_head=has_head)
        return [f"{NOT_EXTRACTED} (--net {self.net_setting()})", *others]


@register("odin")
class ODIN(_NetworkTime):
    """ODIN: maximum softmax probability of the tempered logits f(x̃)/T of the perturbed input (stored as extra.odin)."""

    net_method = "odin"

    requires = Requirements.of(score=("extra.odin",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Liang, Li & Srikant, Enhancing The Reliability of Out-of-distribution Image Detection in Neural Networks",
        "ICLR 2018",
        "https://arxiv.org/abs/1706.02690",
        "T = 1000 and ε = 0.0014 (the reference code's DenseNet/CIFAR-10 setting; OpenOOD's and pytorch-ood's "
        "defaults), set at extraction (--net odin[:temperature=T,epsilon=E]): x̃ = x − ε · "
        "sign(∇ₓ CE(f(x)/T, ŷ)) / σ, the signed gradient divided by the preprocessing std per channel as the "
        "reference code does (ε in [0, 1] pixel units); extra.odin stores f(x̃)/T",
    )
    summary = Summary(
        "max_c softmax_c(f(x̃)/T), x̃ = x − ε·sign(∇ₓ CE(f(x)/T, ŷ))/σ",
        defaults="T=1000, ε=0.0014 (paper; OpenOOD), set at extraction",
        needs="f(x̃)/T, from `--net odin`",
        also_in="pytorch-ood, OpenOOD",
        agreement="2.6e-8 absolute (pytorch-ood `ODIN`, same network and images)",
    )

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        tempered = chunk.extras["odin"]
        if tempered.ndim != 2:
            raise DetectorError(f"odin: extra.odin must be (N, classes) tempered logits; got shape {tempered.shape}")
        return max_softmax(tempered, 1.0)  # the stored logits are already divided by T


@register("rankfeat")
class RankFeat(_NetworkTime):
    """RankFeat: energy of the logits after removing the rank-1 component of a layer's feature map (extras)."""

    net_method = "rankfeat"

    requires = Requirements.of(score=("extra.rankfeat.layer4",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Song, Sebe & Wang, RankFeat: Rank-1 Feature Removal for Out-of-distribution Detection",
        "NeurIPS 2022",
        "https://arxiv.org/abs/2209.08590",
        "layer4 (Block 4, the paper's main setting), removal by exact SVD (torch.linalg.svd, not the paper's "
        "power-iteration speed-up), energy at temperature 1; with several layers the logits are averaged before "
        "the energy (the reference's Block 3 + Block 4 fusion); the layer is set at extraction (--net rankfeat)",
    )
    summary = Summary(
        "T·logsumexp(f′/T), f′ the logits after removing s₁u₁v₁ᵀ from a layer's feature map",
        defaults="layer4: the paper's Block 4; exact SVD",
        needs="from `--net rankfeat`",
        also_in="pytorch-ood, OpenOOD",
        agreement="7e-8 relative (pytorch-ood `RankFeat`)",
    )

    def __init__(self, layers: Sequence[str] = ("layer4",), temperature: float = 1.0) -> None:
        self.layers = layers
        self.temperature = temperature

    def _validate_params(self) -> None:
        _check_layers(self, self.layers)
        self._check_positive(temperature=self.temperature)

    def requirements(self) -> Requirements:
        return Requirements.of(score=tuple(f"extra.rankfeat.{layer}" for layer in self.layers))

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        blocks = [np.asarray(chunk.extras[f"rankfeat.{layer}"], dtype=np.float64) for layer in self.layers]
        shapes = {block.shape for block in blocks}
        if len(shapes) != 1 or blocks[0].ndim != 2:
            raise DetectorError(f"rankfeat: the rankfeat extras must be (N, classes) logits of one shape; got {shapes}")
        logits = blocks[0] if len(blocks) == 1 else np.mean(blocks, axis=0)
        logits /= self.temperature
        return self.temperature * logsumexp_in_place(logits)

    def _row_width(self, test: Outputs) -> int:
        return 2 * len(self.layers) * int(test.extras[f"rankfeat.{self.layers[0]}"].shape[1])


def gram_deviation(values: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Σ_j relu(low − v)/|low + 1e-6| + relu(v − high)/|high + 1e-6| per row (the reference's form of the paper's δ)."""
    below = np.maximum(low - values, 0.0)
    below /= np.abs(low + 1e-6)
    above = np.maximum(values - high, 0.0)
    above /= np.abs(high + 1e-6)
    return below.sum(axis=1) + above.sum(axis=1)


@register("gram")
class Gram(_NetworkTime):
    """GRAM: total deviation of a layer's Gram-matrix statistics from the fit set's per-class ranges (extras)."""

    net_method = "gram"

    requires = Requirements.of(
        fit=("logits",) + tuple(f"extra.gram.{layer}" for layer in _STAGES),
        score=("logits",) + tuple(f"extra.gram.{layer}" for layer in _STAGES),
    )
    paper = Paper(
        "Sastry & Oore, Detecting Out-of-Distribution Examples with Gram Matrices",
        "ICML 2020",
        "https://arxiv.org/abs/1912.12510",
        "orders p = 1…10 and the layers, set at extraction (--net gram); per predicted class (argmax of the fit "
        "set's logits) the min and max of each Gram statistic; δ = Σ relu(min − v)/|min + 1e-6| + relu(v − max)/"
        "|max + 1e-6| per layer, as the reference code; score −Σ_l δ_l / E[δ_l], E[δ_l] on a held-out 10% of the "
        "fit set (1 where it is 0); a class absent from the fit set takes the range over all classes",
    )
    summary = Summary(
        "−Σ_l δ_l/E[δ_l], δ_l the deviation of a layer's Gram statistics from the predicted class's fit range",
        defaults="orders p = 1…10 (paper), set at extraction",
        needs="from `--net gram`",
        also_in="pytorch-ood, OpenOOD",
        agreement="not compared (pytorch-ood holds out a share of each class, not of the fit set)",
    )

    def __init__(self, layers: Sequence[str] = _STAGES, holdout: float = 0.1, seed: int = 0) -> None:
        self.layers = layers
        self.holdout = holdout
        self.seed = seed

    def _validate_params(self) -> None:
        _check_layers(self, self.layers)
        if not isinstance(self.holdout, (int, float)) or isinstance(self.holdout, bool) or not 0 < self.holdout < 1:
            raise DetectorError(f"gram: holdout must be a fraction in (0, 1); got {self.holdout!r}")
        self._check_int(minimum=0, seed=self.seed)

    def requirements(self) -> Requirements:
        names = ("logits",) + tuple(f"extra.gram.{layer}" for layer in self.layers)
        return Requirements.of(fit=names, score=names)

    def state_spec(self, fit: _FitInfo) -> dict[str, Spec]:
        """Per layer the (C, values) class minima and maxima; one expected deviation per layer."""
        widths = {layer: _extra_width(self, fit, f"gram.{layer}") for layer in self.layers}
        return {
            "low_": Keyed({layer: Array("float64", ("C", width)) for layer, width in widths.items()}),
            "high_": Keyed({layer: Array("float64", ("C", width)) for layer, width in widths.items()}),
            "expected_": Array("float64", (len(self.layers),)),
        }

    def _width(self, outputs: Outputs) -> int:
        return sum(int(np.prod(outputs.extras[f"gram.{layer}"].shape[1:])) for layer in self.layers)

    def _check_extras(self, outputs: Outputs) -> None:
        for layer in self.layers:
            array = outputs.extras[f"gram.{layer}"]
            if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
                raise DetectorError(
                    f"gram: extra.gram.{layer} must be float (N, values); got {array.dtype} {array.shape}"
                )

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self._check_extras(fit_set)
        num_rows, num_classes = len(fit_set), int(fit_set.num_classes)
        held = max(1, int(round(self.holdout * num_rows)))
        if num_rows - held < 1:
            raise DetectorError(f"gram: a fit set of {num_rows} rows leaves none for the ranges after the holdout")
        held_out = sample_rows(num_rows, held, int(self.seed))
        keep = np.ones(num_rows, dtype=bool)
        keep[held_out] = False
        bounds_rows = np.flatnonzero(keep)
        width = 3 * self._width(fit_set) + num_classes
        self.low_: dict[str, np.ndarray] = {}
        self.high_: dict[str, np.ndarray] = {}
        low = {layer: None for layer in self.layers}
        high = {layer: None for layer in self.layers}
        seen = np.zeros(num_classes, dtype=bool)
        for part in fit_chunks(bounds_rows.shape[0], width, "gram: class ranges"):
            rows = bounds_rows[part]
            predicted = _rows(fit_set.logits, rows).argmax(axis=1)
            order = np.argsort(predicted, kind="stable")
            classes, starts = np.unique(predicted[order], return_index=True)
            seen[classes] = True
            for layer in self.layers:
                values = _rows(fit_set.extras[f"gram.{layer}"], rows)[order]
                if low[layer] is None:
                    low[layer] = np.full((num_classes, values.shape[1]), np.inf)
                    high[layer] = np.full((num_classes, values.shape[1]), -np.inf)
                # Per-class minima and maxima of the sorted block, one reduceat per statistic (no per-row loop).
                low[layer][classes] = np.minimum(low[layer][classes], np.minimum.reduceat(values, starts, axis=0))
                high[layer][classes] = np.maximum(high[layer][classes], np.maximum.reduceat(values, starts, axis=0))
        for layer in self.layers:
            lo, hi = low[layer], high[layer]
            lo[~seen] = lo[seen].min(axis=0)
            hi[~seen] = hi[seen].max(axis=0)
            self.low_[layer], self.high_[layer] = lo, hi
        totals = np.zeros(len(self.layers))
        for part in fit_chunks(held_out.shape[0], width, "gram: expected deviations"):
            rows = held_out[part]
            predicted = _rows(fit_set.logits, rows).argmax(axis=1)
            for i, layer in enumerate(self.layers):
                values = _rows(fit_set.extras[f"gram.{layer}"], rows)
                totals[i] += gram_deviation(values, self.low_[layer][predicted], self.high_[layer][predicted]).sum()
        expected = totals / held_out.shape[0]
        self.expected_ = np.where(expected > 0, expected, 1.0)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        self._check_extras(chunk)
        predicted = np.asarray(chunk.logits).argmax(axis=1)
        total = np.zeros(len(chunk))
        for layer, expected in zip(self.layers, self.expected_, strict=True):
            values = np.asarray(chunk.extras[f"gram.{layer}"], dtype=np.float64)
            low = self.low_[layer]
            if values.shape[1] != low.shape[1]:
                raise DetectorError(
                    f"gram: extra.gram.{layer} has {values.shape[1]} values per row but {low.shape[1]} at fit"
                )
            total += gram_deviation(values, low[predicted], self.high_[layer][predicted]) / expected
        return -total

    def _row_width(self, test: Outputs) -> int:
        return 6 * self._width(test) + int(test.num_classes or 0)


@register("mds_ensemble")
class MahalanobisEnsemble(_NetworkTime):
    """Mahalanobis ensemble: Σ_l w_l · (−min_c squared Mahalanobis distance) over several layers' pooled maps."""

    net_method = "mds"

    requires = Requirements.of(
        fit=("labels",) + tuple(f"extra.mds.{layer}" for layer in _STAGES),
        score=tuple(f"extra.mds.{layer}" for layer in _STAGES),
    )
    paper = Paper(
        "Lee, Lee, Lee & Shin, A Simple Unified Framework for Detecting Out-of-Distribution Samples and "
        "Adversarial Attacks",
        "NeurIPS 2018",
        "https://arxiv.org/abs/1807.03888",
        "the four stages' feature maps averaged over positions (set at extraction: --net mds); per layer class "
        "means from fit labels and one shared covariance (divide by N, pseudo-inverse as maha); layers combined by "
        "an unweighted sum (the paper fits the weights by logistic regression on OOD validation data, which a "
        "post-hoc detector does not have; give weights to use others); no input preprocessing",
    )
    summary = Summary(
        "−Σ_l w_l min_c (z_l−μ_lc)ᵀP_l(z_l−μ_lc), z_l a layer's map averaged over positions",
        defaults="weights None: an unweighted sum; the paper fits them on OOD validation data",
        needs="from `--net mds`",
        also_in="pytorch-ood, OpenOOD",
        agreement="4.9e-5 relative after scaling (pytorch-ood `MultiMahalanobis` = −ours/(2N)); identical ranks",
    )

    # K classes present in the fit labels (shared by the layers); r<i>, s<i>: the whitener ranks of layer i.
    state_dims = {"K": "N", **{f"{kind}{i}": "N" for i in range(_MAX_LAYERS) for kind in "rs"}}

    def __init__(self, layers: Sequence[str] = _STAGES, weights: Sequence[float] | None = None) -> None:
        self.layers = layers
        self.weights = weights

    def _validate_params(self) -> None:
        _check_layers(self, self.layers)
        if len(self.layers) > _MAX_LAYERS:
            raise DetectorError(f"mds_ensemble: at most {_MAX_LAYERS} layers; got {len(self.layers)}")
        if self.weights is not None:
            if isinstance(self.weights, str) or not isinstance(self.weights, Sequence):
                raise DetectorError(f"mds_ensemble: weights must be a sequence of numbers; got {self.weights!r}")
            if len(self.weights) != len(self.layers):
                raise DetectorError(
                    f"mds_ensemble: {len(self.weights)} weights for {len(self.layers)} layers; give one per layer"
                )
            for weight in self.weights:
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not np.isfinite(weight):
                    raise DetectorError(f"mds_ensemble: weights must be finite numbers; got {self.weights!r}")

    def requirements(self) -> Requirements:
        extras = tuple(f"extra.mds.{layer}" for layer in self.layers)
        return Requirements.of(fit=("labels",) + extras, score=extras)

    def state_spec(self, fit: _FitInfo) -> dict[str, Spec]:
        """Per layer the Gaussians over its channels (a rank of their own); one weight per layer."""
        return {
            "gaussians_": Keyed(
                {
                    layer: class_gaussians_state(_extra_width(self, fit, f"mds.{layer}"), f"r{i}", f"s{i}")
                    for i, layer in enumerate(self.layers)
                }
            ),
            "weights_": Array("float64", (len(self.layers),)),
        }

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        self.gaussians_: dict[str, ClassGaussians] = {}
        for layer in self.layers:
            array = fit_set.extras[f"mds.{layer}"]
            if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
                raise DetectorError(f"mds_ensemble: extra.mds.{layer} must be float (N, channels); got {array.shape}")
            stats = ScatterAccumulator(array.shape[1], by_class=True)
            for rows in fit_chunks(len(fit_set), 2 * array.shape[1], f"mds_ensemble: statistics of {layer}"):
                stats.update(array[rows], np.asarray(fit_set.labels[rows]))
            covariance = stats.within_class_covariance()
            triangular = triangular_whitener(covariance)
            whiteners = {"triangular": triangular} if triangular is not None else {"whitener": pinv_sqrt(covariance)}
            self.gaussians_[layer] = ClassGaussians(stats.class_means(), covariance, stats.mean, **whiteners)
        self.weights_ = np.ones(len(self.layers)) if self.weights is None else np.asarray(self.weights, dtype=float)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        total = np.zeros(len(chunk))
        for layer, weight in zip(self.layers, self.weights_, strict=True):
            gaussians = self.gaussians_[layer]
            block = chunk.extras[f"mds.{layer}"]
            if block.shape[1] != gaussians.centre.shape[0]:
                raise DetectorError(
                    f"mds_ensemble: extra.mds.{layer} has {block.shape[1]} channels but {gaussians.centre.shape[0]} at fit"
                )
            total -= weight * gaussians.min_sq_distance(gaussians.centre_rows(block), overwrite=True, centred=True)
        return total

    def _row_width(self, test: Outputs) -> int:
        return 2 * sum(int(test.extras[f"mds.{layer}"].shape[1]) for layer in self.layers) + 8
