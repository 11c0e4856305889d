"""Similar answer cells, for the review column: winnowed token fingerprints, as MOSS does.

Each answer cell of a batch is compared with the reference solutions, with perflab's own
source (one document per top-level function or class, so a finding names the function)
and with every other student's answers. A match that covers at least :data:`THRESHOLD`
of the answer's own code, and at least :data:`MIN_TOKENS` tokens of it, is a
:class:`Match`: a review finding that names the reference cell, the perflab function or
the other student. It costs no points; an instructor reads it.

The method is winnowing (Schleimer, Wilkerson, Aiken, "Winnowing: local algorithms for
document fingerprinting", SIGMOD 2003), the one MOSS uses:

1. the cell is tokenized and normalized (:func:`tokens`): every identifier that is not
   a keyword or a builtin becomes ``V``, every string ``S``, every number ``N``; comments
   and line breaks inside brackets go, statements and indentation stay (``;``, ``{``,
   ``}``). Renaming variables, re-wrapping lines or rewriting comments changes nothing.
2. every k-gram of :data:`K_TOKENS` tokens is hashed (64-bit BLAKE2b, the same in every
   process and on every machine);
3. winnowing keeps the minimum hash of every window of :data:`WINDOW` consecutive
   k-grams (the rightmost on ties): a document's fingerprints. Two documents that share
   a run of ``WINDOW + K_TOKENS - 1`` tokens share a fingerprint (the paper's guarantee
   threshold); runs shorter than ``K_TOKENS`` tokens (the noise threshold) never match.
4. fingerprints of code every student was given (``boilerplate``: the cells of
   ``labs/``, among them each exercise's own scaffold and stubs, or the same cells built
   from the references) are dropped from the answers, as MOSS's ``-b`` base file does,
   so a scaffold left as given is not a match; and, as MOSS's ``-m``, a fingerprint
   found in more than :data:`MAX_STUDENTS` students' answers is an idiom of the class,
   not evidence between two of them (it still counts against the references and
   perflab's source). This also bounds the work per answer: a class of hundreds
   compares in seconds.
5. only the answer's *own* tokens are evidence: not the tokens of the given cell it was
   written in (the one sharing most k-grams with it: its scaffold, the stubs it left),
   which a k-gram reaching across its edge would otherwise pull in, and not its short
   formulas (an assignment or ``return`` of arithmetic on names and numbers, straight-line,
   under :data:`FORMULA_TOKENS` tokens, a prediction's ``p = 0.2``): their correct form
   is unique, so whoever gets them right writes them alike, between students as against
   the reference.

An answer's score against another document is the share of its own fingerprinted tokens
that fingerprints shared with that document cover (copydetect's "token overlap"
measure); a match must cover :data:`MIN_TOKENS` of its own tokens.

Why not ``copydetect`` (0.5.0 on PyPI, which implements the same method): it hashes
k-grams with Python's ``hash()``, salted per process by ``PYTHONHASHSEED``, so which
fingerprints winnowing keeps, and with them a borderline score, differ from one run of
``perflab course grade`` to the next (measured with k=25, window 5: the same honest
``my_amp_step`` against the reference scored 0.1623 under ``PYTHONHASHSEED=1`` and
0.1634 under ``3``); the review column must be reproducible. It also reads documents
from files and brings matplotlib and jinja2 for its HTML report. The few lines below
need the standard library only.

The threshold (see tests/course/test_similarity.py, which keeps it calibrated): every
honest variant in tests/labs/test_lab*_checks.py and tests/course/ stays below it
against every reference solution, every reference solution copied with its variables
renamed crosses it when it has :data:`MIN_TOKENS` tokens of its own (predictions,
formulas and short fills of a scaffold are no evidence either way).
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import hashlib
import io
import json
import keyword
import re
import tokenize
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Literal, Mapping

__all__ = ["Match", "similarity_pairs", "write_similarity_csv", "findings_by_student",
           "tokens", "fingerprints", "reference_sources", "boilerplate_sources",
           "library_sources", "csv_cell", "K_TOKENS", "WINDOW", "THRESHOLD", "MIN_TOKENS",
           "MAX_STUDENTS", "FORMULA_TOKENS"]

#: k: tokens per hashed k-gram (the noise threshold: shorter common runs never match).
K_TOKENS = 10
#: w: k-grams per winnowing window (guarantee threshold ``WINDOW + K_TOKENS - 1`` tokens).
WINDOW = 6
#: Least share of an answer's own fingerprinted tokens one document must cover to be a
#: match. Calibrated (k=10, w=6, >= 40 own tokens): honest variants in the tests reach at
#: most 0.60 against a reference solution and 0.61 against perflab's source; every
#: reference copied with its identifiers renamed that has 40 tokens of its own (40 of
#: 68) scores 1.00, and 33 of 37 copies that also insert a statement after every third
#: line score >= 0.70 (the four others 0.56-0.59).
THRESHOLD = 0.70
#: Least number of an answer's own tokens (not its scaffold, not its short formulas) a
#: match must cover (a two-line answer resembles everything; below this nothing is
#: reported, a student's side of a pair included).
MIN_TOKENS = 40
#: A fingerprint in more students' answers than this is ignored between students.
MAX_STUDENTS = 10
#: A formula (a statement that assigns or returns arithmetic of names and numbers) of
#: fewer tokens than this has one correct form: it is no evidence of copying.
FORMULA_TOKENS = 40

Kind = Literal["reference", "library", "student"]

_KEEP = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
_FSTART = getattr(tokenize, "FSTRING_START", None)  # Python >= 3.12 splits f-strings
_FEND = getattr(tokenize, "FSTRING_END", None)
_REGEX_TOKEN = re.compile(r"""[A-Za-z_]\w*|\d[\w.]*|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?|\S""")


@dataclasses.dataclass(frozen=True)
class Match:
    """One answer cell that an other document covers above the threshold."""

    student: str
    grade_id: str
    """The answer cell (nbgrader grade_id)."""
    kind: Kind
    """What it matches: a reference solution, perflab's source, another student."""
    source: str
    """reference: the solution cell's grade_id; library: the function or class
    (``perflab.analysis.collectives.fit_alpha_beta``); student: the other student."""
    source_cell: str
    """student: the other student's answer cell (grade_id); otherwise empty."""
    score: float
    """Share of this answer's fingerprinted tokens that the match covers (0..1)."""
    tokens: int
    """Tokens of this answer that the match covers."""
    unit: str = ""
    """The top-level function or class of the answer cell that matches (empty: the
    whole cell)."""
    source_unit: str = ""
    """reference, student: the top-level function or class of the matched cell that the
    match falls in (empty: a cell without one); library: empty (``source`` names it)."""

    @property
    def matched(self) -> str:
        """What it matches, in words: ``"the reference solution my_amp_step
        (my_amp_step)"``, ``"perflab's perflab.analysis.collectives.fit_alpha_beta"``,
        ``"student bob's answer zero1_file (ZeRO1)"``."""
        where = f" ({self.source_unit})" if self.source_unit else ""
        return {"reference": f"the reference solution {self.source}{where}",
                "library": f"perflab's {self.source}",
                "student": f"student {self.source}'s answer {self.source_cell}{where}"
                }[self.kind]

    def finding(self) -> str:
        """The review-column text: ``"my_amp_step: 96% of the answer (120 tokens) matches
        the reference solution my_amp_step"``."""
        where = f"{self.grade_id} ({self.unit})" if self.unit else self.grade_id
        return (f"{where}: {self.score:.0%} of the answer ({self.tokens} tokens) matches "
                f"{self.matched}")


