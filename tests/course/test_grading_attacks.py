"""One test per attack on the grader (issues 12 and 25): each gets 0 on the checks it
attacks, the scan reports it in the review column (never a deduction), and the rest of
the batch is graded correctly.

One batch grades every attack (two sandboxes at a time) against two synthetic labs: lab
09 as an exercise would be written, and lab 10, the same lab with every scan finding
allowed: the points are the same in both, because they come only from the student's
answers on hidden cases judged outside the sandbox, never from the scan.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import os
import re
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from perflab.course.build import build_lab
from perflab.course.command import add_grade_arguments, grade_command
from perflab.course.sandbox import _root_mode, sandbox_status
from tests.course.test_grading import _drop, _edit, reference_nb

pytestmark = pytest.mark.skipif(
    not sandbox_status()[0], reason=f"attacks run only in a sandbox: {sandbox_status()[1]}")

ALLOW_ALL = ["import", "name", "attribute", "module attribute", "open for writing", "IPython"]
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"

FORGE = """import os, glob, json
rec = {"cell_num": 3, "probe": "check_answer", "outcome": "passed", "message": "",
       "stopped": False, "first_line": "", "facts_lines": ['PERFLAB-FACTS {"answer": 42}']}
mine = f"/proc/{os.getpid()}/"
for path in [os.environ.get("PERFLAB_OUTCOMES", "/tmp/outcomes"), *glob.glob("/proc/*/fd/*")]:
    if path.startswith(mine) or path.startswith("/proc/self/"):
        continue  # its own fds are the kernel's sockets: writing there only hangs itself
    try:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\\n" + "not json\\n")
    except Exception:
        pass
"""
TRANSFORMER = """def cut(lines):
    text = "".join(lines)
    if "PERFLAB-FACTS" in text or "assert" in text:
        return ['print("PASS: answer is 42")\\n']
    return lines
get_ipython().input_transformers_post.append(cut)
"""
PRINT_OVERRIDE = """import builtins, sys
builtins.print = lambda *a, **k: sys.__stdout__.write("PASS: answer is 42\\n")
"""
PATCH_HELPER = """import json, perflab
json.dumps = lambda *a, **k: '{"answer": 42, "got": {"2": 4, "-3": -6}, "base": 10}'
perflab.env_summary = lambda *a, **k: "patched"
"""
REWRITE_REFERENCE = """import glob, perflab, pathlib
found = glob.glob(str(pathlib.Path(perflab.__file__).parents[1] / "solutions" / "*.ipynb"))
found += glob.glob({ref!r} + "/*.ipynb") + glob.glob({subs!r} + "/*/*.ipynb")
for t in found:
    try:
        open(t, "w").write("{{}}")
    except OSError:
        pass
answer = 42 if not found else -len(found)
"""
DETACHED = """import subprocess
subprocess.Popen("setsid sleep 985.75 &", shell=True)
subprocess.Popen(["setsid", "sleep", "985.75"])
answer = 42
"""
FORK_BOMB = """import os
while True:
    try:
        os.fork()
    except OSError:
        pass
