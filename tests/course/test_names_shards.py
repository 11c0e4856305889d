"""Safe student names, a batch that never stops, CSV escaping, shards and their merge.

No kernel and no sandbox: ``perflab.course.grading.grade_notebook`` is replaced by a stub
whose points follow from the seed and the student's id, so a whole batch (the command,
the score table, the feedback files, the manifest) runs in well under a second and two
batches are equal exactly when they grade the same students with the same seed.
"""
from __future__ import annotations

import argparse
import csv
import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from perflab.cli import main
from perflab.course import grading, report
from perflab.course.answers import Flag
from perflab.course.command import add_grade_arguments, grade_command
from perflab.course.grading import (INVALID_PREFIX, MAX_NAME_CHARS, NAME_FLAG,
                                    check_student_name, grade_submissions, name_skeleton,
                                    shard_slice, student_folders)
from perflab.course.report import (ScoreTable, escape_csv_text, merge_scores, read_csv,
                                   student_file_stem, unescape_csv_text, write_csv)
from perflab.course.submission import CheckResult, LabGrade, lab_key
from tests.course.test_grading import reference_nb

HYPERLINK = '=HYPERLINK("evil.example","click me")'
LONG = "x" * 245
NFC, NFD = "Jos\u00e9", "Jose\u0301"
CYRILLIC_ADA = "\u0430da"  # Cyrillic a, then Latin "da"
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def fake_grade(path, reference_path, *, student="", seed=0, **_):
    """grade_notebook's stand-in: points from (seed, student, lab), nothing run."""
    lab = lab_key(reference_path)
    h = int(hashlib.sha256(f"{seed}:{student}:{lab}".encode()).hexdigest(), 16)
    if student == "crash":
        raise RuntimeError("the grader broke on this one")
    return LabGrade(student, lab, Path(path), [
        CheckResult("check_answer", 2, float(h % 3), "passed" if h % 3 == 2 else "failed"),
        CheckResult("check_double", 1, float(h >> 2 & 1), "passed"),
        CheckResult("check_base", 1, 1.0, "passed")], log=f"log of {student}")


@pytest.fixture
def stub(monkeypatch):
    calls: list[str] = []

    def grade(path, reference_path, **kw):
        calls.append(kw.get("student", ""))
        return fake_grade(path, reference_path, **kw)

    monkeypatch.setattr(grading, "grade_notebook", grade)
    return calls


@pytest.fixture
def reference(tmp_path) -> Path:
    ref = tmp_path / "reference"
    ref.mkdir()
    nbformat.write(reference_nb(), str(ref / "09_synthetic.ipynb"))
    nbformat.write(reference_nb(), str(ref / "10_synthetic.ipynb"))
    return ref


def make_class(subs: Path, names=("ada", "bob", "cy", "dee", "eve", "fay", "gus")) -> Path:
    for name in names:
        d = subs / name
        d.mkdir(parents=True)
        for lab in ("09", "10"):
            (d / f"{lab}_mine.ipynb").write_text("{}")
    return subs


def bad_class(subs: Path) -> Path:
    """Honest names, a formula, a 245-character name, a non-UTF-8 name, twins."""
    make_class(subs, ["ada", HYPERLINK, LONG, NFC, NFD, CYRILLIC_ADA])
    os.mkdir(os.fsencode(subs) + b"/bad\xff\xfename")
    (subs / "bad\udcff\udcfename" / "09_mine.ipynb").write_text("{}")
    return subs


def grade(subs, reference, out, *extra) -> int:
    parser = argparse.ArgumentParser()
    add_grade_arguments(parser)
    return grade_command(parser.parse_args(
        [str(subs), "--reference", str(reference), "--out", str(out), "--sandbox", "none",
         "--labs", "09,10", *extra]))


def rows_of(path) -> dict[str, dict[str, str]]:
    header, rows = read_csv(path, text_columns=("student", "review", "error"))
    return {r[0]: dict(zip(header, r)) for r in rows}