def tokens(source: str) -> list[str]:
    """The normalized token stream of a cell (step 1 of the module docstring).

    Magics and other lines that are not Python are tokenized as far as Python's
    tokenizer goes; a cell it rejects (an unterminated string, a bad dedent) is split by
    a regular expression instead, without indentation tokens.
    """
    return _tokens(source)[0]


def _tokens(source: str) -> tuple[list[str], list[int]]:
    """:func:`tokens`, and the 1-based line each token starts on."""
    try:
        raw = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        found = list(_REGEX_TOKEN.finditer(source))
        return ([_normal_name(t) if t[0].isalpha() or t[0] == "_" else
                 "N" if t[0].isdigit() else "S" if t[0] in "'\"" else t
                 for t in (m.group() for m in found)],
                [source.count("\n", 0, m.start()) + 1 for m in found])
    out: list[str] = []
    lines: list[int] = []
    depth = 0  # inside a Python >= 3.12 f-string: one "S" for all of it, as before 3.12
    for tok in raw:
        n = len(out)
        if tok.type == _FSTART:
            if depth == 0:
                out.append("S")
            depth += 1
        elif tok.type == _FEND:
            depth -= 1
        elif depth or tok.type in _SKIP:
            continue
        elif tok.type == tokenize.NAME:
            out.append(_normal_name(tok.string))
        elif tok.type == tokenize.NUMBER:
            out.append("N")
        elif tok.type == tokenize.STRING:
            out.append("S")
        elif tok.type == tokenize.NEWLINE:
            out.append(";")
        elif tok.type == tokenize.INDENT:
            out.append("{")
        elif tok.type == tokenize.DEDENT:
            out.append("}")
        elif tok.string.strip():
            out.append(tok.string)
        lines += [tok.start[0]] * (len(out) - n)
    return out, lines


