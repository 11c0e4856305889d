"""``perflab course grade`` and ``perflab course merge``: their arguments and what they
do (see docs/INSTRUCTORS.md).

Kept apart from :mod:`perflab.course.grading` so that building the ``perflab`` parser
imports nothing heavy (nbformat, nbval): ``perflab.cli`` calls
:func:`add_grade_arguments` on its ``grade`` subparser and sets ``fn=grade_command``, and
:func:`add_merge_arguments` / :func:`merge_command` for ``merge``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["add_grade_arguments", "grade_command", "add_merge_arguments",
           "merge_command"]


def _lab_numbers(text: str) -> list[str]:
    try:
        return [f"{int(t):02d}" for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lab numbers like 01,02 expected, got {text!r}")


def _memory_gib(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(t) for t in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"K/N expected (this machine's slice K of N, counted from 0, e.g. 0/4), got "
            f"{text!r}") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(
            f"K/N with 0 <= K < N expected (slices are numbered from 0: 0/{max(n, 1)} to "
            f"{max(n, 1) - 1}/{max(n, 1)}), got {text!r}")
    return k, n


def add_grade_arguments(parser) -> None:
    """Add ``perflab course grade``'s arguments to an argparse parser."""
    p = parser
    p.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    p.add_argument("--reference", default="solutions", type=Path,
                   help="folder of reference notebooks NN_*.ipynb (default: solutions)")
    p.add_argument("--out", default="scores.csv", type=Path, help="score table (CSV)")
    p.add_argument("--feedback", default=None, type=Path,
                   help="folder for students' <student>.md (default: 'feedback' beside --out)")
    p.add_argument("--instructor-dir", default=None, type=Path,
                   help="instructor-only folder: logs, hidden-case messages, review findings, written "
                        "answers (default: 'instructor' beside --out)")
    p.add_argument("--labs", default=None, type=_lab_numbers, metavar="NN[,NN...]",
                   help="comma-separated lab numbers to grade (default: all submitted)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    p.add_argument("--resume", action="store_true",
                   help="keep the students already in --out and grade only the others")
    p.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default="auto",
                   help="bwrap: require bubblewrap; auto: fall back loudly; none: no sandbox")
    p.add_argument("--cell-timeout", type=float, default=600.0,
                   help="per-cell timeout in seconds (default 600)")
    p.add_argument("--wall-timeout", type=float, default=1800.0,
                   help="wall-clock limit per notebook in seconds (default 1800)")
    p.add_argument("--memory-gib", type=_memory_gib, default=8.0, metavar="GIB|none",
                   help="address-space limit per process in GiB (default 8; 'none' on a GPU)")
    p.add_argument("--nproc", type=int, default=256,
                   help="processes and threads per submission (default 256)")
    p.add_argument("--disk-gib", type=float, default=1.0,
                   help="size of each writable file system in the sandbox (scratch, /tmp, "
                        "/dev/shm), GiB (default 1)")
    p.add_argument("--total-memory-gib", type=_memory_gib, default=6.0, metavar="GIB|none",
                   help="memory of all a notebook's processes together in GiB, the run "
                        "stopped above it (a cgroup where the grader can make one, else a "
                        "watchdog on their resident memory; default 6; 'none': no cap)")
    p.add_argument("--output-mib", type=float, default=64.0,
                   help="output a notebook's run may write (its log) and its kernel may "
                        "send, MiB; the run is stopped above it (default 64)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the hidden cases (default: a fresh one, printed and saved "
                        "in the instructor folder; pass it to draw the same cases again)")
    p.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                   help="grade only slice K (0 to N-1) of N slices of the students (sorted "
                        "by id, every N-th); needs --seed; join the slices with `perflab "
                        "course merge`")
    p.add_argument("--notebook-run", choices=["always", "on-failure", "never"],
                   default="on-failure",
                   help="when each notebook also runs under nbval for the instructor's log of "
                        "what its cells print: always, only when the grading process left "
                        "points unearned (default), or never; no point comes from it")
    p.add_argument("--sanitize-with", default=None, type=Path, help=argparse.SUPPRESS)


