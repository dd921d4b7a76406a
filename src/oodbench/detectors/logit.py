"""Detectors that read only the logits: MSP, MaxLogit, KL-Matching, Energy, GEN."""

from __future__ import annotations

import numpy as np

from ..core.numerics import energy, logsumexp_in_place, scaled_with_peak, softmax
from ..core.outputs import Head, Outputs
from .base import Detector, Paper, Requirements, Summary
from .registry import register
from .shared import statistics_for
from .state import Array


def max_softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Per row, the largest softmax probability of the logits divided by the temperature (float64)."""
    scaled, peak = scaled_with_peak(logits, temperature)  # a fresh array: reduced in place
    # max softmax = exp(max f - logsumexp f), stable without forming the whole softmax.
    return np.exp(peak[:, 0] - logsumexp_in_place(scaled, peak))


@register("msp")
class MSP(Detector):
    """Maximum softmax probability."""

    requires = Requirements.of(score=("logits",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Hendrycks & Gimpel, A Baseline for Detecting Misclassified and OOD Examples",
        "ICLR 2017",
        "https://arxiv.org/abs/1610.02136",
    )
    summary = Summary(
        "max_c p_c",
        also_in="pytorch-ood, OpenOOD",
        agreement="both peers take the softmax in float32, where a row whose top logit leads by more than about 17 scores exactly 1.0 (in float64, as here, about 37): such rows tie, and FPR@95 counts every ID row of a tie it has to cross. On the arrays of `benchmarks/small_inputs.py` (seed 0) AUROC is 0.9956 here and 0.9557 in pytorch-ood",
    )

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def _validate_params(self) -> None:
        self._check_positive(temperature=self.temperature)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        return max_softmax(chunk.logits, self.temperature)


@register("maxlogit")
class MaxLogit(Detector):
    """Maximum logit."""

    requires = Requirements.of(score=("logits",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Hendrycks et al., Scaling Out-of-Distribution Detection for Real-World Settings",
        "ICML 2022",
        "https://arxiv.org/abs/1911.11132",
    )
    summary = Summary(
        "max_c f_c",
        also_in="pytorch-ood, OpenOOD",
    )

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        # The largest value converts exactly: no float64 copy of every logit.
        return np.asarray(chunk.logits).max(axis=1).astype(np.float64)


@register("kl_matching")
class KLMatching(Detector):
    """Negative KL divergence from the softmax to the closest class template (mean softmax per predicted class)."""

    requires = Requirements.of(fit=("logits",), score=("logits",))
    shared_statistics = frozenset({"prediction_templates"})
    state = {
        "templates_": Array("float64", ("C", "C")),
        "class_counts_": Array("int64", ("C",)),
        "log_templates_": Array("float64", ("C", "C")),
    }
    paper = Paper(
        "Hendrycks et al., Scaling Out-of-Distribution Detection for Real-World Settings",
        "ICML 2022",
        "https://arxiv.org/abs/1911.11132",
        "templates from fit-set predictions (no labels needed); a class never predicted gets its one-hot vector",
    )
    summary = Summary(
        "−min_c KL(p ‖ d_c), d_c the mean softmax of rows predicted c",
        defaults="eps guards only the zeros of one-hot templates",
        also_in="pytorch-ood, OpenOOD",
    )

    def __init__(self, eps: float = 1e-300) -> None:
        self.eps = eps

    def _validate_params(self) -> None:
        self._check_positive(eps=self.eps)

    def _fit(self, fit_set: Outputs, head: Head | None) -> None:
        num_classes = int(fit_set.num_classes)
        sums, counts = statistics_for(self, fit_set).get("prediction_templates")
        templates = np.eye(num_classes)
        seen = counts > 0
        templates[seen] = sums[seen] / counts[seen, None]
        self.templates_ = templates
        self.class_counts_ = counts
        # Clip only (near-)zero template entries: one-hot templates would otherwise give infinite divergences.
        # A larger eps (e.g. 1e-12) would also distort the legitimately tiny probabilities of real templates.
        self.log_templates_ = np.log(np.maximum(templates, self.eps))

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        probs = softmax(chunk.logits)
        from scipy.special import xlogy  # imported on use: `oodbench --help` does not load scipy

        neg_entropy = xlogy(probs, probs).sum(axis=1)
        divergences = neg_entropy[:, None] - probs @ self.log_templates_.T  # KL(p || d_c) for every c at once
        return -divergences.min(axis=1)


@register("energy")
class Energy(Detector):
    """Negative free energy T · logsumexp(f / T)."""

    requires = Requirements.of(score=("logits",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Liu et al., Energy-based Out-of-distribution Detection", "NeurIPS 2020", "https://arxiv.org/abs/2010.03759"
    )
    summary = Summary(
        "T·logsumexp(f/T)",
        also_in="pytorch-ood, OpenOOD",
    )

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def _validate_params(self) -> None:
        self._check_positive(temperature=self.temperature)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        return energy(chunk.logits, self.temperature)


@register("gen")
class GEN(Detector):
    """Generalized entropy over the top-M probabilities: −Σ p^γ (1 − p)^γ."""

    requires = Requirements.of(score=("logits",))
    state = {}  # learns nothing: declared, so a saved file holds no state
    paper = Paper(
        "Liu, Lochman & Zach, GEN: Pushing the Limits of Softmax-Based OOD Detection",
        "CVPR 2023",
        "https://openaccess.thecvf.com/content/CVPR2023/html/Liu_GEN_Pushing_the_Limits_of_Softmax-Based_Out-of-Distribution_Detection_CVPR_2023_paper.html",
    )
    summary = Summary(
        "−Σ_top-M p^γ(1−p)^γ",
        defaults="the paper",
        also_in="pytorch-ood, OpenOOD",
        agreement="OpenOOD computes 1 − p in float32, which drops the winning class's term (1 − p)^γ, still about 0.2 at γ = 0.1, once p rounds to 1 (here 1 − p of the winner is the sum of the other probabilities); pytorch-ood clamps p to [1e-7, 1 − 1e-7], so every winning p above 1 − 1e-7 gives the same term, and averages over the top M instead of summing (÷M, the same ranks). On the arrays of `benchmarks/small_inputs.py` (seed 0) AUROC is 0.9937 here and 0.9508 in pytorch-ood",
    )

    def __init__(self, gamma: float = 0.1, top_m: int = 100) -> None:
        self.gamma = gamma
        self.top_m = top_m

    def _validate_params(self) -> None:
        self._check_positive(gamma=self.gamma)
        self._check_int(top_m=self.top_m)

    def _score_chunk(self, chunk: Outputs) -> np.ndarray:
        probs = softmax(chunk.logits)
        num_classes = probs.shape[1]
        m = min(self.top_m, num_classes)
        # Every class when M ≥ C (the sum's terms in column order): no partition, no copy of the top M.
        top = probs if m == num_classes else np.partition(probs, num_classes - m, axis=1)[:, num_classes - m :]
        terms = 1.0 - top
        # For the winning class 1 - p rounds to 0 once p is within 1e-16 of 1, although (1 - p)^γ with
        # γ = 0.1 is still ~1e-2 there; sum the other probabilities instead to keep confident inputs ranked.
        winner = probs.argmax(axis=1)
        rows = np.arange(probs.shape[0])
        others = probs.copy()
        others[rows, winner] = 0.0
        terms[rows, winner if top is probs else top.argmax(axis=1)] = others.sum(axis=1)
        # p^γ (1 − p)^γ as one power of the product (a float64 power costs ~20 ns, most of this score's time): the
        # product's rounding raised to γ plus the power's error (< 1 ulp) bound a term's error by (γ + 2)·2⁻⁵³
        # relative, against 5·2⁻⁵³ for two powers and their product. No new underflow: a term's two factors are
        # never both below 1/2.
        terms *= top
        np.power(terms, self.gamma, out=terms)
        return -terms.sum(axis=1)
