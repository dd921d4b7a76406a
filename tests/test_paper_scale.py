"""benchmarks/paper_scale.py: the paper's sizes, and one end-to-end run at a tiny scale through `oodbench evaluate`."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from oodbench.analysis.published import POST_HOC_POOL
from oodbench.core.results import read_rows

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paper_scale.py"


@pytest.fixture(scope="module")
def paper_scale():
    spec = importlib.util.spec_from_file_location("paper_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_scale"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["paper_scale"]


def test_full_sizes_are_the_papers(paper_scale):
    """Fit: the ImageNet-1k train split; ID test: 48,365 (Sec. 4, "Data."); OOD: the 15 rows of Table 3's n column."""
    sizes = paper_scale.plan_sizes(1.0)
    assert sizes.pop(paper_scale.FIT) == 1_281_167
    assert sizes.pop(paper_scale.ID_TEST) == 48_365
    # Table 3, column n, top to bottom.
    table3 = [10_000, 17_632, 11_800, 10_350, 2_000, 5_640, 10_000, 50_000, 49_000, 10_000, 50_000]
    table3 += [2_715, 5_879, 31_802, 655]
    assert list(sizes.values()) == table3
    assert sizes["fi-imagenet-1k"] == 655 and sizes["ssb-hard"] == 49_000


def test_scaled_sizes_keep_a_floor_of_rows(paper_scale):
    sizes = paper_scale.plan_sizes(0.001)
    assert sizes[paper_scale.FIT] == 2_000  # 1,281 rows would not hold knn's k = 1000 and nnguide's bank
    assert sizes["fi-imagenet-1k"] == 20 and sizes["ssb-easy"] == 50


def test_work_model_counts_the_unavoidable_products(paper_scale):
    n, q, d, c = 1000, 300, 64, 10
    knn = paper_scale.work_model("knn", {"index": "flat"}, n, q, d, c)
    assert knn["score_flops"] == 2 * q * n * d and knn["fit_bytes"] == 4 * n * d
    ivf = paper_scale.work_model("knn", {"index": "ivf", "nlist": 10, "nprobe": 2}, n, q, d, c)
    assert ivf["score_flops"] == 2 * q * d * (10 + n * 2 / 10)
    # knn's default lists for N = 1000, k = 5: N/k = 200 clipped to sqrt(N) = 31.6 (N/39 = 25.6 < sqrt(N)): 32.
    default = paper_scale.work_model("knn", {"index": "ivf", "k": 5, "nprobe": 2}, n, q, d, c)
    assert default["score_flops"] == 2 * q * d * (32 + n * 2 / 32)
    msp = paper_scale.work_model("msp", {}, n, q, d, c)
    assert msp == {"fit_flops": 0.0, "score_flops": 0.0, "fit_bytes": 0.0, "score_bytes": 4.0 * q * c}
    floor = paper_scale.floor_seconds(knn, gflops=1.0, bytes_per_s=1e9)
    assert floor == pytest.approx(2 * q * n * d / 1e9)


def test_elementary_work_counts_the_float64_kernels_and_prices_them_at_their_rates(paper_scale):
    n, q, d, c = 1000, 300, 64, 10
    # MSP: a float64 copy, the max, the shift, the clip and the sum (5 passes) and one exp per logit.
    assert paper_scale.elementary_work("msp", {}, n, q, d, c) == {"pass64": 5.0 * q * c, "exp64": 1.0 * q * c}
    gen = paper_scale.elementary_work("gen", {"top_m": 4}, n, q, d, c)
    assert gen["select64"] == q * c and gen["exp64"] == q * c + 4 * q * 4  # two powers (a log and an exp each)
    assert paper_scale.elementary_work("knn", {"index": "ivf", "nlist": 10, "nprobe": 2, "k": 5}, n, q, d, c) == {}
    assert paper_scale.elementary_work("maha", {}, n, q, d, c) == {}  # the GEMM floor covers it
    rates = {"pass64": 2.0, "exp64": 4.0, "gemm64_gflops": 1e-9}  # 1 FLOP/s
    seconds = paper_scale.elementary_seconds({"pass64": 6.0, "exp64": 8.0, "flops64": 3.0}, rates)
    assert seconds == 6.0 / 2.0 + 8.0 / 4.0 + 3.0
    measured = paper_scale.elementary_rates(classes=200, dim=32, rows=16, repeats=1)
    assert set(measured) == set(paper_scale.ELEMENTARY_KERNELS) | {"gemm64_gflops"}
    assert all(rate > 0 and np.isfinite(rate) for rate in measured.values())