def add_merge_arguments(parser) -> None:
    """Add ``perflab course merge``'s arguments to an argparse parser."""
    parser.add_argument("outputs", nargs="+", type=Path, metavar="OUT",
                        help="each shard's score table (or its folder, or its "
                             "*.manifest.json)")
    parser.add_argument("--out", default="scores.csv", type=Path,
                        help="the merged score table (default: scores.csv); its manifest "
                             "is written beside it")


def merge_command(args) -> int:
    """Run ``perflab course merge`` from parsed arguments; returns 0.

    Raises:
        ValueError, FileNotFoundError: see :func:`perflab.course.report.merge_scores`
            (overlapping, missing or unfinished slices, a seed or column mismatch).
    """
    from perflab.course.report import manifest_path, merge_scores

    out = merge_scores(args.outputs, args.out)
    n = len(json.loads(manifest_path(out).read_text(encoding="utf-8"))["students"])
    print(f"wrote {out} ({n} students from {len(args.outputs)} shard outputs) and "
          f"{manifest_path(out)}")
    return 0


def grade_command(args) -> int:
    """Run ``perflab course grade`` from parsed arguments; returns the exit status.

    Raises:
        ValueError: a limit is NaN, infinite or <= 0, ``--jobs`` < 1, ``--sandbox bwrap``
            where bubblewrap does not work, ``--shard`` without ``--seed``, or
            ``--resume`` with a score table written for other labs, another seed or
            another shard (its manifest says which; all before any grading starts).
        FileNotFoundError: see :func:`perflab.course.grading.grade_submissions`.
    """
    import nbformat

    from perflab.course.grading import (Limits, autograded, grade_submissions,
                                        reference_notebooks, shard_slice, student_folders,
                                        submitted_labs)
    from perflab.course.report import (ScoreTable, manifest_path, read_manifest,
                                       write_answers, write_feedback, write_manifest)

    limits = Limits(cell_timeout_s=args.cell_timeout, wall_timeout_s=args.wall_timeout,
                    memory_gib=args.memory_gib, nproc=args.nproc,
                    disk_gib=getattr(args, "disk_gib", 1.0),
                    total_memory_gib=getattr(args, "total_memory_gib", 6.0),
                    output_mib=getattr(args, "output_mib", 64.0))
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    shard = getattr(args, "shard", None)
    seed = getattr(args, "seed", None)
    out = Path(args.out)
    if args.resume and manifest_path(out).exists():  # continue as that run began
        before = read_manifest(manifest_path(out))
        if seed is not None and seed != before["seed"]:
            raise ValueError(f"--resume: {out} was graded with --seed {before['seed']} (field "
                             f"'seed' of {manifest_path(out)}); pass that seed, or drop "
                             "--resume to grade everyone again")
        if list(shard or (0, 1)) != before["shard"]:
            k, n = before["shard"]
            raise ValueError(f"--resume: {out} holds slice {k}/{n} (field 'shard' of "
                             f"{manifest_path(out)}); pass --shard {k}/{n}, or another --out")
        seed = before["seed"]
    if shard is not None and seed is None:
        raise ValueError(f"--shard {shard[0]}/{shard[1]} needs --seed: every shard must draw "
                         "the same hidden cases; pick one number (e.g. --seed 20261127) and "
                         "pass it to every shard")
    from perflab.course.sandbox import sandbox_status

    if args.sandbox == "bwrap" and not sandbox_status()[0]:
        raise ValueError(f"--sandbox bwrap: {sandbox_status()[1]}")
    feedback = Path(args.feedback or out.parent / "feedback")
    instructor = Path(args.instructor_dir or out.parent / "instructor")
    refs = reference_notebooks(Path(args.reference))
    subs = Path(args.submissions)
    if not subs.is_dir():
        raise FileNotFoundError(f"no submissions folder {subs}")
    folders = student_folders(subs)  # names and lstat only: nothing opened or followed
    labs = args.labs or sorted(submitted_labs(folders) & set(refs))
    missing = [k for k in labs if k not in refs]
    if missing:
        raise ValueError(f"no reference notebook for lab(s) {missing} in {args.reference}; "
                         f"labs there: {sorted(refs)}")
    columns = {lab: list(autograded(nbformat.read(str(refs[lab]), as_version=4))) for lab in labs}
    table = ScoreTable(out, columns, resume=args.resume)
    class_ids = [f.id for f in folders]
    mine = shard_slice(class_ids, shard or (0, 1))
    feedback.mkdir(parents=True, exist_ok=True)  # exist before the sandboxes start, to
    instructor.mkdir(parents=True, exist_ok=True)  # be hidden from every one of them

    def student_done(student: str, grades: list) -> None:
        table.add(student, grades)
        write_feedback(grades, feedback, instructor)

    import secrets

    seed = seed if seed is not None else secrets.randbits(48)
    (instructor / "seed.txt").write_text(f"{seed}\n")

    def manifest(complete: bool) -> None:
        write_manifest(out, seed=seed, shard=shard or (0, 1), header=table.header,
                       class_ids=class_ids, students=mine, complete=complete)

    manifest(complete=False)  # a merge refuses a shard that has not finished
    print(limits.describe())
    grades = grade_submissions(subs, args.reference, limits=limits, labs=labs, seed=seed,
                               progress=print, jobs=args.jobs, sandbox=args.sandbox,
                               skip=table.students(), on_student=student_done, shard=shard,
                               notebook_run=getattr(args, "notebook_run", "on-failure"),
                               hide=(out.resolve().parent, out.resolve(),
                                     feedback.resolve(), instructor.resolve()))
    _review_similarity(grades, refs, Path(args.reference), instructor, table)
    table.flush()  # the table exists even when every student was skipped
    manifest(complete=True)
    write_answers(grades, instructor / "answers")
    errored = sum(1 for g in grades if g.error)
    review = sum(1 for g in grades if g.flags)
    graded = len(grades) - errored
    print(f"\nwrote {out} ({len(table.students())} students), feedback in {feedback}/, "
          f"instructor files in {instructor}/")
    print(f"graded {graded}, errored {errored}, {review} notebook(s) to review (the "
          "review column)"
          + (f"; skipped {len(table.resumed)} student(s) already in {out}"
             if table.resumed else ""))
    return 0


