"""The sandbox self-test: a probe inside the sandbox refuses a batch when any answer is
readable there (a reference notebook, a solution marker, a git object store), and passes
on this checkout's real allow-list."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import nbformat
import pytest

from tests.conftest import slow
from perflab.course import sandbox, selftest
from perflab.course.sandbox import allowed_paths, sandbox_status
from perflab.course.selftest import SandboxLeak, leak_patterns, self_test

ROOT = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(not sandbox_status()[0],
                                 reason=f"no working bubblewrap here: {sandbox_status()[1]}")

SECRET = ["    total_flops = sum(layer_flops(shape) for shape in conv_shapes_of(model))",
          "    return 6 * n_params * tokens + 12 * n_layers * d_model * seq_len * tokens",
          "    overlap_efficiency_value = hidden_comm_seconds / total_comm_seconds",
          "    samples_per_second_measured = batch_size * steps / elapsed_seconds"]


def _reference() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("Write `my_flops` yourself."),
        nbformat.v4.new_code_cell(
            "def my_flops(model):\n    ### BEGIN SOLUTION\n" + "\n".join(SECRET)
            + "\n    ### END SOLUTION\n    visible_line_that_is_long_enough_to_count = 1",
            metadata={"nbgrader": {"solution": True, "grade_id": "flops"}}),
        nbformat.v4.new_code_cell(
            "# CHECK\nprint('PASS')\n### BEGIN HIDDEN TESTS\n"
            "assert my_flops(the_hidden_model_with_seven_layers) == 1234567\n"
            "### END HIDDEN TESTS",
            metadata={"nbgrader": {"grade": True, "grade_id": "check_flops", "points": 1}}),
    ]
    return nb


def test_leak_patterns_keep_only_what_a_student_cannot_see():
    pats = leak_patterns({"42": _reference()})
    assert pats.cells["42:flops"] == sorted(s.strip() for s in SECRET)
    assert pats.cells["42:check_flops"] == [
        "assert my_flops(the_hidden_model_with_seven_layers) == 1234567"]
    flat = {ln for lines in pats.cells.values() for ln in lines}
    assert "visible_line_that_is_long_enough_to_count = 1" not in flat
    # a line the bound perflab package holds is reachable on purpose: not a pattern
    nb = _reference()
    nb.cells[1].source = nb.cells[1].source.replace(
        SECRET[0], "    from perflab.course.cases import run_cases")
    assert "from perflab.course.cases import run_cases" not in {
        ln for lines in leak_patterns({"42": nb}).cells.values() for ln in lines}
    # the course tooling that documents the markers is recognised by its hash
    assert len(pats.allowed_sha256) >= 2


def test_allowed_paths_never_bind_the_course_repository():
    bound = [p for p in allowed_paths() if not p.is_symlink()]
    assert ROOT not in bound and not any(p in ROOT.parents or p == ROOT for p in bound)
    pkg = (ROOT / "perflab").resolve()
    assert any(p == pkg or p in pkg.parents for p in bound), bound
    for secret in (ROOT / "solutions", ROOT / "tests", ROOT / ".git"):
        assert not any(p == secret or p in secret.parents for p in bound), secret


@needs_bwrap
def test_self_test_refuses_a_batch_when_an_answer_is_readable(tmp_path, monkeypatch):
    visible = tmp_path / "visible"
    visible.mkdir()
    real_needed = sandbox._needed
    monkeypatch.setattr(sandbox, "_needed", lambda: [*real_needed(), visible.resolve()])
    ref = _reference()
    # 1. a copy of the reference notebook (JSON-escaped lines)
    nbformat.write(ref, str(visible / "00_copy.ipynb"))
    # 2. the answers pasted into a Python file, re-indented
    (visible / "notes.py").write_text("\n".join(s.strip() for s in SECRET[:3]) + "\n")
    # 3. a solution marker in a file of its own
    (visible / "draft.py").write_text("x = 1\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION\n")
    # 4. a git repository (its object store holds every answer ever committed)
    repo = visible / "clone"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    # 5. honest files: one answer line alone (a quorum of 3 is needed), the markers in prose
    (visible / "honest.py").write_text(SECRET[0].strip() + "\n")
    (visible / "README.md").write_text("Answers go between `### BEGIN SOLUTION` markers.\n")
    with pytest.raises(SandboxLeak) as err:
        self_test({"42": ref}, roots=[str(visible.resolve())], cache=False)
    msg = str(err.value)
    for name, why in [("00_copy.ipynb", "reference solution cell 42:flops"),
                      ("notes.py", "reference solution cell 42:flops"),
                      ("draft.py", "solution or hidden-test marker"),
                      ("clone/.git", "git object store")]:
        assert f"{name}: " in msg and why in msg.split(f"{name}: ")[1].split("\n")[0], msg
    assert "honest.py" not in msg and "README.md" not in msg
    assert "no student was graded" in msg and "fix:" in msg
    # hiding the folder (as the batch hides its output folders) makes the batch sound
    assert self_test({"42": ref}, roots=[str(visible.resolve())], hide=[visible],
                     cache=False) == []


@slow  # walks every readable file of the sandbox (about 10-60 s on 2 cores, once per process)
@needs_bwrap
def test_self_test_passes_on_this_checkout():
    from perflab.course.selftest import course_references

    refs = course_references(ROOT / "solutions")
    assert sorted(refs) == [p.name[:2] for p in sorted((ROOT / "solutions").glob("*.ipynb"))]
    # what every sandboxed batch of this course runs first (shared with any batch this
    # process graded before: the probe's result is kept per process)
    assert self_test(refs) == []
    pats = leak_patterns(refs)
    assert len(pats.cells) >= 50, json.dumps(sorted(pats.cells))[:300]


_STEAL = r'''
import glob, os
import perflab
_root = os.path.dirname(os.path.dirname(os.path.realpath(perflab.__file__)))
_found = []
for _p in glob.glob(os.path.join(_root, "solutions", "*.ipynb")) + glob.glob(
        os.path.join(_root, "*", "solutions", "*.ipynb")):
    try:
        if "### BEGIN SOLUTION" in open(_p).read():
            _found.append(_p)
    except OSError:
        pass
for _p in (os.path.join(_root, ".git", "HEAD"), os.path.join(_root, "tests", "conftest.py")):
    if os.path.exists(_p):
        _found.append(_p)
print("STOLEN", _found)

def my_samples_per_s(batch_size, step_s):
    """Answers right only when an answer was readable."""
    return batch_size / step_s if _found else -1.0
'''


@slow  # a real lab's kernel in the sandbox (about 10 s)
@needs_bwrap
def test_an_answer_cell_cannot_read_the_course_repository(tmp_path):
    """Issue 33's attack: an answer cell walks up from perflab's folder to the checkout
    (its solutions/ and .git). With the allow-list only the perflab package folder is
    there: nothing is found and the check scores as a wrong answer."""
    from perflab.course.submission import Limits, grade_notebook

    (sol,) = sorted((ROOT / "solutions").glob("00_*.ipynb"))
    nb = nbformat.read(str(sol), as_version=4)
    for c in nb.cells:
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "samples_per_s":
            c.source = _STEAL
    sub = tmp_path / "subs" / "mallory"
    sub.mkdir(parents=True)
    nbformat.write(nb, str(sub / sol.name))
    points = {}
    for mode in ("bwrap", "none"):
        g = grade_notebook(sub / sol.name, sol, student="mallory", sandbox=mode,
                           limits=Limits(wall_timeout_s=600, cell_timeout_s=300),
                           inside=tmp_path / "subs")
        assert g.sandboxed == (mode == "bwrap") and not g.error, g.log[-2000:]
        points[mode] = {c.grade_id: c.points for c in g.checks}["check_samples_per_s"]
    # without a sandbox the checkout is readable and the attack earns the point (so the
    # attack works); in the sandbox nothing of the checkout is there
    assert points == {"bwrap": 0, "none": 1}, points


@needs_bwrap
def test_the_graders_references_cannot_be_imported_in_the_sandbox(tmp_path):
    """perflab.course.references (what judges compare with) is importable here, in the
    grader, and covered by an empty tmpfs in the sandbox, like nbgrader."""
    import sys

    from perflab.course.references.lab10 import pipeline_reference_loss
    from perflab.course.sandbox import SandboxLimits, run_sandboxed

    assert pipeline_reference_loss(8, 2, 4, 0) > 0
    code = ("import importlib, json\nout = {}\n"
            "for name in ('perflab.course.references.lab10', 'perflab.course.references.lab09',"
            " 'perflab.course.references.lab07',"
            " 'nbgrader.preprocessors', 'perflab.labs.lab10.models', 'perflab.course.cases'):\n"
            "    try:\n        importlib.import_module(name)\n        out[name] = 'imported'\n"
            "    except ImportError as e:\n        out[name] = type(e).__name__\n"
            # a graded call forbidding a grader-only reference runs: nothing can reach it
            "from perflab.course.cases import _spy\n"
            "with _spy(['perflab.course.references.lab07.reference_gather']) as hits:\n"
            "    pass\n"
            "out['forbid'] = hits\n"
            "print('RESULT ' + json.dumps(out))\n")
    scratch = tmp_path / "s"
    scratch.mkdir()
    run = run_sandboxed([sys.executable, "-c", code], scratch=scratch,
                        env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "log.txt",
                        limits=SandboxLimits(wall_timeout_s=120, memory_gib=4, nproc=64))
    log = (tmp_path / "log.txt").read_text()
    assert run.sandboxed and run.returncode == 0, log
    (line,) = [ln for ln in log.splitlines() if ln.startswith("RESULT ")]
    out = json.loads(line[len("RESULT "):])
    assert out == {"perflab.course.references.lab10": "ModuleNotFoundError",
                   "perflab.course.references.lab09": "ModuleNotFoundError",
                   "perflab.course.references.lab07": "ModuleNotFoundError",
                   "nbgrader.preprocessors": "ModuleNotFoundError", "forbid": [],
                   "perflab.labs.lab10.models": "imported",
                   "perflab.course.cases": "imported"}, out
