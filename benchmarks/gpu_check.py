"""`make gpu-check`: everything in the kit that only a CUDA GPU can exercise, in one report.

On a machine with a CUDA GPU this runs, part by part (``--part``, or ``PART=`` to make):

- ``tests``: the tests marked ``cuda`` (``tests.conftest.requires_cuda``), under pytest;
- ``labs``: every solution notebook under nbval at the ``full`` preset
  (``PERFLAB_PRESET=full``); ``--labs 03 05`` runs some only;
- ``benchmarks``: the benchmark scripts (each prints its ratios side by side);
- ``figures``: the GPU figures: ResNet-18 step time from CUDA events (median, 95 % CI,
  samples/s), fp16 + GradScaler loss parity against fp32, pinned vs pageable host-to-
  device copy bandwidth, NCCL process-group start-up on 1 GPU, MFU against the
  datasheet peak (its source printed), and, where two or more GPUs exist, Lab 06's
  all-reduce benchmark (the reference ``allreduce_student.py`` of
  ``solutions/06_ddp_overlap.ipynb``) on NCCL with ``NCCL_ALGO`` Ring vs Tree and
  ``NCCL_PROTO`` Simple vs LL128 (nccl-tests' algbw and busbw per size);

and writes ``<results>/gpu-check/report.json`` and ``report.md`` (atomically; a part run
later replaces only its own section, so the parts can run on separate borrowed machines or
calls). Each item has a time limit (``--item-timeout-s``, default 540 s) so one part stays
within a 10-minute window; split the labs with ``--labs`` when a part would not.

On a machine without a CUDA GPU it says so, with the measured reason, and exits 0.

Usage: python benchmarks/gpu_check.py [--part all|tests|labs|benchmarks|figures]
       [--labs 01 02 ...] [--item-timeout-s 540] [--dry-run]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tests", "labs", "benchmarks", "figures")
#: The benchmark scripts run by the ``benchmarks`` part (the recorders of shipped data
#: and the grading benchmark, which needs no GPU, are left out).
BENCHMARKS = ("data_and_amp.py", "checkpointing_and_compile.py", "harness_overhead.py",
              "ddp_overlap.py", "trace_vs_hta.py", "ladder_search.py")


def no_gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else the measured reason (torch's own answers)."""
    import torch
    if torch.cuda.is_available():
        return None
    return (f"no CUDA GPU here: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"torch.version.cuda = {torch.version.cuda}, "
            f"CUDA_VISIBLE_DEVICES = {os.environ.get('CUDA_VISIBLE_DEVICES')!r})")


