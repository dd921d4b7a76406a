"""The full-count rehearsal of configs/fi-imagenet-1k.toml: every stage of `oodbench run` on a rehearsal root
(`oodbench rehearse make-root`, real layouts and counts) with stand-in models, once uninterrupted (run A) and once
killed with SIGKILL at random moments in each stage and resumed (run B); then every file of the two work
directories is compared byte for byte, and the report is opened in Chromium. docs/rehearsal.md has the figures.

    python benchmarks/rehearsal_full.py --lists ../shared/data/imagelists --work /data/rehearsal --scale 0.1

Per stage it records wall time, peak resident memory and open files of the whole process tree (sampled from
/proc every 0.2 s), the work directory's size on disk, and for extraction the images per second and the share of
that time spent decoding. The vocabularies the config names by `ref` are built in each run through the real
`oodbench zeroshot vocab build` commands against a loopback stand-in of an OpenAI-compatible endpoint whose replies
are a function of the prompt (tests/fakes/openai_server.py), and the oracle vocabulary from the run's own store.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fakes: the loopback LLM endpoint

CONFIG = ROOT / "configs" / "fi-imagenet-1k.toml"
STAGES = ("extract", "score", "metrics", "analysis", "report")
PAGE = os.sysconf("SC_PAGE_SIZE")


def oodbench() -> list[str]:
    """The command line that runs this checkout's oodbench."""
    return [str(Path(sys.executable).with_name("oodbench"))]


# ----------------------------------------------------------------------------------------------- process tree


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        tree.setdefault(parent, []).append(int(entry))
    return tree


def _tree(pid: int) -> list[int]:
    children, out, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


class Monitor(threading.Thread):
    """Peak resident memory (sum over the tree) and open files (sum of /proc/PID/fd) of a process and its children."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.rss, self.fds, self.procs = pid, 0, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            rss = fds = 0
            pids = _tree(self.pid)
            for pid in pids:
                try:
                    rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
                    fds += len(os.listdir(f"/proc/{pid}/fd"))
                except OSError:
                    continue
            self.rss, self.fds, self.procs = max(self.rss, rss), max(self.fds, fds), max(self.procs, len(pids))


def run_command(args: list[str], log: Path, *, env: dict[str, str], kill_after: float | None = None) -> dict[str, Any]:
    """Run `args` with its output appended to `log`; SIGKILL its whole process group after `kill_after` seconds."""
    with log.open("ab") as sink:
        sink.write(f"\n$ {' '.join(args)}\n".encode())
        sink.flush()
        start = time.perf_counter()
        process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        monitor = Monitor(process.pid)
        monitor.start()
        killed = False
        try:
            process.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            killed = True
        monitor.done.set()
        monitor.join()
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "exit": process.returncode,
        "killed": killed,
        "peak_rss_mb": round(monitor.rss / 2**20),
        "peak_open_files": monitor.fds,
        "processes": monitor.procs,
    }


def disk_mb(path: Path) -> float:
    """Bytes on disk (allocated blocks) under `path`, in MB."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                pass
    return round(total / 1e6, 1)


# ----------------------------------------------------------------------------------------------- vocabularies


def _words(key: str, count: int) -> list[str]:
    """`count` made-up two-word names, a function of `key` only."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "pa", "qu", "do"]
    names = []
    for i in range(count):
        digest = hashlib.sha256(f"{key}/{i}".encode()).digest()
        word = "".join(syllables[b % len(syllables)] for b in digest[:3])
        other = "".join(syllables[b % len(syllables)] for b in digest[3:6])
        names.append(f"{word} {other}")
    return names


def _reply(prompt: Any, seen: int) -> tuple[int, bytes, dict[str, str], float]:
    """A deterministic answer to any list request: as many made-up names as the prompt asks for (default 20)."""
    from tests.fakes.openai_server import chat_body

    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    asked = re.findall(r"\b(\d{1,4})\b", text)
    count = min(max((int(n) for n in asked if 0 < int(n) <= 1000), default=20), 1000)
    return 200, chat_body(json.dumps(_words(text, count))), {}, 0.0


def build_vocabularies(work: Path, *, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """The config's `ref` vocabularies, built by the real commands against the loopback stand-in endpoint."""
    from tests.fakes.openai_server import FakeOpenAIServer

    vocab = ["--vocab-dir", str(work / "vocab")]
    # The oracle is the benchmark's own OOD class names: a user gives them as a file; these are made up.
    labels = work.parent / "oracle-labels.txt"
    labels.write_text("\n".join(_words("oracle", 64)) + "\n", encoding="utf-8")
    server = FakeOpenAIServer(_reply).start()
    llm = ["--llm-base-url", server.url, "--llm-model", "stand-in", "--llm-api-key", "rehearsal"]
    steps = {
        "siblings": ["zeroshot", "vocab", "build", "siblings", *llm, *vocab],
        "eoe": [
            "zeroshot",
            "vocab",
            "build",
            "eoe",
            "--task",
            "fine_grained",
            "--super-class",
            "object",
            "--name",
            "eoe",
            *llm,
            *vocab,
        ],
        "eoe-far": ["zeroshot", "vocab", "build", "eoe", "--task", "far", "--name", "eoe-far", *llm, *vocab],
        "eoe-near": ["zeroshot", "vocab", "build", "eoe", "--task", "near", "--name", "eoe-near", *llm, *vocab],
        "oracle": ["zeroshot", "vocab", "build", "oracle", "--labels", str(labels), *vocab],
    }
    out = {}
    try:
        for name, args in steps.items():
            out[name] = run_command([*oodbench(), *args], log, env=env)
            if out[name]["exit"] != 0:
                raise SystemExit(f"vocabulary {name}: exit {out[name]['exit']} (see {log})")
    finally:
        server.close()
    return out