def raw_cells(path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return [c for row in csv.reader(f) for c in row]


# -- the name check ------------------------------------------------------------------------

def test_check_student_name_keeps_good_names_in_nfc():
    assert check_student_name("ada") == "ada"
    assert check_student_name(NFD) == NFC == check_student_name(NFC.encode())
    assert check_student_name(HYPERLINK) == HYPERLINK  # a valid name: escaped in the CSV
    assert check_student_name("x" * MAX_NAME_CHARS) == "x" * MAX_NAME_CHARS
    assert check_student_name("Zoë O'Neil") == "Zoë O'Neil"


@pytest.mark.parametrize("name, match", [
    (b"bad\xff", r"not valid UTF-8 \(byte 0xff at byte 3\)"),
    ("bad\udcff", r"not valid UTF-8"),  # how Path.iterdir gives a non-UTF-8 name
    ("bad\ud800", r"not valid UTF-8"),  # a lone surrogate that no file system wrote
    ("a/b", r"path separator '/'"),  # impossible on disk: the validator itself
    ("a\\b", r"path separator '\\\\'"),
    (".", "is not a name"), ("..", "is not a name"), ("", "is not a name"),
    (LONG, r"has 245 characters, more than 64"),
    ("tab\there", r"does not print \(U\+0009 at character 3\)"),
    ("new\nline", r"does not print \(U\+000A"),
    ("zero\u200bwidth", r"does not print \(U\+200B ZERO WIDTH SPACE at character 4\)"),
    ("invalid-name-0123456789", "reserves"),
])
def test_check_student_name_refuses_naming_the_fix(name, match):
    with pytest.raises(ValueError, match=match) as e:
        check_student_name(name)
    assert "rename the folder" in str(e.value)
    assert str(e.value).isprintable() and str(e.value).isascii()  # safe to print anywhere


def test_student_folders_ids_invalid_names_and_twins(tmp_path):
    subs = bad_class(tmp_path / "subs")
    folders = {f.id: f for f in student_folders(subs)}
    assert len(folders) == 7  # every folder, each under its own id
    invalid = sorted(i for i in folders if i.startswith(INVALID_PREFIX))
    assert len(invalid) == 2 and all(re.fullmatch(r"invalid-name-[0-9a-f]{10}", i)
                                     for i in invalid)
    raw = os.fsencode(subs / LONG).rsplit(b"/", 1)[1]
    assert INVALID_PREFIX + hashlib.sha256(raw).hexdigest()[:10] in folders
    assert "245 characters" in folders[INVALID_PREFIX + hashlib.sha256(raw).hexdigest()[:10]
                                       ].error
    # NFC twins: the NFC folder keeps its name, the other gets its hash; both flagged
    nfd_id = next(i for i in folders if i.startswith(NFC + "~"))
    assert re.fullmatch(NFC + r"~[0-9a-f]{8}", nfd_id) and folders[nfd_id].path.name == NFD
    assert folders[NFC].twins == (nfd_id,) and folders[nfd_id].twins == (NFC,)
    # a Cyrillic look-alike and the Latin name: both flagged, each naming the other
    assert folders["ada"].twins == (CYRILLIC_ADA,) and folders[CYRILLIC_ADA].twins == ("ada",)
    assert folders[HYPERLINK].twins == () and not folders[HYPERLINK].error
    assert list(folders) == sorted(folders)


def test_name_skeleton_folds_case_width_and_look_alikes():
    assert name_skeleton("ADA") == name_skeleton(CYRILLIC_ADA) == name_skeleton("ａｄａ")
    assert name_skeleton("\u03bftto") == name_skeleton("Otto")  # Greek omicron
    assert name_skeleton("ada") != name_skeleton("adam")


# -- a batch with bad names never stops ----------------------------------------------------

@pytest.mark.parametrize("jobs", ["1", "2"])
def test_batch_with_bad_names_grades_everyone_else(reference, tmp_path, stub, jobs, capsys):
    subs = bad_class(tmp_path / "subs")
    out = tmp_path / "out" / "scores.csv"
    assert grade(subs, reference, out, "--seed", "5", "--jobs", jobs) == 0
    rows = rows_of(out)
    assert len(rows) == 7
    invalid = {s: r for s, r in rows.items() if s.startswith(INVALID_PREFIX)}
    assert len(invalid) == 2 and all(r["total"] == "0" and "rename the folder" in r["error"]
                                     for r in invalid.values())
    assert sorted(set(stub)) == sorted(s for s in rows if s not in invalid)  # not run
    assert rows[HYPERLINK]["error"] == "" and float(rows[HYPERLINK]["total"]) > 0
    # no formula cell anywhere: the formula name is escaped, the others start harmlessly
    cells = raw_cells(out)
    assert "'" + HYPERLINK in cells and HYPERLINK not in cells
    assert not [c for c in cells if c.startswith(FORMULA_START)]
    # a feedback file per student, named from the id, short whatever the folder name
    feedback = sorted(p.name for p in (tmp_path / "out" / "feedback").iterdir())
    assert len(feedback) == 7 and all(len(n.encode()) <= 64 for n in feedback)
    assert {student_file_stem(s) + ".md" for s in rows} == set(feedback)
    instructor = tmp_path / "out" / "instructor"
    assert len(list(instructor.glob("*-09.md"))) == 7
    assert not [p for p in tmp_path.rglob("*.tmp")]
    # the twins are graded and flagged once (not once per lab), each naming the other
    ada, cyr = rows["ada"]["review"], rows[CYRILLIC_ADA]["review"]
    assert ada.count(NAME_FLAG) == 1 and ascii(CYRILLIC_ADA) in ada and "'ada'" in cyr
    nfd_id = next(s for s in rows if s.startswith(NFC + "~"))
    assert ascii(nfd_id) in rows[NFC]["review"] and ascii(NFC) in rows[nfd_id]["review"]
    assert "'ada'" in (instructor / "ada-10.md").read_text()
    printed = capsys.readouterr().out
    assert "graded 10, errored 4" in printed  # 5 good students x 2 labs; 2 refused x 2


def test_rows_are_the_same_under_jobs_1_and_jobs_2(reference, tmp_path, stub):
    subs = bad_class(tmp_path / "subs")
    make_class(subs, ["crash"])  # the stub raises for it: "grading failed"
    texts = []
    for jobs in ("1", "2"):
        out = tmp_path / f"out{jobs}" / "scores.csv"
        assert grade(subs, reference, out, "--seed", "5", "--jobs", jobs) == 0
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    assert "grading failed: RuntimeError: the grader broke" in rows_of(out)["crash"]["error"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_exception_while_writing_feedback_is_that_students_error_row(
        reference, tmp_path, stub, monkeypatch, jobs):
    real = report.write_feedback

    def full_disk(grades, folder, instructor=None):
        if grades[0].student == "cy":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(grades, folder, instructor)

    monkeypatch.setattr(report, "write_feedback", full_disk)
    subs = make_class(tmp_path / "subs")
    out = tmp_path / f"out{jobs}" / "scores.csv"
    assert grade(subs, reference, out, "--seed", "5", "--jobs", jobs) == 0
    rows = rows_of(out)
    assert sorted(rows) == ["ada", "bob", "cy", "dee", "eve", "fay", "gus"]  # none dropped
    assert rows["cy"]["total"] == "0" and rows["cy"]["09:check_base"] == "0"
    assert ("recording the grade failed (OSError: [Errno 28] No space left on device)"
            in rows["cy"]["error"])
    assert all(rows[s]["error"] == "" for s in rows if s != "cy")
    fb = tmp_path / f"out{jobs}" / "feedback"
    assert sorted(p.stem for p in fb.iterdir()) == ["ada", "bob", "dee", "eve", "fay", "gus"]


def test_on_student_failing_twice_still_returns_error_rows(reference, tmp_path, stub):
    subs = make_class(tmp_path / "subs", ["ada", "bob"])
    lines: list[str] = []

    def broken(student, grades):
        if student == "ada":
            raise OSError(errno.ENOSPC, "No space left on device")

    grades = grade_submissions(subs, reference, sandbox="none", seed=1, jobs=2,
                               on_student=broken, progress=lines.append)
    ada = [g for g in grades if g.student == "ada"]
    assert len(grades) == 4 and all(g.error.startswith("recording the grade failed")
                                    for g in ada)
    assert not [g for g in grades if g.student == "bob" and g.error]
    assert any("could not record the error row either" in ln for ln in lines)


def test_a_non_utf8_notebook_name_in_a_good_folder_is_written_escaped(reference, tmp_path,
                                                                     monkeypatch, capsys):
    """grade_notebook's messages quote the notebook's name: one that is not UTF-8 reaches
    scores.csv, the feedback and the terminal escaped, and stops nothing."""
    from perflab.course.submission import error_grade

    def unreadable(path, reference_path, *, student="", **_):
        return error_grade(student, lab_key(reference_path), Path(path), {"check_base": 1},
                           f"{Path(path).name} is not a valid notebook")

    monkeypatch.setattr(grading, "grade_notebook", unreadable)
    subs = make_class(tmp_path / "subs", ["ada"])
    (subs / "ada" / "09_mine.ipynb").unlink()
    with open(os.fsencode(subs / "ada") + b"/09_\xff.ipynb", "w") as f:
        f.write("{}")
    out = tmp_path / "out" / "scores.csv"
    assert grade(subs, reference, out, "--seed", "1", "--labs", "09") == 0
    assert "09_\\udcff.ipynb is not a valid notebook" in rows_of(out)["ada"]["error"]
    assert "09_\\udcff.ipynb" in (tmp_path / "out" / "feedback" / "ada.md").read_text()
    assert "graded 0, errored 1" in capsys.readouterr().out

def test_a_symlinked_student_folder_is_refused_and_not_run(reference, tmp_path, stub):
    subs = make_class(tmp_path / "subs", ["ada"])
    (subs / "zed").symlink_to(subs / "ada")
    grades = grade_submissions(subs, reference, sandbox="none", seed=1, labs=["09"])
    assert [(g.student, g.error[:40]) for g in grades] == [
        ("ada", ""), ("zed", "refused: the student folder 'zed' is a s")]
    assert stub == ["ada"]

def test_progress_that_cannot_print_a_name_says_it_in_ascii(reference, tmp_path, stub):
    subs = make_class(tmp_path / "subs", [NFC])
    lines: list[str] = []

    def ascii_terminal(line):
        line.encode("ascii")
        lines.append(line)

    grade_submissions(subs, reference, sandbox="none", seed=1, progress=ascii_terminal)
    assert any(ln.startswith("Jos\\xe9") for ln in lines)


# -- CSV escaping -------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "'=x", "''",
                                  "'plain", "plain", "", "1"])
