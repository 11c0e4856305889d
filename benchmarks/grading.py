"""How long does grading one submission take, and what does ``--jobs N`` buy?

Grades ``--copies`` copies of a lab's reference solution (the answers of a student who
solved everything) twice: one sandbox at a time, then ``--jobs`` at a time. Prints the
median seconds per graded submission (each sandbox's own wall time), the batch's
seconds per submission, the speed-up of ``--jobs`` over one at a time, and checks that
every copy got full marks both times (grading must not depend on machine load).

Target (issues 12, 25 and 33): one submission of every lab in <= 30 s median, its
sandbox alone on a quiet 2-core machine (``--lab all --copies 1 --jobs 1``). With
``--jobs 2`` two sandboxes share the cores: each takes longer, the batch less per
submission.

Each submission is graded by its grading process (the points) and, with
``--notebook-run always`` (or on a failure), its notebook's run under nbval (the
instructor's log); the table gives both the total and the grading process's seconds.

Usage: python benchmarks/grading.py [--lab 01] [--copies 4] [--jobs 2]
                                    [--notebook-run always|on-failure|never]
       python benchmarks/grading.py --lab all --copies 1 --jobs 1   # the goal, per lab
       python benchmarks/grading.py --lab synthetic     # the tests' 4-point lab
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from perflab.course.grading import grade_submissions
from perflab.course.submission import Limits
from perflab.course.sandbox import sandbox_status

ROOT = Path(__file__).resolve().parents[1]


def _reference(lab: str, folder: Path) -> Path:
    if lab == "synthetic":
        sys.path.insert(0, str(ROOT / "tests"))
        from test_grading import reference_nb  # the tests' synthetic lab

        path = folder / "09_synthetic.ipynb"
        nbformat.write(reference_nb(), str(path))
        return path
    (sol,) = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
    return Path(shutil.copy(sol, folder / sol.name))


def batch(ref: Path, copies: int, jobs: int, tmp: Path, notebook_run: str = "on-failure"
          ) -> tuple[float, list[float], bool, list[float]]:
    """(batch wall seconds, per-notebook wall seconds, every copy got full marks,
    per-notebook seconds of the grading process alone)."""
    subs = Path(tempfile.mkdtemp(dir=tmp, prefix=f"subs-{jobs}-"))   # one per batch
    for i in range(copies):
        (subs / f"student{i:02d}").mkdir(parents=True)
        shutil.copy(ref, subs / f"student{i:02d}" / ref.name)
    start = time.monotonic()
    grades = grade_submissions(subs, ref.parent, jobs=jobs, notebook_run=notebook_run,
                               limits=Limits(cell_timeout_s=600, wall_timeout_s=1800))
    wall = time.monotonic() - start
    full = all(g.points == g.max_points and not g.error for g in grades)
    for g in grades:
        if g.points != g.max_points:
            print(f"  {g.student}: {g.points:g}/{g.max_points:g} "
                  + "; ".join(f"{c.grade_id}: {c.message[:200]}" for c in g.checks
                              if c.status != "passed"))
    return wall, [g.wall_s for g in grades], full, [g.process_s for g in grades]


def per_lab(copies: int, jobs: int, notebook_run: str = "on-failure") -> int:
    """Every lab: ``copies`` reference submissions graded ``jobs`` at a time; one row per
    lab with the median seconds per submission (its sandbox's wall time) and the batch's
    seconds per submission, against the 30 s goal."""
    labs = sorted(p.name[:2] for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="perflab-bench-") as tmp:
        for lab in labs:
            folder = Path(tmp) / lab
            (folder / "ref").mkdir(parents=True)
            ref = _reference(lab, folder / "ref")
            wall, each, full, process = batch(ref, copies, jobs, folder, notebook_run)
            ok &= full
            med, proc = statistics.median(each), statistics.median(process)
            rows.append((lab, med, proc, wall / copies, full))
            print(f"lab {lab}: median {med:.1f} s per submission ({proc:.1f} s the grading "
                  f"process), batch {wall / copies:.1f} s per submission, full marks: {full}",
                  flush=True)
    print(f"\n{copies} submissions per lab, --jobs {jobs}"
          + f", --notebook-run {notebook_run}" + " (goal: <= 30 s median)")
    print(f"{'lab':<5}{'median s':>10}{'process s':>11}{'batch s/sub':>13}  goal  full marks")
    for lab, med, proc, per, full in rows:
        print(f"{lab:<5}{med:>10.1f}{proc:>11.1f}{per:>13.1f}  {'ok' if med <= 30 else 'OVER':<4}"
              f"  {full}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lab", default="01",
                   help="lab number, 'all' (a table per lab) or 'synthetic' (default 01)")
    p.add_argument("--copies", type=int, default=4, help="submissions per batch (default 4)")
    p.add_argument("--jobs", type=int, default=2, help="parallel sandboxes (default 2)")
    p.add_argument("--notebook-run", choices=["always", "on-failure", "never"],
                   default="on-failure",
                   help="when the notebook also runs under nbval for the log (default "
                        "on-failure: a reference solution's copies never need it)")
    args = p.parse_args(argv)
    ok, why = sandbox_status()
    print(f"sandbox: {'bubblewrap' if ok else 'NONE (' + why + ')'}")
    if args.lab == "all":
        return per_lab(args.copies, args.jobs, args.notebook_run)
    with tempfile.TemporaryDirectory(prefix="perflab-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "ref").mkdir()
        ref = _reference(args.lab, tmp / "ref")
        serial_wall, serial, full1, _ = batch(ref, args.copies, 1, tmp, args.notebook_run)
        par_wall, par, full2, _ = batch(ref, args.copies, args.jobs, tmp, args.notebook_run)
    print(f"lab {args.lab}, {args.copies} submissions")
    print(f"  --jobs 1: median {statistics.median(serial):.1f} s per graded submission "
          f"(min {min(serial):.1f}, max {max(serial):.1f}); batch {serial_wall:.1f} s = "
          f"{serial_wall / args.copies:.1f} s per submission")
    print(f"  --jobs {args.jobs}: median {statistics.median(par):.1f} s per sandbox; batch "
          f"{par_wall:.1f} s = {par_wall / args.copies:.1f} s per submission")
    print(f"  speed-up of --jobs {args.jobs}: {serial_wall / par_wall:.2f}x")
    print(f"  full marks on every copy, both batches: {full1 and full2}")
    return 0 if full1 and full2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