def _normal_name(name: str) -> str:
    return name if name in _KEEP else "V"


def _hash(gram: list[str]) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(gram).encode(), digest_size=8).digest(),
                          "big")


# The same texts come back batch after batch in one process (perflab's ~1,000 library
# functions, the labs' given cells): tokenizing them was 5 of the 6 s of a small batch's
# grade command. Texts are hashed whole by the caches; the results are never mutated.
@functools.lru_cache(maxsize=16384)
def _kgram_hashes(source: str, k: int) -> tuple[int, ...]:
    toks = tokens(source)
    return tuple(_hash(toks[i:i + k]) for i in range(len(toks) - k + 1))


@functools.lru_cache(maxsize=16384)
def _fingerprints_memo(source: str, k: int, window: int) -> dict[int, list[int]]:
    return fingerprints(source, k=k, window=window)


def fingerprints(source: str, *, k: int = K_TOKENS, window: int = WINDOW
                 ) -> dict[int, list[int]]:
    """``hash -> [token position, ...]``: the winnowed fingerprints of a cell.

    Robust winnowing (Schleimer, Wilkerson, Aiken 2003, section 4.1): in each window of
    ``window`` consecutive k-gram hashes the minimum is kept, the rightmost one on ties,
    and recorded once however many windows keep it. A text shorter than one window keeps
    its minimum.

    Raises:
        ValueError: ``k`` or ``window`` < 1.
    """
    if k < 1 or window < 1:
        raise ValueError(f"k and window must be >= 1, got k={k}, window={window}")
    hashes = _kgram_hashes(source, k)
    out: dict[int, list[int]] = defaultdict(list)
    w = min(window, len(hashes))
    pos = -1  # the kept minimum of the previous window
    for end in range(w - 1, len(hashes)) if hashes else ():
        if pos < end - w + 1:  # it left the window: the rightmost minimum of this one
            pos = min(range(end - w + 1, end + 1), key=lambda i: (hashes[i], -i))
        elif hashes[end] <= hashes[pos]:  # the new k-gram is the (rightmost) minimum
            pos = end
        else:
            continue
        out[hashes[pos]].append(pos)
    return dict(out)


def _covered(fps: Mapping[int, list[int]], keep: Iterable[int], k: int) -> set[int]:
    return {p + d for h in keep for p in fps[h] for d in range(k)}


#: What a *formula* may call: a statement that assigns or returns an expression of names,
#: numbers, attributes, subscripts, arithmetic and these (``max(a, b)``, ``sum(x for x in
#: xs)``, ``math.sqrt(n)``) has one correct form, so two people who write it right write
#: it alike: a short one is no evidence (:func:`_unique_positions`).
_FORMULA_CALLS = frozenset({"abs", "min", "max", "sum", "len", "float", "int", "round",
                            "pow", "divmod", "bool", "range"})
_FORMULA_NODES = (ast.expr, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop,
                  ast.boolop, ast.comprehension, ast.keyword)


def _formula(node: ast.expr) -> bool:
    """``node`` is arithmetic on names and numbers (see :data:`_FORMULA_CALLS`)."""
    for n in ast.walk(node):
        if isinstance(n, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom,
                          ast.Starred)) or not isinstance(n, _FORMULA_NODES):
            return False
        if isinstance(n, ast.Call) and not (
                isinstance(n.func, ast.Name) and n.func.id in _FORMULA_CALLS
                or isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and n.func.value.id == "math"):
            return False
    return True


def _python(source: str) -> str:
    """``source`` with its magic and ``!`` lines blanked (line numbers kept)."""
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                     for ln in source.split("\n"))