def test_csv_text_escape_round_trips(text):
    escaped = escape_csv_text(text)
    assert not escaped.startswith(FORMULA_START)
    assert escaped == ("'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r", "'")
                       else text)
    assert unescape_csv_text(escaped) == text


def test_score_table_escapes_text_cells_and_keeps_numbers(tmp_path):
    """Decision: the text columns (student, review, error) are escaped, the number columns
    are the grader's own and stay numbers (a -1 stays -1); every cell is quoted, so a
    ';' in a text cell cannot start a new cell where ';' is the separator."""
    path = tmp_path / "scores.csv"
    table = ScoreTable(path, {"09": ["check_a"]})
    g = LabGrade("@ada", "09", None, [CheckResult("check_a", 2, -1.0, "failed")],
                 error="=cmd|' /C calc'!A0;=1+1")
    g.flags.append(Flag("my_x", 2, "-import os"))
    table.add("@ada", [g])
    table.add("+bob", [LabGrade("+bob", "09", None, [CheckResult("check_a", 2, 2, "passed")])])
    text = path.read_text()
    assert text.splitlines()[1] == ('"\'+bob","2","2","2","",""')
    assert '"\'@ada","-1","-1","2","lab 09: my_x line 2: -import os",' \
           '"lab 09: =cmd|\' /C calc\'!A0;=1+1"' in text
    assert all(line.startswith('"') and line.endswith('"') for line in text.splitlines())
    resumed = ScoreTable(path, {"09": ["check_a"]}, resume=True)
    assert resumed.students() == {"@ada", "+bob"}  # --resume skips them by their real id
    assert resumed.rows["@ada"][1] == "-1"
    with pytest.raises(ValueError, match="'check_a' holds '=1', not a number"):
        write_csv(tmp_path / "x.csv", ["student", "check_a"], [["ada", "=1"]],
                  text_columns=["student"])
    with pytest.raises(ValueError, match="not columns of the table"):
        write_csv(tmp_path / "x.csv", ["a"], [], text_columns=["b"])
    with pytest.raises(ValueError, match="a row has 1 cells, the header 2"):
        write_csv(tmp_path / "x.csv", ["a", "b"], [["1"]], text_columns=["a"])