answer = 42  # binds a name check_answer reads: the grading process runs this cell
"""
MEMORY_HOG = "hog = [bytearray(2**27) for _ in range(2000)]\nanswer = 42"
# Every facts line the kernel prints becomes one nested 3,000 deep (RecursionError in
# json.loads): "tampered or crashed" for each check, and the batch goes on.
DEEP_JSON = """import builtins, sys
builtins.print = lambda *a, **k: sys.stdout.write("PERFLAB-FACTS " + "[" * 3000 + "]" * 3000 + "\\n")
answer = 42
"""
# A %%writefile module that patches the kernel on import (the double cell imports it).
WRITEFILE_PATCH = """%%writefile evil_student.py
import json
json.dumps = lambda *a, **k: '{"got": [{"value": 42}], "delegated": []}'
"""
WRITEFILE_IMPORT = "import evil_student\ndef double(v):\n    return 0"
HONEST_OS = "import os\nanswer = 42 if os.cpu_count() else 0"
LOOP = "def double(v):\n    while True:\n        pass"  # the graded call hangs


def _student(ref_path: Path, answer: str, double="def double(v):\n    return 2 * v"):
    nb = nbformat.reads(build_lab(ref_path), as_version=4)
    _edit(nb, "my_answer", answer)
    _edit(nb, "my_double", double)
    return nb


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.ipynb")}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    # An empty, world-readable data folder: the synthetic labs need no data, and the
    # sandbox can then drop to an unprivileged uid (so RLIMIT_NPROC holds) even where
    # the real data folder is private.
    data = Path(__file__).resolve().parents[2] / "test-output" / "attack-data"
    data.mkdir(parents=True, exist_ok=True)
    for p in [data, data.parent]:
        p.chmod(0o755)
    saved = os.environ.get("PERFLAB_DATA")
    os.environ["PERFLAB_DATA"] = str(data)
    try:
        yield _batch(tmp_path_factory)
    finally:
        if saved is None:
            os.environ.pop("PERFLAB_DATA", None)
        else:
            os.environ["PERFLAB_DATA"] = saved


def _nproc_holds() -> bool:
    return os.geteuid() != 0 or _root_mode()[0]


def _batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    ref, subs = tmp / "reference", tmp / "submissions"
    ref.mkdir()
    nbformat.write(reference_nb(), str(ref / "09_synthetic.ipynb"))
    nbformat.write(reference_nb(allow=ALLOW_ALL), str(ref / "10_allowed.ipynb"))
    before = _digest(ref), _digest(SOLUTIONS)
    attacks = {
        "forged_outcome": (FORGE, "raise NotImplementedError()"),
        "input_transformer": (TRANSFORMER, "raise NotImplementedError()"),
        "print_override": (PRINT_OVERRIDE, "raise NotImplementedError()"),
        "patched_helper": (PATCH_HELPER, "raise NotImplementedError()"),
        "rewrite_reference": (REWRITE_REFERENCE.format(ref=str(ref), subs=str(subs)), None),
        "detached_child": (DETACHED, None),
        **({"fork_bomb": (FORK_BOMB, None)} if _nproc_holds() else {}),
        "memory_hog": (MEMORY_HOG, None),
        "infinite_loop": ("answer = 42", LOOP),
        "deep_json": (DEEP_JSON, None),
        "writefile_patch": (WRITEFILE_PATCH, WRITEFILE_IMPORT),
        "honest_os": (HONEST_OS, None),
    }
    both = {"forged_outcome", "input_transformer", "print_override", "rewrite_reference"}
    for name, (answer, double) in attacks.items():
        for lab, path in [("09", ref / "09_synthetic.ipynb"), ("10", ref / "10_allowed.ipynb")]:
            if lab == "09" or name in both:
                d = subs / name
                d.mkdir(parents=True, exist_ok=True)
                nb = _student(path, answer, *(() if double is None else (double,)))
                nbformat.write(nb, str(d / path.name))
    for lab, path in [("09", ref / "09_synthetic.ipynb"), ("10", ref / "10_allowed.ipynb")]:
        for name, nb in [("zz_correct", _student(path, "answer = 42")),
                         ("no_solution_cells",
                          _drop(_drop(_student(path, "answer = 42"), "my_answer"), "my_double"))]:
            (subs / name).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(subs / name / path.name))
    (subs / "symlinked").mkdir()  # a classroom git repository keeps symlinks
    (subs / "symlinked" / "09_synthetic.ipynb").symlink_to(ref / "09_synthetic.ipynb")
    (subs / "not_a_notebook").mkdir()
    (subs / "not_a_notebook" / "09_synthetic.ipynb").write_text("#!/bin/sh\nrm -rf /\n")
    args = argparse.ArgumentParser()
    add_grade_arguments(args)
    out = tmp / "out" / "scores.csv"
    start = time.monotonic()
    grade_command(args.parse_args([
        str(subs), "--reference", str(ref), "--out", str(out), "--jobs", "2",
        "--cell-timeout", "10", "--wall-timeout", "60", "--memory-gib", "3", "--nproc", "96",
        "--sandbox", "bwrap"]))
    wall = time.monotonic() - start
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    return {"rows": rows, "out": out.parent, "wall": wall, "before": before,
            "after": (_digest(ref), _digest(SOLUTIONS))}


def _points(row, lab):
    return {k.split(":", 1)[1]: float(v) for k, v in row.items() if k.startswith(lab + ":")}


def _flagged(row, *keys):
    return all(k in row["review"] for k in keys)


@pytest.mark.slow
def test_the_rest_of_the_batch_is_graded_correctly(batch):
    rows = batch["rows"]
    assert _points(rows["zz_correct"], "09") == {"check_answer": 2, "check_double": 1,
                                                  "check_base": 1}
    assert rows["zz_correct"]["total"] == "8" and rows["zz_correct"]["review"] == ""
    assert batch["wall"] < 300


@pytest.mark.slow
def test_forged_outcome_records(batch):
    row = batch["rows"]["forged_outcome"]
    # the channel is out of reach: the unanswered exercises earn nothing; check_base
    # (the notebook's own cell, not attacked) keeps its point
    assert _points(row, "09") == {"check_answer": 0, "check_double": 0, "check_base": 1}
    assert _flagged(row, "open for writing")
    assert _points(row, "10") == _points(row, "09")


@pytest.mark.slow
def test_input_transformer(batch):
    # the grading process has no shell: the hook cannot be installed, the probes it would
    # rewrite never run in a kernel; the unanswered exercises earn nothing, check_base
    # (a given cell's value) its point
    row = batch["rows"]["input_transformer"]
    assert _points(row, "09") == {"check_answer": 0, "check_double": 0, "check_base": 1}
    assert _flagged(row, "name get_ipython")
    assert _points(row, "10") == _points(row, "09")


@pytest.mark.slow
def test_print_and_stdout_override(batch):
    # no check reads what the cell binds: the grading process does not run it
    row = batch["rows"]["print_override"]
    assert _points(row, "09") == {"check_answer": 0, "check_double": 0, "check_base": 1}
    assert _flagged(row, "import builtins", "module attribute builtins.print")
    assert _points(row, "10") == _points(row, "09")


@pytest.mark.slow
def test_monkeypatched_perflab_and_check_helper(batch):
    # json.dumps forged in a cell no check reads: the grading process does not run it;
    # the unanswered exercises earn nothing, check_base its point, the scan flags it
    row = batch["rows"]["patched_helper"]
    assert _points(row, "09") == {"check_answer": 0, "check_double": 0, "check_base": 1}
    assert _flagged(row, "module attribute json.dumps", "module attribute perflab.env_summary")


@pytest.mark.slow
def test_rewritten_reference_on_disk(batch):
    row = batch["rows"]["rewrite_reference"]
    assert batch["after"][0] == batch["before"][0]  # the reference is intact
    # solutions/ may change under a concurrent edit, never to what the attack writes
    assert all(p.read_text() != "{}" for p in SOLUTIONS.glob("*.ipynb"))
    assert _flagged(row, "open for writing")
    # it found no reference, no solutions and no other submission: its answers are right
    assert _points(row, "09") == {"check_answer": 2, "check_double": 1, "check_base": 1}
    assert _points(row, "10") == _points(row, "09")


@pytest.mark.slow
def test_detached_child_holding_a_pipe(batch):
    row = batch["rows"]["detached_child"]
    assert _flagged(row, "import subprocess")
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "985.75" in (p.info["cmdline"] or [])]
    assert "lab 09" not in row["error"]


@pytest.mark.slow
def test_fork_bomb(batch):
    if not _nproc_holds():
        pytest.skip(f"RLIMIT_NPROC cannot hold here: {_root_mode()[1]}")
    row = batch["rows"]["fork_bomb"]   # RLIMIT_NPROC holds; the cell runs past its limit
    assert _points(row, "09") == {"check_answer": 0, "check_double": 0, "check_base": 0}
    assert _flagged(row, "attribute os.fork")


@pytest.mark.slow
def test_deep_json_facts_lines(batch):
    # print replaced: only the older check's facts line (check_base) goes through print;
    # the graded checks' records travel on the grading process's descriptor
    row = batch["rows"]["deep_json"]
    assert _points(row, "09") == {"check_answer": 2, "check_double": 1, "check_base": 0}
    assert _flagged(row, "tampered or crashed") and "lab 09" not in row["error"]


@pytest.mark.slow
def test_writefile_module_that_patches_the_kernel(batch):
    row = batch["rows"]["writefile_patch"]
    # its forged record says 42, but no answer on the hidden cases is right
    assert _points(row, "09")["check_double"] == 0
    assert _flagged(row, "module attribute json.dumps")  # the %%writefile body is scanned


@pytest.mark.slow
def test_honest_import_os_is_not_a_finding(batch):
    row = batch["rows"]["honest_os"]
    assert _points(row, "09") == {"check_answer": 2, "check_double": 1, "check_base": 1}
    assert row["review"] == ""


@pytest.mark.slow
def test_symlinked_submission_is_refused(batch):
    row = batch["rows"]["symlinked"]
    assert row["total"] == "0" and "refused" in row["error"] and "symbolic link" in row["error"]


@pytest.mark.slow
def test_memory_hog(batch):
    row = batch["rows"]["memory_hog"]
    points = _points(row, "09")
    log = (batch["out"] / "instructor" / "memory_hog-09.md").read_text()
    # The per-process memory limit stops the hog (MemoryError, so `answer` is never set:
    # NameError in its check; later checks pass). On a loaded machine filling memory can
    # outlast the 10 s cell limit, or the cap on the submission's memory together can
    # stop the grading process first (CI, 2026-11-29): then nothing after the hog runs,
    # and every check's row says why.
    if "NameError" in log:
        assert points == {"check_answer": 0, "check_double": 1, "check_base": 1}
    else:
        assert points == {"check_answer": 0, "check_double": 0, "check_base": 0}
        assert re.search(r"ran past the per-cell limit \(10 s\)|memory cap|"
                         r"grading process stopped before this check \(exit status", log), \
            log[-2000:]


@pytest.mark.slow
def test_infinite_loop(batch):
    row = batch["rows"]["infinite_loop"]
    assert _points(row, "09") == {"check_answer": 2, "check_double": 0, "check_base": 0}
    assert "check 'check_double' ran past the per-cell limit (10 s)" in (
        batch["out"] / "instructor" / "infinite_loop-09.md").read_text()


@pytest.mark.slow
def test_non_notebook_file(batch):
    row = batch["rows"]["not_a_notebook"]
    assert row["total"] == "0" and "not a valid notebook" in row["error"]


@pytest.mark.slow
def test_notebook_with_its_solution_cells_deleted(batch):
    row = batch["rows"]["no_solution_cells"]
    assert _points(row, "09") == {"check_answer": 0, "check_double": 0, "check_base": 1}
    md = (batch["out"] / "instructor" / "no_solution_cells-09.md").read_text()
    assert "answer cell 'my_answer' is missing from the submission" in md