def _unique_positions(source: str, lines: list[int], limit: int) -> set[int]:
    """Token positions (``lines``: each token's line) of the short formulas of
    ``source``, fewer than ``limit`` tokens each, in straight-line code (a cell's or a
    function's own statements, not a loop's or a branch's): ``x = a / (b * c)``,
    ``return mfu, hfu``, a prediction's ``p = 0.2``. An answer whose correct form is
    unique matches whoever got it right."""
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return set()
    spans = set()
    bodies = [tree.body, *(n.body for n in ast.walk(tree)
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for node in (n for body in bodies for n in body):  # straight-line code, not a loop's
        value = node.value if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign,
                                                ast.Return)) else None
        if value is not None and _formula(value) and all(
                _formula(t) for t in getattr(node, "targets", [getattr(node, "target", value)])):
            spans.add((node.lineno, node.end_lineno or node.lineno))
    at: dict[int, list[int]] = defaultdict(list)
    for i, ln in enumerate(lines):
        at[ln].append(i)
    out = set()
    for first, last in spans:
        where = [i for ln in range(first, last + 1) for i in at.get(ln, ())]
        if len(where) < limit:
            out.update(where)
    return out


def _defs(source: str) -> list[tuple[str, str]]:
    """``[(name, source), ...]`` of the top-level functions and classes of a cell."""
    lines = source.split("\n")
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return []
    return [(n.name, _segment(lines, n)) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _units(source: str) -> list[tuple[str, str]]:
    """``[("", cell), (name, def), ...]``: the whole cell, then each top-level function
    and class of it when it holds more than one (a cell of several exercises: one copied
    function among honest ones is a match of its own)."""
    defs = _defs(source)
    return [("", source), *defs] if len(defs) > 1 else [("", source)]


def _segment(lines: list[str], node: ast.stmt) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(lines[first - 1:node.end_lineno])


def similarity_pairs(answers: Mapping[str, Mapping[str, str]], references: Mapping[str, str],
                     library: Mapping[str, str], *, boilerplate: Iterable[str] = (),
                     threshold: float = THRESHOLD, min_tokens: int = MIN_TOKENS,
                     max_students: int = MAX_STUDENTS, k: int = K_TOKENS,
                     window: int = WINDOW) -> list[Match]:
    """Every answer cell that a reference solution, a perflab function or another
    student's answer covers above the threshold (MOSS's winnowing: Schleimer, Wilkerson,
    Aiken, SIGMOD 2003; see the module docstring).

    The answer is compared as a whole and, when it defines several top-level functions
    or classes, each of them on its own (:attr:`Match.unit`); the best of these per
    matched document is reported, with the function or class of the matched cell it
    falls in (:attr:`Match.source_unit`). Only the answer's own tokens count (step 5 of
    the module docstring): not the given cell it was written in, not its short formulas.

    Args:
        answers: ``student -> grade_id -> source`` of the batch's answer cells.
        references: ``grade_id -> source`` of the reference solution cells
            (:func:`reference_sources`).
        library: ``qualified name -> source`` of perflab's functions and classes
            (:func:`library_sources`).
        boilerplate: code every student was given (:func:`boilerplate_sources`, the cells
            of ``labs/``); its k-grams are no answer's fingerprints, and the cell an
            answer was written in is not its own code.
        threshold: least share of an answer's own fingerprinted tokens a match covers.
        min_tokens: least number of the answer's own tokens a match covers.
        max_students: a fingerprint in more students' answers than this is ignored
            between students (MOSS's ``-m``).
        k, window: the k-gram length and the winnowing window, in tokens.

    Returns:
        The matches, highest score first. Two students whose answers match give one
        :class:`Match` each way (each names the other), the pair being reported when
        either direction crosses the threshold; a direction that covers fewer than
        ``min_tokens`` of its student's own tokens is never reported.

    Raises:
        ValueError: ``threshold`` outside (0, 1], ``min_tokens``, ``max_students``,
            ``k`` or ``window`` < 1.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if min_tokens < 1 or max_students < 1:
        raise ValueError(f"min_tokens and max_students must be >= 1, got {min_tokens} "
                         f"and {max_students}")
    if k < 1 or window < 1:
        raise ValueError(f"k and window must be >= 1, got k={k}, window={window}")
    given = [set(_kgram_hashes(src, k)) for src in boilerplate]
    base = set().union(*given)
    given_in: dict[int, list[int]] = defaultdict(list)  # k-gram hash -> given cells
    for i, hs in enumerate(given):
        for h in hs:
            given_in[h].append(i)
    def fps_of(text: str) -> dict[int, list[int]]:
        return _fingerprints_memo(text, k, window)   # computed once per process

    def own_positions(text: str) -> set[int]:
        """The answer's own tokens: neither the given cell it was written in (the one
        that shares most k-grams with it: its scaffold, stubs kept or not) nor a short
        formula (:func:`_unique_positions`)."""
        toks, lines = _tokens(text)
        hashes = [_hash(toks[i:i + k]) for i in range(len(toks) - k + 1)]
        votes: dict[int, int] = defaultdict(int)
        for h in set(hashes):
            for i in given_in.get(h, ()):
                votes[i] += 1
        scaffold = given[min(votes, key=lambda i: (-votes[i], i))] if votes else set()
        kept = {i + d for i, h in enumerate(hashes) if h in scaffold for d in range(k)}
        return set(range(len(toks))) - kept - _unique_positions(text, lines, FORMULA_TOKENS)

    index: dict[int, list[tuple[Kind, str, str]]] = defaultdict(list)
    for kind, docs in (("reference", {(g, ""): s for g, s in references.items()}),
                       ("library", {(n, ""): s for n, s in library.items()}),
                       ("student", {(st, g): s for st, cells in answers.items()
                                    for g, s in cells.items()})):
        for (name, cell), src in docs.items():
            for h in fps_of(src):
                index[h].append((kind, name, cell))
    for h, docs in index.items():
        if len({name for kind, name, _ in docs if kind == "student"}) > max_students:
            index[h] = [d for d in docs if d[0] != "student"]
    # (student, grade_id, kind, name, cell) -> (score, covered tokens, unit, shared hashes)
    best: dict[tuple[str, str, Kind, str, str], tuple[float, int, str, frozenset]] = {}
    for student in sorted(answers):
        for gid in sorted(answers[student]):
            for unit, text in _units(answers[student][gid]):
                own = own_positions(text)
                fps = {h: p for h, p in fps_of(text).items() if h not in base}
                total = len(_covered(fps, fps, k) & own)
                if not total:
                    continue  # nothing of its own: the scaffold, stubs or formulas only
                shared: dict[tuple[Kind, str, str], list[int]] = defaultdict(list)
                for h in fps:
                    for doc in set(index[h]):
                        shared[doc].append(h)
                for (kind, name, cell), hs in shared.items():
                    if kind == "student" and name == student:
                        continue
                    covered = len(_covered(fps, hs, k) & own)
                    key = (student, gid, kind, name, cell)
                    if (covered / total, covered) > best.get(key, (0.0, 0))[:2]:
                        best[key] = (covered / total, covered, unit, frozenset(hs))

    def crosses(score: float, covered: int) -> bool:
        return score >= threshold and covered >= min_tokens

    found = {key for key, (score, covered, *_) in best.items() if crosses(score, covered)}
    # the other student of a pair, when their side covers enough of their own code
    found |= {mirror for s, g, kind, n, c in found if kind == "student"
              if (mirror := (n, c, kind, s, g)) in best and best[mirror][1] >= min_tokens}

    def source_unit(kind: Kind, name: str, cell: str, hs: frozenset) -> str:
        """The function or class of the matched cell that the shared k-grams fall in."""
        text = references.get(name, "") if kind == "reference" else \
            answers.get(name, {}).get(cell, "") if kind == "student" else ""
        defs = _defs(text)
        if len(defs) < 2:
            return defs[0][0] if defs else ""
        return max(defs, key=lambda d: len(hs & set(fps_of(d[1]))))[0]

    matches = [Match(*key, *best[key][:3], source_unit(*key[2:], best[key][3]))
               for key in found]
    return sorted(matches, key=lambda m: (-m.score, m.student, m.grade_id, m.kind, m.source,
                                          m.source_cell))


def findings_by_student(matches: Iterable[Match]) -> dict[str, list[str]]:
    """``student -> [finding, ...]``: each match's review-column text, for its student."""
    out: dict[str, list[str]] = defaultdict(list)
    for m in matches:
        out[m.student].append(m.finding())
    return dict(out)