def test_file_stems_are_short_safe_and_distinct(tmp_path):
    ids = ["ada", "b_wrong", "x.y-z", "invalid-name-0123456789", NFC, NFC + "~0123abcd",
           HYPERLINK, "-rf", ".hidden", "a b", "a_b", "\U0001F600" * 64, "ADA"]
    stems = [student_file_stem(i) for i in ids]
    assert stems[:4] == ids[:4]  # plain names stay as they are
    assert len(set(stems)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.~-]*", s) and len(s) <= 64
               for s in stems)
    assert stems[4].startswith("Jose~") and stems[6].startswith("_HYPERLINK")
    # a long file name: the temp file beside it stays short enough to create
    report._atomic_write(tmp_path / ("y" * 250), "ok")
    assert (tmp_path / ("y" * 250)).read_text() == "ok"


# -- shards and merge ------------------------------------------------------------------------

def test_shard_slices_partition_the_class_evenly():
    ids = [f"s{i:02d}" for i in range(10)]
    slices = [shard_slice(ids, (k, 3)) for k in range(3)]
    assert sorted(sum(slices, [])) == ids and [len(s) for s in slices] == [4, 3, 3]
    assert slices[1] == ["s01", "s04", "s07"]
    assert shard_slice(list(reversed(ids)), (1, 3)) == slices[1]  # order-free
    for bad in [(3, 3), (-1, 3), (0, 0)]:
        with pytest.raises(ValueError, match="0 <= K < N"):
            shard_slice(ids, bad)
    with pytest.raises(ValueError, match="0 <= K < N"):
        grade_submissions(".", ".", shard=(2, 2))


