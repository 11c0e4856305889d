"""Course tooling: build the student notebooks in ``labs/`` from ``solutions/``.

``solutions/NN_*.ipynb`` is the single source of each lab. Solution code sits between
``### BEGIN SOLUTION`` / ``### END SOLUTION`` in cells whose nbgrader metadata says
``solution: true``; hidden checks between ``### BEGIN HIDDEN TESTS`` /
``### END HIDDEN TESTS``; graded cells carry nbgrader's ``grade_id`` and ``points``.
Building uses nbgrader's own preprocessors (ClearSolutions, ClearHiddenTests,
ClearOutput) as a library, with no gradebook database, so the notebooks stay valid
nbgrader source notebooks for instructors who use nbgrader itself.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import nbformat

__all__ = ["build_lab", "build_labs", "graded_cells", "record_check_outputs", "prediction_stubs"]

#: The tag of graded cells whose stored output nbval compares (``--nbval-lax``).
CHECK_TAG = "nbval-check-output"


def _preprocessors():
    # Imported here: nbgrader pulls in jupyter/sqlalchemy, which `import perflab` must not.
    from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions

    return [ClearSolutions(), ClearHiddenTests(), ClearOutput()]


def graded_cells(nb: nbformat.NotebookNode) -> dict[str, float]:
    """``grade_id -> points`` of the graded cells of a notebook."""
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            out[meta["grade_id"]] = float(meta.get("points", 0))
    return out


_REGION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION[ \t]*\n?",
                     re.S | re.M)


def _prediction_stub(body: str, indent: str, before: str = "") -> str | None:
    """``name = None  # ...`` for each name a prediction region assigns (names the cell
    already assigns before the region, e.g. a template dict, keep that template), or
    None when the region is more than top-level assignments (an exercise: nbgrader's
    stub applies)."""
    try:
        tree = ast.parse(textwrap.dedent(body))
    except SyntaxError:
        return None
    names = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            return None
        names.append(node.targets[0].id)
    if not names:
        return None
    assigned = set()
    try:
        assigned = {t.id for node in ast.parse(before).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    except SyntaxError:
        pass
    lines = [f"{indent}{n} = None  # YOUR PREDICTION: replace None, then run this cell\n"
             for n in names if n not in assigned]
    return "".join(lines) or f"{indent}# YOUR PREDICTION: fill in the values above, then run this cell\n"


def prediction_stubs(nb: nbformat.NotebookNode) -> dict[str, str]:
    """``grade_id -> stub`` for each prediction cell (nbgrader ``grade_id`` starting
    ``predict_``, one solution region made of plain assignments): the stub is
    ``name = None`` lines, so that an unanswered prediction records nothing and later
    cells still run (:class:`perflab.labs.predictions.Predictions`), where nbgrader's
    stub would raise ``NotImplementedError``."""
    out = {}
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        if cell.cell_type != "code" or not gid.startswith("predict_"):
            continue
        regions = list(_REGION.finditer(cell.source))
        if len(regions) == 1:
            m = regions[0]
            stub = _prediction_stub(m.group(2), m.group(1), cell.source[:m.start()])
            if stub is not None:
                out[gid] = stub.rstrip("\n")
    return out


#: nbgrader's default Python stub (ClearSolutions.code_stub).
_NBGRADER_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"


def build_lab(solution: Path) -> str:
    """The student version of one solution notebook, as notebook JSON text.

    Raises:
        ValueError: the notebook has no graded cells, or a solution region sits in a
            cell not marked as a solution cell (nbgrader's own check).
    """
    nb = nbformat.read(str(solution), as_version=4)
    stubs = prediction_stubs(nb)
    if not graded_cells(nb):
        raise ValueError(f"{solution}: no graded cells (nbgrader metadata grade: true); "
                         "every lab needs at least one check")
    resources: dict = {}
    for pre in _preprocessors():
        try:
            nb, resources = pre.preprocess(nb, resources)
        except RuntimeError as e:
            raise ValueError(f"{solution}: {e}") from e
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        if gid in stubs:
            cell.source = cell.source.replace(_NBGRADER_STUB, stubs[gid], 1)
    nb.metadata.pop("widgets", None)  # saved widget state belongs to outputs
    return nbformat.writes(nb) + "\n"


def build_labs(solutions_dir: str | Path = "solutions", labs_dir: str | Path = "labs", *,
               check: bool = False) -> list[Path]:
    """Write ``labs/NN_*.ipynb`` for every ``solutions/NN_*.ipynb``.

    Args:
        solutions_dir: folder of solution notebooks.
        labs_dir: folder of student notebooks (created if missing).
        check: write nothing; return the student notebooks that are missing or differ
            from what a build would write (CI fails on a non-empty list).

    Returns:
        The paths written (or, with ``check``, the paths out of date).

    Raises:
        FileNotFoundError: no solution notebooks found.
    """
    sols = sorted(Path(solutions_dir).glob("[0-9][0-9]_*.ipynb"))
    if not sols:
        raise FileNotFoundError(f"no solution notebooks (NN_*.ipynb) in {solutions_dir}")
    labs = Path(labs_dir)
    changed = []
    for sol in sols:
        text = build_lab(sol)
        dest = labs / sol.name
        if dest.exists() and dest.read_text() == text:
            continue
        changed.append(dest)
        if not check:
            labs.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
    return changed


def record_check_outputs(solution: str | Path, *, cell_timeout_s: float = 600.0) -> list[str]:
    """Run a solution notebook and store the outputs of its check cells only.

    The stored ``PASS: ...`` lines of the cells tagged ``nbval-check-output`` are what
    nbval (and grading) compare against (their stderr is not stored: warnings and rank
    logs are not part of a verdict); every other cell is saved without outputs, and
    saved widget state is dropped. The notebook runs in its own folder, in a kernel of
    the current environment. Nothing is written when a cell raises.

    Returns:
        The recorded check outputs, one string per check cell, in notebook order.

    Raises:
        ValueError: a cell raised (the message names it), or no cell carries the tag.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(solution)
    nb = nbformat.read(str(path), as_version=4)
    def is_check(cell) -> bool:
        return CHECK_TAG in cell.get("metadata", {}).get("tags", [])

    if not any(is_check(c) for c in nb.cells):
        raise ValueError(f"{path}: no cell is tagged {CHECK_TAG!r}; tag the graded cells")
    client = NotebookClient(nb, timeout=cell_timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    try:
        client.execute()
    except CellExecutionError as e:
        raise ValueError(f"{path}: a cell raised, nothing written:\n{e}") from e
    for cell in nb.cells:
        if cell.cell_type == "code" and not is_check(cell):
            cell.outputs, cell.execution_count = [], None
        elif cell.cell_type == "code":   # a check's verdict is on stdout; stderr (warnings,
            cell.outputs = [o for o in cell.outputs   # a rank's log) is not compared
                            if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, str(path))
    return ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells if is_check(c)]