def csv_cell(value: object) -> str:
    """``value`` as a CSV text cell a spreadsheet shows as text: the course's one rule,
    :func:`perflab.course.report.escape_csv_text` (OWASP, "CSV Injection")."""
    from perflab.course.report import escape_csv_text

    return escape_csv_text(str(value))


def write_similarity_csv(matches: Iterable[Match], path: str | Path) -> Path:
    """Write the matches to ``path`` (``instructor/similarity.csv``): one row per match,
    ``student, grade_id, unit, kind, source, source_cell, source_unit, score, tokens``
    (``unit`` and ``source_unit``: the function or class matched on either side, empty
    for a whole cell), atomically, with the text cells escaped against CSV injection, as
    ``scores.csv`` is (:func:`perflab.course.report.write_csv`). Winnowing: Schleimer,
    Wilkerson, Aiken, SIGMOD 2003 (see :func:`similarity_pairs`). Returns the path."""
    from perflab.course.report import write_csv

    header = ["student", "grade_id", "unit", "kind", "source", "source_cell", "source_unit",
              "score", "tokens"]
    rows = [[m.student, m.grade_id, m.unit, m.kind, m.source, m.source_cell, m.source_unit,
             f"{m.score:.3f}", str(m.tokens)] for m in matches]
    return write_csv(path, header, rows, text_columns=header[:7])