@pytest.fixture
def shards(reference, tmp_path, stub):
    """The class graded on one machine, and in 3 shards, with seed 7."""
    subs = bad_class(tmp_path / "subs")
    make_class(subs, ["bob", "cy", "dee"])
    assert grade(subs, reference, tmp_path / "all" / "scores.csv", "--seed", "7") == 0
    outs = []
    for k in range(3):
        out = tmp_path / f"shard{k}" / "scores.csv"
        assert grade(subs, reference, out, "--seed", "7", "--shard", f"{k}/3") == 0
        outs.append(out)
    return {"subs": subs, "outs": outs, "all": tmp_path / "all" / "scores.csv",
            "tmp": tmp_path, "reference": reference}


def test_shards_merged_equal_the_one_machine_table(shards, capsys):
    tmp = shards["tmp"]
    manifests = [json.loads(o.with_suffix(".manifest.json").read_text())
                 for o in shards["outs"]]
    assert [m["shard"] for m in manifests] == [[0, 3], [1, 3], [2, 3]]
    assert {m["seed"] for m in manifests} == {7} and all(m["complete"] for m in manifests)
    assert sorted(sum((m["students"] for m in manifests), [])) == manifests[0]["class"]
    assert len(manifests[0]["class"]) == 10
    merged = merge_scores([shards["outs"][2].parent, *shards["outs"][:2]], tmp / "m.csv")
    assert merged.read_text() == shards["all"].read_text()
    assert len(rows_of(merged)) == 10
    doc = json.loads((tmp / "m.manifest.json").read_text())
    assert doc["shard"] == [0, 1] and doc["students"] == doc["class"] and doc["seed"] == 7
    # the command line: a merged table can itself be merged (N = 1)
    capsys.readouterr()
    assert main(["course", "merge", *map(str, shards["outs"]), "--out",
                 str(tmp / "cli.csv")]) == 0
    assert "(10 students from 3 shard outputs)" in capsys.readouterr().out
    assert (tmp / "cli.csv").read_text() == shards["all"].read_text()
    assert merge_scores([tmp / "cli.csv"], tmp / "again.csv").read_text() == \
        shards["all"].read_text()