# ----------------------------------------------------------------------------------------------- runs


def run_args(root: Path, work: Path, models: str) -> list[str]:
    """`oodbench run` on the Fi config with the rehearsal root's paths and the chosen models; nothing else set."""
    paths = {"imagenet": "imagenet", "ood": "ood", "fi": "fi-imagenet-1k", "lists": "imagelists"}
    args = [*oodbench(), "run", str(CONFIG), "--out", str(work), "--no-progress", "--device", "cpu"]
    args += [f"--set=paths.{key}={root / value}" for key, value in paths.items()]
    return [*args, f"--set={models}"]


def models_override(ids: list[str]) -> str:
    """`models=[...]`: the config's own tables of these models, as they stand in the file."""
    from tests.runner.test_rehearsal import models_override as override

    return override(tuple(ids))


def one_run(
    name: str,
    work: Path,
    *,
    root: Path,
    models: list[str],
    env: dict[str, str],
    kills: dict[str, int],
    rng: Any,
    reference: Any,
    done: dict[str, Any] | None = None,
    save: Any = None,
    expect: dict[str, float] | None = None,
    until: str = STAGES[-1],
) -> dict[str, Any]:
    """All stages of one run; where `kills[stage]` > 0, SIGKILL the stage that many times at random moments (drawn
    over run A's time for the stage, read from `reference()` when the stage starts, else `expect` or 60 s)."""
    log = work.parent / f"{name}.log"
    base = run_args(root, work, models_override(models))
    raw = tomllib.loads(CONFIG.read_text(encoding="utf-8"))
    vlm = [m["id"] for m in raw["models"] if m["id"] in models and m["kind"] in ("open_clip", "hf_clip")]
    record: dict[str, Any] = done if done is not None else {"stages": {}}
    expect = expect or {}
    for stage in STAGES[: STAGES.index(until) + 1]:
        if stage in record["stages"]:
            continue  # finished in an earlier invocation of this script: its figures stand
        if stage == "score" and vlm:
            record["vocabularies"] = build_vocabularies(work, log=log, env=env)
        attempts = []
        for _ in range(kills.get(stage, 0)):
            uninterrupted = reference()  # run A's record as it stands now (it may be running beside this one)
            known = uninterrupted and stage in uninterrupted["stages"]
            expected = uninterrupted["stages"][stage]["attempts"][-1]["seconds"] if known else expect.get(stage, 60.0)
            moment = rng.uniform(0.1, 0.8) * expected
            attempt = run_command([*base, "--only", stage], log, env=env, kill_after=moment)
            attempt["kill_at"] = round(moment, 1)
            attempts.append(attempt)
            print(f"{name} {stage}: killed={attempt['killed']} after {attempt['seconds']} s", flush=True)
        final = run_command([*base, "--only", stage], log, env=env)
        attempts.append(final)
        print(f"{name} {stage}: exit {final['exit']} in {final['seconds']} s", flush=True)
        if final["exit"] != 0:
            raise SystemExit(f"{name}: stage {stage} failed (exit {final['exit']}); see {log}")
        record["stages"][stage] = {"attempts": attempts, "disk_mb": disk_mb(work)}
        if save is not None:
            save(record)
    return record