def _review_similarity(grades: list, refs: dict, reference: Path, instructor: Path,
                       table) -> None:
    """Compare every answer cell of the batch with the references, perflab's code and
    the other students' (:mod:`perflab.course.similarity`): write
    ``instructor/similarity.csv`` and add each match to its student's review column
    (never a deduction); the rows of those students are rewritten."""
    import nbformat

    import perflab
    from perflab.course.answers import Flag, answers_of, solution_ids
    from perflab.course.similarity import (boilerplate_sources, library_sources,
                                           reference_sources, similarity_pairs,
                                           write_similarity_csv)
    from perflab.course.submission import read_submitted_notebook

    ref_nbs = {lab: nbformat.read(str(p), as_version=4) for lab, p in refs.items()}
    submitted: dict[str, dict[str, str]] = {}
    for g in grades:
        if g.notebook is None or g.lab not in ref_nbs or g.error:
            continue
        try:
            sub = read_submitted_notebook(g.notebook)
        except Exception:  # noqa: BLE001 - an unreadable notebook is already an error row
            continue
        submitted.setdefault(g.student, {}).update(answers_of(sub, ref_nbs[g.lab])[0])
    matches = similarity_pairs(submitted, reference_sources(reference),
                               library_sources(Path(perflab.__file__).parent),
                               boilerplate=boilerplate_sources(reference))
    write_similarity_csv(matches, instructor / "similarity.csv")
    lab_of = {gid: lab for lab, nb in ref_nbs.items() for gid in solution_ids(nb)}
    for m in matches:
        for g in grades:
            if g.student == m.student and g.lab == lab_of.get(m.grade_id):
                g.flags.append(Flag(m.grade_id, 0, f"similar ({m.score:.0%}, {m.tokens} "
                                                   f"tokens) to {m.matched}"))
    for student in sorted({m.student for m in matches}):
        table.add(student, [g for g in grades if g.student == student])