@pytest.mark.slow
def test_a_tiny_run_times_every_detector_and_deletes_its_store(paper_scale, tmp_path):
    report_path = tmp_path / "report.json"
    report = paper_scale.main(
        ["--d", "32", "--scale", "0.0016", "--workdir", str(tmp_path / "work"), "--quiet", "--json", str(report_path)]
    )
    assert json.loads(report_path.read_text())["fit_rows"] == report["fit_rows"] == 2_050
    assert set(report["detectors"]) == POST_HOC_POOL  # the paper's 21 by default
    for name, row in report["detectors"].items():
        assert row["fit_s"] >= 0 and row["score_s"] > 0, name
        assert row["floor_s"] > 0 and row["ratio"] > 0, name
    # Rows with float64 work by design carry a second floor: their float32 products plus those kernels.
    assert report["detectors"]["msp"]["elementary_s"] > 0 and "elementary_s" not in report["detectors"]["maha"]
    assert report["shared_statistics"]["elementary_s"] > 0
    assert "| with float64 work (s) |" in paper_scale.markdown(report)
    assert report["shared_statistics"]["passes"] == 1  # one pass over the fit set for every detector that shares
    assert report["store"]["bytes"] > 4 * 32 * report["fit_rows"]
    assert not (tmp_path / "work" / "store").exists()  # deleted unless --keep-store
    rows = read_rows(tmp_path / "work" / "run-knn-flat" / "results.parquet")
    assert {r.detector for r in rows} == POST_HOC_POOL
    assert {r.ood_dataset for r in rows} == set(report["sizes"]) - {paper_scale.FIT, paper_scale.ID_TEST}
    assert all(np.isfinite(r.value) for r in rows)


@pytest.mark.slow
def test_the_ivf_index_is_recorded_in_the_run(paper_scale, tmp_path):
    report = paper_scale.main(
        ["--d", "16", "--scale", "0.0016", "--workdir", str(tmp_path), "--quiet", "--detectors", "knn"]
        + ["--knn-index", "ivf", "--knn-nprobe", "40"]
    )
    run = json.loads((tmp_path / "run-knn-ivf" / "run.json").read_text())
    # run.json records every resolved parameter (the given ones among them), and the benchmark reports them
    assert run["detectors"]["knn"] == report["knn_index"]
    assert {key: run["detectors"]["knn"][key] for key in ("index", "nprobe")} == {"index": "ivf", "nprobe": 40}


def test_extrapolation_recovers_a_fixed_cost_plus_a_rate_per_unit_of_work(paper_scale):
    """Times that are exactly fixed + rate x floor-work at two scales extrapolate to fixed + rate x work at full size."""
    d, gflops, read = 64, 10.0, 1e9
    names = ["msp", "maha", "knn"]
    fixed = {"fit": 0.5, "score": 0.25}
    rate = {"fit": 3.0, "score": 2.0}

    def phase_floor(name, phase, n, q):
        work = paper_scale.work_model(name, paper_scale.default_params(name), n, q, d, paper_scale.CLASSES)
        return max(work[f"{phase}_flops"] / (gflops * 1e9), work[f"{phase}_bytes"] / read)

    def report(scale):
        sizes = paper_scale.plan_sizes(scale)
        n = sizes[paper_scale.FIT]
        q = sum(sizes.values()) - n
        rows = {
            name: {f"{p}_s": fixed[p] + rate[p] * phase_floor(name, p, n, q) for p in ("fit", "score")}
            for name in names
        }
        return {
            "d": d, "scale": scale, "fit_rows": n, "test_rows": q, "gemm_gflops": gflops, "read_bytes_per_s": read,
            "params": {}, "detectors": rows, "shared_statistics": {"seconds": 1.0 + 1e-4 * n},
        }  # fmt: skip

    estimate = paper_scale.extrapolate([report(0.1), report(0.05)])
    full = paper_scale.plan_sizes(1.0)
    n = full[paper_scale.FIT]
    q = sum(full.values()) - n
    for name in names:
        for phase in ("fit", "score"):
            expected = fixed[phase] + rate[phase] * phase_floor(name, phase, n, q)
            assert estimate["detectors"][name][f"{phase}_s"] == pytest.approx(expected, rel=1e-9), (name, phase)
    assert estimate["shared_statistics_s"] == pytest.approx(1.0 + 1e-4 * n, rel=1e-9)