def digests(work: Path) -> dict[str, str]:
    """SHA-256 of every regular file under `work`, by relative path."""
    out = {}
    for folder, _, files in os.walk(work):
        for file in files:
            path = Path(folder) / file
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(work))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Files only in one run, and files whose bytes differ, by kind."""
    da, db = digests(a), digests(b)
    differ = sorted(p for p in da.keys() & db.keys() if da[p] != db[p])
    return {
        "files": len(da),
        "only_a": sorted(da.keys() - db.keys()),
        "only_b": sorted(db.keys() - da.keys()),
        "differ": differ,
        "identical": len(da.keys() & db.keys()) - len(differ),
    }


# ----------------------------------------------------------------------------------------------- measurements


def decode_share(root: Path, work: Path, model: str) -> dict[str, Any]:
    """Decoding alone (one process) against the extraction's time per image for the same files."""
    from oodbench.extract.datasets import load_rgb

    files = sorted((root / "imagenet" / "val").rglob("*.JPEG"))[:4000]
    start = time.perf_counter()
    decoded = 0
    for path in files:
        try:
            load_rgb(path)
            decoded += 1
        except Exception:  # noqa: BLE001 - the rehearsal's defective files
            pass
    per_image = (time.perf_counter() - start) / max(decoded, 1)
    return {"decode_ms": round(per_image * 1e3, 3), "decoded": decoded}


def report_open(html: Path, rounds: int = 3) -> dict[str, Any]:
    """Milliseconds from navigation to the load event of `html` in headless Chromium (Playwright), best and median."""
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for _ in range(rounds):
            page = browser.new_page()
            page.goto(html.as_uri(), wait_until="load", timeout=120_000)
            timing = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
            entry = json.loads(timing)
            times.append(entry["loadEventEnd"] - entry["startTime"])
            page.close()
        browser.close()
    return {
        "load_ms": [round(t) for t in times],
        "median_ms": round(statistics.median(times)),
        "bytes": html.stat().st_size,
    }


def main() -> None:
    """Parse the arguments and run the rehearsal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lists", type=Path, required=True, help="the official image lists")
    parser.add_argument("--work", type=Path, required=True, help="folder for the root, runs A and B, results")
    parser.add_argument("--scale", type=float, default=0.1, help="share of the fit set (test sets: full size)")
    parser.add_argument("--fraction", type=float, default=None, help="share of every test set (default: all)")
    parser.add_argument("--models", default="ResNet50,CLIP-B-16", help="config model ids, comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--extract-kills", type=int, default=2, help="kills in the extraction stage of run B")
    parser.add_argument("--runs", default="A,B", help="which runs to do (A: uninterrupted, B: killed)")
    parser.add_argument("--until", choices=STAGES, default=STAGES[-1], help="stop after this stage (resume later)")
    parser.add_argument(
        "--expect",
        default="",
        help="STAGE=SECONDS,...: a stage's expected time where run A has not recorded it (B's kill moments)",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    # one results file per set of runs, so A and B may run at once, each in its own process
    results_path = args.work / f"rehearsal-results-{args.runs.replace(',', '')}.json"
    other = next(
        (p for p in (args.work / "rehearsal-results-A.json", args.work / "rehearsal-results.json") if p.exists()),
        args.work / "rehearsal-results-A.json",
    )
    expect = {k: float(v) for k, v in (item.split("=") for item in args.expect.split(",") if item)}
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    env = {**os.environ, "OODBENCH_STAND_INS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    root = args.work / "root"
    if "make_root" not in results and not ("A" not in args.runs and (root / "rehearsal.json").exists()):
        make = [*oodbench(), "rehearse", "make-root", str(root), "--lists", str(args.lists), "--scale", str(args.scale)]
        if args.fraction:
            make += ["--fraction", str(args.fraction)]
        results["make_root"] = run_command(make, args.work / "make-root.log", env=env)
        results["check"] = run_command(
            [*oodbench(), "datasets", "check", "--root", str(root / "ood"), "--lists", str(root / "imagelists")],
            args.work / "check.log",
            env=env,
        )
    models = args.models.split(",")
    rng = random.Random(args.seed)
    for name in args.runs.split(","):
        kills = {} if name == "A" else {"extract": args.extract_kills, **{s: 1 for s in STAGES[1:]}}

        def save(record: dict[str, Any], name: str = name) -> None:
            results[name] = record
            results_path.write_text(json.dumps(results, indent=1))

        def reference(name: str = name) -> dict[str, Any] | None:
            if name == "A":
                return None
            if "A" in results:
                return results["A"]
            return json.loads(other.read_text()).get("A") if other.exists() else None

        done = results.get(name)
        save(
            one_run(
                name,
                args.work / name,
                root=root,
                models=models,
                env=env,
                kills=kills,
                rng=rng,
                reference=reference,
                done=done,
                save=save,
                expect=expect,
                until=args.until,
            )
        )
    finished_a = results.get("A") or (json.loads(other.read_text()).get("A") if other.exists() else None)
    if finished_a and "B" in results:  # run A may have been recorded by its own invocation
        results["compare"] = compare(args.work / "A", args.work / "B")
        results["decode"] = decode_share(root, args.work / "A", models[0])
        htmls = sorted((args.work / "A").rglob("report.html"))
        if htmls:
            results["report_open"] = report_open(htmls[0])
    results_path.write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if k in ("compare", "decode", "report_open")}, indent=1)[:4000])


if __name__ == "__main__":
    main()