def _copy(out: Path, to: Path) -> Path:
    shutil.copytree(out.parent, to)
    return to / out.name


def _edit_manifest(csv_path: Path, **changes) -> None:
    m = csv_path.with_suffix(".manifest.json")
    doc = json.loads(m.read_text())
    doc.update(changes)
    m.write_text(json.dumps(doc))


def test_merge_refuses_overlaps_gaps_and_mismatches(shards):
    outs, tmp, subs, ref = shards["outs"], shards["tmp"], shards["subs"], shards["reference"]
    dest = tmp / "merged.csv"

    def refused(sources, match, exc=ValueError):
        with pytest.raises(exc, match=match):
            merge_scores(sources, dest)

    refused([outs[0], outs[0], outs[1]], r"field 'shard': .* are both slice 0/3; pass each "
                                         "slice's output once")
    refused(outs[:2], r"field 'shard': slice\(s\) 2/3 missing; grade them \(--shard K/3 "
                      r"--seed 7\)")
    # another seed
    other_seed = tmp / "seed8" / "scores.csv"
    assert grade(subs, ref, other_seed, "--seed", "8", "--shard", "2/3") == 0
    refused([outs[0], outs[1], other_seed], r"field 'seed': .* seed 8, .* with 7; .* same "
                                            "--seed")
    # other columns (fewer labs)
    one_lab = tmp / "onelab" / "scores.csv"
    assert grade(subs, ref, one_lab, "--seed", "7", "--shard", "2/3", "--labs", "09") == 0
    refused([outs[0], outs[1], one_lab], r"field 'columns': .* different columns "
                                         r"\(differing: \['10:check_answer'.* same --labs")
    # another cut
    halves = tmp / "halves" / "scores.csv"
    assert grade(subs, ref, halves, "--seed", "7", "--shard", "1/2") == 0
    refused([outs[0], halves], r"field 'shard': .* slice 1/2, .* slice 0/3; .* same N")
    # a shard that did not finish, or lost rows
    unfinished = _copy(outs[2], tmp / "unfinished")
    _edit_manifest(unfinished, complete=False)
    refused([outs[0], outs[1], unfinished], r"field 'complete': shard 2/3 .* did not finish;"
                                            r" .* --resume")
    short = _copy(outs[2], tmp / "short")
    lines = short.read_text().splitlines(keepends=True)
    short.write_text("".join(lines[:-1]))
    refused([outs[0], outs[1], short], r"field 'students': .* has no row for 1 of the 3 "
                                       r"students of slice 2/3 .* --resume")
    # a different class (another copy of the submissions folder)
    make_class(subs, ["zed"])
    other_class = tmp / "other" / "scores.csv"
    assert grade(subs, ref, other_class, "--seed", "7", "--shard", "2/3") == 0
    refused([outs[0], outs[1], other_class], r"field 'class': .* saw 11 student folders, "
                                             r".* saw 10 \(differing: 'zed'\); .* same "
                                             "submissions folder")
    # no manifest, no source, nothing
    bare = tmp / "bare.csv"
    shutil.copy(outs[0], bare)
    refused([bare], r"no manifest .*bare.manifest.json", FileNotFoundError)
    refused([tmp / "nope"], "no shard output", FileNotFoundError)
    refused([], "needs the outputs of the shards")
    broken = _copy(outs[2], tmp / "broken")
    _edit_manifest(broken, seed="7")
    refused([broken], r"field 'seed' is missing or not an integer")
    assert not dest.exists()