# --- the documents of a batch ------------------------------------------------------------

def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8")).get("cells", [])


def _text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def reference_sources(solutions: str | Path) -> dict[str, str]:
    """``grade_id -> source`` of every code solution cell of ``solutions/NN_*.ipynb``."""
    out = {}
    for nb in sorted(Path(solutions).glob("[0-9][0-9]_*.ipynb")):
        for cell in _cells(nb):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
                out[meta["grade_id"]] = _text(cell)
    return out


_HIDDEN_REGION = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[ \t]*\n.*?"
                            r"^[ \t]*### END HIDDEN TESTS[ \t]*$", re.S | re.M)


def _given(cell: dict, built: bool) -> str:
    """A code cell of a solution notebook as the build hands it out
    (:func:`perflab.course.build.build_lab`): each solution region replaced by its stub,
    indented as its ``### BEGIN SOLUTION`` line (nbgrader's ``# YOUR CODE HERE`` /
    ``raise NotImplementedError()``; a prediction's ``name = None`` lines), a solution
    cell without a region by the stub alone, hidden-test regions cut out. A cell of a
    ``built`` notebook (``labs/``: no region left in it) is given as it is."""
    if built:
        return _text(cell)
    from perflab.course.build import _NBGRADER_STUB, prediction_stubs

    text = _text(cell)
    meta = cell.get("metadata", {}).get("nbgrader", {})
    predicted = prediction_stubs(_nbformat_cell(cell)) if str(
        meta.get("grade_id", "")).startswith("predict_") else {}
    stub = predicted.get(meta.get("grade_id"), _NBGRADER_STUB)
    out, inside, replaced = [], False, False
    for line in text.split("\n"):
        if "### BEGIN SOLUTION" in line:
            indent = re.match(r"\s*", line).group(0)
            out += [indent + s.lstrip() if s.strip() else s for s in stub.split("\n")]
            inside = replaced = True
        elif "### END SOLUTION" in line:
            inside = False
        elif not inside:
            out.append(line)
    if meta.get("solution") and not replaced:
        return stub
    return _HIDDEN_REGION.sub("", "\n".join(out))


def _nbformat_cell(cell: dict):
    """A one-cell nbformat notebook of ``cell`` (for :mod:`perflab.course.build`)."""
    import nbformat

    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        _text(cell), metadata=nbformat.from_dict(cell.get("metadata", {})))])


def boilerplate_sources(notebooks: str | Path) -> list[str]:
    """The code every student was given: every code cell of ``labs/NN_*.ipynb``, or of
    ``solutions/NN_*.ipynb`` as the build hands it out (solution regions replaced by
    their stubs, hidden-test regions cut out: the same code, for a grader that has the
    references only), so that an untouched stub is given code too."""
    out = []
    for nb in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        cells = [c for c in _cells(nb) if c.get("cell_type") == "code"]
        built = not any("### BEGIN SOLUTION" in _text(c) for c in cells)
        out += [_given(c, built) for c in cells]
    return out


def library_sources(package: str | Path, name: str = "perflab") -> dict[str, str]:
    """``qualified name -> source`` of every top-level function and class of the package
    folder ``package`` (``perflab.analysis.collectives.fit_alpha_beta``; a module that
    does not parse is skipped)."""
    root = Path(package)
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        st = path.stat()
        out.update(_module_defs(str(path), st.st_mtime_ns, st.st_size, module))
    return out


@functools.lru_cache(maxsize=4096)
def _module_defs(path: str, mtime_ns: int, size: int, module: str
                 ) -> tuple[tuple[str, str], ...]:
    """The top-level functions and classes of one module file, parsed once per process
    while the file is unchanged (its modification time and size are in the key)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ()
    lines = text.split("\n")
    return tuple((f"{module}.{node.name}", _segment(lines, node)) for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
