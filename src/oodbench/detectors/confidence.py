"""Detectors of the predictive distribution: temperature-scaled MSP, predictive entropy, GradNorm."""

from __future__ import annotations

import numpy as np

from ..core.errors import DetectorError
from ..core.outputs import Head, Outputs
from ._streaming import fit_chunks
from .base import Detector, Paper, Requirements, Summary
from .logit import max_softmax
from .registry import register
from .state import Scalar

# Newton's iteration on the inverse temperature stops once a step moves it by less than this fraction.
_STEP_RTOL = 1e-13
_MAX_PASSES = 200


def _shifted(logits: np.ndarray, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """β·f shifted by its row maximum (≤ 0, a fresh float64 array), the softmax p of β·f, and log Σ exp(shifted)."""
    shifted = np.asarray(logits, dtype=np.float64) * beta  # a fresh array
    rows, peak = np.arange(shifted.shape[0]), shifted.argmax(axis=1)
    shifted -= shifted[rows, peak][:, None]
    probs = np.exp(shifted)
    # The peak's term is exactly 1: log1p of the others keeps log Σ exp its relative precision when they are tiny.
    probs[rows, peak] = 0.0
    others = probs.sum(axis=1)
    probs[rows, peak] = 1.0
    probs /= (1.0 + others)[:, None]
    return shifted, probs, np.log1p(others)


def _label_logits(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)  # in [0, C): Detector.fit checks the labels of a supervised fit first
    return np.asarray(logits, dtype=np.float64)[np.arange(labels.shape[0]), labels]


@register("tempscale")
class TemperatureScaling(Detector):
    """MSP of softmax(f / T), T fitted by minimising the negative log-likelihood of the fit set's labels.

    With β = 1/T, NLL(β) = mean_i [log Σ_c exp(β f_ic) − β f_iy] is convex: NLL' = mean(E_p[f] − f_y) and
    NLL'' = mean(Var_p[f]) ≥ 0 under p = softmax(β f). A finite positive minimiser exists exactly when NLL'(0) < 0
    (the labels beat a uniform guess) and at least one fit row is misclassified (else NLL falls as T → 0); it is
    found by safeguarded Newton steps, one streamed pass over the fit logits each, to float64 precision.
    """

    requires = Requirements.of(fit=("logits", "labels"), score=("logits",))
    state = {"temperature_": Scalar(float, 0.0), "passes_": Scalar(int, 1)}
    paper = Paper(
        "Guo, Pleiss, Sun & Weinberger, On Calibration of Modern Neural Networks",
        "ICML 2017",
        "https://arxiv.org/abs/1706.04599",
        "no hyper-parameters: T minimises the NLL of the fit set, which should be held-out ID data (the paper "
        "uses a validation set; fitted on training rows T comes out near or below 1); the exact minimiser, "
        "where pytorch-ood and OpenOOD stop L-BFGS (lr 0.01) after 50 iterations",
    )
    summary = Summary(
        "max_c softmax_c(f/T), T minimising the fit set's NLL (exact: safeguarded Newton on 1/T)",
        defaults="T is fitted; give a held-out ID fit set",
        also_in="pytorch-ood, OpenOOD",
        agreement="same MSP given T (1e-6); their L-BFGS (lr 0.01, 50 iterations) stops at T = 1.26 where the NLL minimiser is 4.66, which float64 L-BFGS with line search reaches to 1e-6",
    )

    def _moments(self, fit_set: Outputs, beta: float) -> tuple[float, float]:
        """NLL'(β) and NLL''(β) over the fit set, one streamed pass."""
        gradient = curvature = 0.0
        num_classes = int(fit_set.num_classes)
        for rows in fit_chunks(len(fit_set), 3 * num_classes, "tempscale: NLL"):
            logits = np.asarray(fit_set.logits[rows], dtype=np.float64)
            target = _label_logits(logits, fit_set.labels[rows])
            _, probs, _ = _shifted(logits, beta)
            mean = np.einsum("nc,nc->n", probs, logits)
            logits -= mean[:, None]
            gradient += float((mean - target).sum())
            curvature += float(np.einsum("nc,nc,nc->", probs, logits, logits))
        return gradient / len(fit_set), curvature / len(fit_set)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        num_classes = int(fit_set.num_classes)
        slope_at_zero, misclassified = 0.0, False
        for rows in fit_chunks(len(fit_set), 2 * num_classes, "tempscale: checks"):
            logits = np.asarray(fit_set.logits[rows], dtype=np.float64)
            target = _label_logits(logits, fit_set.labels[rows])
            slope_at_zero += float((logits.mean(axis=1) - target).sum())
            misclassified = misclassified or bool((logits.max(axis=1) > target).any())
        if slope_at_zero >= 0.0:
            raise DetectorError(
                "tempscale: the fit labels are predicted no better than a uniform guess, so the NLL has no minimum "
                "at a positive temperature; check that the labels match the logits' classes"
            )
        if not misclassified:
            raise DetectorError(
                "tempscale: every fit row is classified correctly, so the NLL keeps falling as T -> 0; fit the "
                "temperature on held-out ID data (a validation split), not on the training set"
            )
        # Bracket the root of NLL'(β) (increasing in β, negative at 0), then safeguarded Newton steps.
        low, high, beta = 0.0, np.inf, 1.0
        passes = 0
        while True:
            gradient, curvature = self._moments(fit_set, beta)
            passes += 1
            if gradient < 0:
                low = beta
            else:
                high = beta
            step = -gradient / curvature if curvature > 0 else np.inf
            proposal = beta + step
            if not low < proposal < high:
                proposal = 2.0 * beta if not np.isfinite(high) else 0.5 * (low + high)
            if abs(proposal - beta) <= _STEP_RTOL * beta or gradient == 0.0:
                beta = proposal if low < proposal < high else beta
                break
            if passes >= _MAX_PASSES:
                raise DetectorError(f"tempscale: the temperature did not converge in {_MAX_PASSES} passes")
            beta = proposal
        self.temperature_ = 1.0 / beta
        self.passes_ = passes

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        return max_softmax(chunk.logits, self.temperature_)


@register("entropy")
class Entropy(Detector):
    """Negative predictive entropy Σ_c p_c log p_c, p = softmax(f)."""

    requires = Requirements.of(score=("logits",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Chan, Rottmann & Gottschalk, Entropy Maximization and Meta Classification for Out-of-Distribution "
        "Detection in Semantic Segmentation",
        "ICCV 2021",
        "https://arxiv.org/abs/2012.06575",
        "the entropy score as pytorch-ood cites it; no hyper-parameters. Computed as −H = Σ p g − log1p(Σ' exp g) with "
        "g = f − max f ≤ 0 (Σ' over all but the peak): two terms of one sign, no cancellation, relative precision "
        "kept on confident rows and no clipping of small probabilities",
    )
    summary = Summary(
        "Σ_c p_c log p_c (negative entropy)",
        also_in="pytorch-ood",
        agreement="8.1e-6 absolute: pytorch-ood's softmax and logarithm are float32 and it clips p at 1e-7 (a class below 1e-7 counts as 1e-7, adding up to 1.6e-6)",
    )

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        shifted, probs, log_total = _shifted(chunk.logits)
        return np.einsum("nc,nc->n", probs, shifted) - log_total


@register("gradnorm")
class GradNorm(Detector):
    """GradNorm: ‖∂ KL(u ‖ softmax(f/T)) / ∂W‖₁, the gradient with respect to the head's weight W; closed form.

    With f = W z + b, p = softmax(f/T) and u the uniform distribution over the C classes,
    KL(u ‖ p) = Σ_c (1/C) log(1/C) − (1/C) Σ_c log p_c. Since ∂ log p_c / ∂f_j = (δ_cj − p_j)/T,
    ∂KL/∂f_j = (1/T)(p_j − 1/C), and ∂f_j/∂W_jd = z_d, so ∂KL/∂W_jd = (1/T)(p_j − 1/C) z_d: an outer product,
    whose entrywise ℓ1 norm factorises: ‖∂KL/∂W‖₁ = (1/T) · Σ_j |p_j − 1/C| · Σ_d |z_d|. The score needs only
    the features and the logits, not W.
    """

    requires = Requirements.of(score=("features", "logits"))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Huang, Geng & Li, On the Importance of Gradients for Detecting Distributional Shifts in the Wild",
        "NeurIPS 2021",
        "https://arxiv.org/abs/2110.00218",
        "temperature=1: the paper's setting; the gradient of the KL divergence to the uniform distribution, as the "
        "paper defines it (the official code and OpenOOD sum the cross-entropy over classes instead: C times this "
        "score, the same ranking), with respect to the last layer's weight only (not its bias)",
    )
    summary = Summary(
        "‖∂KL(u‖softmax(f/T))/∂W‖₁ = (1/T)·Σ_c|p_c − 1/C|·‖z‖₁ (closed form, checked against autograd)",
        defaults="the paper",
        also_in="pytorch-ood, OpenOOD",
        agreement="4.0e-7 relative (pytorch-ood, float32 autograd); OpenOOD and the official code sum the cross-entropy over classes: C × this score, the same ranks, to 4.1e-7",
    )

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def _validate_params(self) -> None:
        self._check_positive(temperature=self.temperature)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        _, probs, _ = _shifted(chunk.logits, 1.0 / self.temperature)
        probs -= 1.0 / probs.shape[1]
        spread = np.abs(probs).sum(axis=1)
        mass = np.abs(np.asarray(chunk.features, dtype=np.float64)).sum(axis=1)
        return spread * mass / self.temperature