def _run_item(name: str, cmd: list[str], env: dict[str, str], timeout_s: float) -> dict:
    """Run one command; its outcome, wall time and the tail of its output."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout_s)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
               else (e.stdout or "")) + f"\n[timed out after {timeout_s:.0f} s]"
    wall = time.perf_counter() - t0
    status = "passed" if rc == 0 else ("timed out" if rc == 124 else "failed")
    print(f"  {name}: {status} in {wall:.0f} s", flush=True)
    return {"name": name, "status": status, "rc": rc, "wall_s": round(wall, 1),
            "command": " ".join(cmd), "tail": out[-3000:]}


def part_commands(part: str, labs: list[str] | None = None) -> list[tuple[str, list[str], dict]]:
    """``(name, argv, extra environment)`` of each item of ``part`` ("figures" has none:
    it runs in this process)."""
    py = sys.executable
    if part == "tests":
        return [("tests marked cuda", [py, "-m", "pytest", "-q", "-rs", "-m", "cuda",
                                       "-p", "no:cacheprovider", "tests"], {})]
    if part == "labs":
        books = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
        if labs:
            books = [b for b in books if b.name[:2] in labs]
        return [(b.stem, [py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(b.relative_to(ROOT))], {"PERFLAB_PRESET": "full"})
                for b in books]
    if part == "benchmarks":
        return [(b, [py, str(Path("benchmarks") / b)], {}) for b in BENCHMARKS]
    return []


def gpu_figures() -> dict:
    """The GPU figures, measured now on ``cuda:0`` (see the module docstring).

    Returns:
        ``{figure: {value fields..., "how": text}}``; a figure that failed has
        ``{"error": message}`` instead, and the others still run.
    """
    import torch

    from perflab import RunConfig, run
    from perflab.analysis.amp import loss_parity
    from perflab.analysis.flops import count_flops, mfu_pct
    from perflab.analysis.peak import peak_flops

    out: dict = {"device": torch.cuda.get_device_name(0)}

    def figure(name, fn):
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as e:  # one figure failing must not lose the others
            out[name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"  {name}: {out[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)

    base = dict(device="cuda", image_size=224, batch_size=64, steps=30, warmup_steps=5, lr=0.01)
    runs: dict = {}

    def step_time():
        r = runs["fp32"] = run(RunConfig(label="gpu-check fp32", **base), progress=False,
                               save=False)
        lo, hi = r.step.ci95_median
        return {"median_ms": r.step.median * 1e3, "ci95_ms": [lo * 1e3, hi * 1e3],
                "samples_per_s": r.samples_per_s,
                "how": "perflab.run, ResNet-18 224 px batch 64, CUDA events per phase"}

    def fp16_parity():
        r16 = run(RunConfig(label="gpu-check fp16", amp="fp16", **base), progress=False,
                  save=False)
        p = loss_parity(runs["fp32"], r16)
        return {"first_step_abs": p.first_step_abs, "max_abs": p.max_abs,
                "mean_abs": p.mean_abs, "fp16_speedup": runs["fp32"].step.median / r16.step.median,
                "how": "autocast fp16 + GradScaler vs fp32, same seed and batches"}

    def copy_bandwidth():
        n = 256 * 2**20
        res = {}
        for kind, host in (("pageable", torch.empty(n, dtype=torch.uint8)),
                           ("pinned", torch.empty(n, dtype=torch.uint8, pin_memory=True))):
            dev = torch.empty(n, dtype=torch.uint8, device="cuda")
            dev.copy_(host, non_blocking=True)
            times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dev.copy_(host, non_blocking=True)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            res[f"{kind}_gb_per_s"] = n / sorted(times)[len(times) // 2] / 1e9
        res["how"] = "256 MiB host-to-device copy_, median of 5, CUDA events"
        return res

    def nccl_init():
        import torch.distributed as dist
        if not dist.is_nccl_available():
            return {"error": "dist.is_nccl_available() is False"}
        t0 = time.perf_counter()
        store = dist.HashStore()
        dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        t_init = time.perf_counter() - t0
        x = torch.ones(1 << 20, device="cuda")
        t1 = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        t_first = time.perf_counter() - t1
        dist.destroy_process_group()
        return {"init_s": t_init, "first_all_reduce_s": t_first,
                "how": "init_process_group('nccl', world_size=1) then a 4 MiB all_reduce"}

    def datasheet_mfu():
        r = runs["fp32"]
        flops = count_flops(r.config).model_flops
        res = {}
        for dt in ("fp32", "tf32"):
            pk = peak_flops("cuda", dt, measure_unknown=False)
            res[f"mfu_pct_vs_{dt}"] = mfu_pct(flops, r.step.median, pk.flops_per_s)
            res[f"peak_source_{dt}"] = pk.source
        res["how"] = "count_flops (FlopCounterMode) model FLOPs / median step / datasheet peak"
        return res

    def nccl_algorithms():
        n = torch.cuda.device_count()
        if n < 2:
            return {"skipped": f"comparing NCCL algorithms needs 2 GPUs; torch.cuda.device_count() "
                               f"is {n}"}
        import importlib
        import tempfile

        import nbformat

        from perflab.distributed import launch_fn
        nb = nbformat.read(ROOT / "solutions" / "06_ddp_overlap.ipynb", 4)
        src = next(c.source for c in nb.cells
                   if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "allreduce_file")
        folder = tempfile.mkdtemp(prefix="gpu-check-")
        Path(folder, "gpu_check_allreduce.py").write_text(src.split("\n", 1)[1])
        sys.path.insert(0, folder)
        bench = importlib.import_module("gpu_check_allreduce").allreduce_benchmark
        sizes = [2 ** k for k in range(10, 29, 3)]
        res, saved = {"ranks": n, "sizes_bytes": sizes}, {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_PROTO")}
        try:
            for algo in ("Ring", "Tree"):
                for proto in ("Simple", "LL128"):
                    os.environ.update(NCCL_ALGO=algo, NCCL_PROTO=proto)   # read by NCCL at init
                    rows = launch_fn(bench, n, args=(sizes, 20, 5), device="cuda", timeout_s=300)
                    slowest = [max(r[i][1] for r in rows) for i in range(len(sizes))]
                    res[f"{algo}/{proto}"] = {
                        "time_us": [t * 1e6 for t in slowest],
                        "busbw_GBps": [s / t * 2 * (n - 1) / n / 1e9 for s, t in zip(sizes, slowest)]}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        res["how"] = ("Lab 06's reference allreduce_benchmark (warm-up 5, barrier, 20 timed, "
                      "synchronize), the slowest rank's time; busbw = size / time x 2(n-1)/n")
        return res

    figure("step_time", step_time)
    if "fp32" in runs:
        figure("fp16_gradscaler_parity", fp16_parity)
        figure("datasheet_mfu", datasheet_mfu)
    figure("pinned_copy_bandwidth", copy_bandwidth)
    figure("nccl_1gpu_init", nccl_init)
    figure("nccl_allreduce_algorithms", nccl_algorithms)
    return out


def write_report(part: str, section: dict | list, folder: Path) -> Path:
    """Merge ``section`` into ``folder/report.json`` under ``part`` and rewrite
    ``report.md``; both written atomically. Returns the JSON path."""
    from perflab.core.storage import write_atomic
    path = folder / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        report = {"format": 1, "parts": {}}
    report["parts"][part] = {"at": datetime.now(timezone.utc).isoformat(), "result": section}
    write_atomic(path, json.dumps(report, indent=1, default=str) + "\n")
    write_atomic(folder / "report.md", render_markdown(report))
    return path


def render_markdown(report: dict) -> str:
    """The report as a Markdown page: one table per command part, the figures as a list."""
    lines = ["# perflab gpu-check", ""]
    for part, sec in report["parts"].items():
        lines += [f"## {part} ({sec['at']})", ""]
        res = sec["result"]
        if isinstance(res, list):
            lines += ["| item | status | time (s) |", "|---|---|---|"]
            lines += [f"| {r['name']} | {r['status']} | {r['wall_s']:.0f} |" for r in res]
        else:
            lines += [f"- **{k}**: {v}" for k, v in res.items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", *PARTS), default="all")
    ap.add_argument("--labs", nargs="*", help="two-digit lab numbers (labs part only)")
    ap.add_argument("--item-timeout-s", type=float, default=540.0)
    ap.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = ap.parse_args(argv)
    parts = PARTS if args.part == "all" else (args.part,)
    reason = no_gpu_reason()
    if args.dry_run:
        for part in parts:
            items = part_commands(part, args.labs) or [("GPU figures, in process", [], {})]
            for name, cmd, env in items:
                print(f"{part}: {name}: {' '.join(f'{k}={v}' for k, v in env.items())} "
                      f"{' '.join(cmd)}".rstrip())
        return 0
    if reason:
        print(f"gpu-check: {reason}; nothing to check on this machine.")
        return 0
    from perflab.core.paths import default_results_dir
    folder = default_results_dir() / "gpu-check"
    failed = False
    for part in parts:
        print(f"== {part}", flush=True)
        if part == "figures":
            section: dict | list = gpu_figures()
        else:
            section = [_run_item(name, cmd, {**os.environ, **env}, args.item_timeout_s)
                       for name, cmd, env in part_commands(part, args.labs)]
            failed |= any(r["status"] != "passed" for r in section)
        print(f"   report: {write_report(part, section, folder)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