@pytest.fixture(scope="module")
def knn_index(paper_scale):
    path = SCRIPT.with_name("knn_index.py")
    spec = importlib.util.spec_from_file_location("knn_index", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_knn_index_breakdown_checks_the_thresholded_search_against_the_plain_one(knn_index):
    report = knn_index.main(
        ["--breakdown", "--d", "16", "--lists", "4", "--list-size", "20", "--k", "5", "--per-list", "8"]
        + ["--nprobe-breakdown", "2", "--merge-width", "5,10", "--repeats", "1"]
    )
    assert report["bit_identical"] is True  # array_equal of both merges' k-th values, every width
    assert {"gemm", "merge_concat", "search_concat", "search_thresholded_w5", "search_thresholded_w10"} <= set(
        report["seconds"]
    )


@pytest.mark.slow
def test_knn_index_on_a_store_runs_exact_then_ivf(paper_scale, knn_index, tmp_path):
    paper_scale.main(
        ["--d", "32", "--scale", "0.002", "--workdir", str(tmp_path), "--quiet", "--detectors", "msp", "--keep-store"]
    )
    report = knn_index.main(
        ["--store", str(tmp_path / "store"), "--k", "3", "--id", "40", "--ood", "80", "--nlist", "8", "--nprobe", "8"]
    )
    assert report["id_rows"] == 40 and report["ood_rows"] == 80 and len(report["ood_sets"]) == 15
    assert set(report["indexes"]) == {"flat", "ivf"}
    # Every list probed: the same neighbours, their float32 inner products (32 terms) summed in other orders, each
    # within γ_32 = 32·2⁻²⁴ ≈ 1.9e-6, so distances √(2 − 2s) of these spread rows (≥ 0.04 apart) within 1e-4.
    assert report["max_abs_score_difference"] <= 1e-4


@pytest.fixture(scope="module")
def detector_bench():
    spec = importlib.util.spec_from_file_location("bench_detectors", SCRIPT.with_name("detectors.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_target_times_every_part_of_the_floor_in_every_round(detector_bench, tmp_path):
    """--fit-target: each round times a Gram pass, vim's residual product, the D³ work and the joint fit; the floor
    is two Gram passes (raw and normalised) plus the best of each other part."""
    out = tmp_path / "fit.json"
    detector_bench.main(
        ["--fit-target", "--fit", "3000", "--dim", "128", "--classes", "5", "--repeats", "2", "--out", str(out)]
    )
    report = json.loads(out.read_text())["fit_target"]
    assert len(report["gram_pass_s"]) == len(report["floor_parts_s"]) == len(report["together_float32_s"]) == 2
    floor = report["floor"]
    assert floor["gram_passes"] == pytest.approx(2 * min(report["gram_pass_s"]))
    for part in ("vim_residual_product", "fixed_d3_work"):
        assert floor[part] == min(times[part] for times in report["floor_parts_s"]) > 0
    assert floor["total"] == pytest.approx(
        floor["gram_passes"] + floor["vim_residual_product"] + floor["fixed_d3_work"]
    )
    assert report["ratio_to_floor"] == pytest.approx(min(report["together_float32_s"]) / floor["total"])
    assert detector_bench.gram_passes(["maha", "vim"]) == 1 and detector_bench.gram_passes(["maha++"]) == 1


def test_the_flat_search_benchmark_checks_its_values_against_faiss(tmp_path):
    pytest.importorskip("faiss")
    spec = importlib.util.spec_from_file_location("flat_search_bench", SCRIPT.with_name("flat_search.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "flat.json"
    report = module.main(
        ["--bank", "300", "--d", "16", "--queries", "40", "--k", "7", "--repeats", "1", "--out", str(out)]
    )
    assert report["largest_difference"] <= report["bound"] == pytest.approx(2 * 16 * 2.0**-24 / (1 - 16 * 2.0**-24))
    assert set(report["seconds"]) == {"faiss", "oodbench", "floor"}
    assert json.loads(out.read_text())["config"]["k"] == 7