def test_grade_shard_needs_a_seed_and_a_valid_slice(reference, tmp_path, capsys):
    with pytest.raises(ValueError, match="--shard 1/3 needs --seed: every shard must draw"):
        grade(tmp_path, reference, tmp_path / "s.csv", "--shard", "1/3")
    for bad in ("3/3", "1of3", "-1/2"):
        with pytest.raises(SystemExit):
            grade(tmp_path, reference, tmp_path / "s.csv", "--shard", bad)
    assert "0 <= K < N" in capsys.readouterr().err
    assert main(["course", "merge", str(tmp_path / "nope.csv")]) == 2
    assert "no shard output" in capsys.readouterr().err


def test_resume_continues_with_the_manifests_seed_and_shard(reference, tmp_path, stub):
    subs = make_class(tmp_path / "subs")
    out = tmp_path / "s1" / "scores.csv"
    assert grade(subs, reference, out, "--seed", "7", "--shard", "1/3") == 0
    with pytest.raises(ValueError, match=r"--resume: .* was graded with --seed 7 \(field "
                                         r"'seed' of .*scores.manifest.json\); pass that seed"):
        grade(subs, reference, out, "--seed", "8", "--shard", "1/3", "--resume")
    with pytest.raises(ValueError, match=r"holds slice 1/3 .* pass --shard 1/3, or another"):
        grade(subs, reference, out, "--seed", "7", "--shard", "2/3", "--resume")
    stub.clear()
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]))  # as if it had stopped before its last student
    assert grade(subs, reference, out, "--shard", "1/3", "--resume") == 0  # seed 7 again
    assert len(stub) == 2 and json.loads(out.with_suffix(".manifest.json").read_text())[
        "seed"] == 7
    whole = tmp_path / "whole" / "scores.csv"
    assert grade(subs, reference, whole, "--seed", "7") == 0
    for k in (0, 2):
        assert grade(subs, reference, tmp_path / f"s{k}" / "scores.csv", "--seed", "7",
                     "--shard", f"{k}/3") == 0
    merged = merge_scores([tmp_path / f"s{k}" for k in range(3)], tmp_path / "m.csv")
    assert merged.read_text() == whole.read_text()


def test_read_manifest_refuses_what_grade_did_not_write(tmp_path):
    bad = tmp_path / "x.manifest.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        report.read_manifest(bad)
    bad.write_text(json.dumps({"version": 2, "scores": "x.csv", "seed": 1, "shard": [0, 1],
                               "complete": True, "columns": [], "class": [],
                               "students": []}))
    with pytest.raises(ValueError, match="field 'version' is 2, this perflab reads version 1"):
        report.read_manifest(bad)
    with pytest.raises(ValueError, match="field 'version' is 2"):
        merge_scores([bad], tmp_path / "m.csv")  # a manifest itself is a source too
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no \\*.manifest.json in the folder"):
        merge_scores([tmp_path / "empty"], tmp_path / "m.csv")
