"""A submission's written answers: the "predict, then explain" cells (nbgrader manually
graded markdown cells), collected for the instructor with the numbers the student's own
run printed just before each (:func:`written_answers`)."""
from __future__ import annotations

import nbformat

__all__ = ["written_answers"]


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _text_outputs(cell, limit: int = 600) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append("".join(o.get("text", "")))
        elif o.get("output_type") in ("execute_result", "display_data"):
            out.append("".join(o.get("data", {}).get("text/plain", "")))
    text = "\n".join(t.strip() for t in out if t.strip())
    return text[:limit] + (" [...]" if len(text) > limit else "")


def written_answers(submission: nbformat.NotebookNode, reference: nbformat.NotebookNode
                    ) -> list[dict]:
    """The student's "predict, then explain" answers: nbgrader manually graded cells
    (``solution: true`` markdown cells, usually ``grade: true`` with points).

    Returns:
        One dict per such reference cell, in order: ``grade_id``, ``points``,
        ``question`` (the markdown cell before it in the reference), ``answer`` (the
        student's text, empty when missing), ``measured`` (text outputs of the code cells
        just before the answer in the student's own notebook: their numbers as they ran
        it, not re-measured), ``rubric`` (the reference cell's text: the rubric and its
        model answer, from solutions/, never from the student's notebook).
    """
    by_gid = {_nbg(c).get("grade_id"): i for i, c in enumerate(submission.cells)
              if _nbg(c).get("grade_id")}
    out = []
    for i, ref in enumerate(reference.cells):
        m = _nbg(ref)
        if ref.cell_type != "markdown" or not m.get("solution") or not m.get("grade_id"):
            continue
        question = next((c.source for c in reversed(reference.cells[:i])
                         if c.cell_type == "markdown" and not _nbg(c).get("solution")), "")
        j = by_gid.get(m["grade_id"])
        answer, measured = "", []
        if j is not None:
            answer = submission.cells[j].get("source", "")
            for c in reversed(submission.cells[:j]):
                if c.get("cell_type") == "markdown" and _nbg(c).get("solution"):
                    break
                if c.get("cell_type") == "code" and _text_outputs(c):
                    measured.insert(0, _text_outputs(c))
                    if len(measured) == 2:
                        break
        out.append({"grade_id": m["grade_id"], "points": float(m.get("points", 0)),
                    "question": question, "answer": answer, "measured": measured,
                    "rubric": ref.source})
    return out
