"""The delegation spy (perflab.labs.checking.watch_calls, behind run_cases' ``forbid``)
sees a forbidden helper wherever it runs: a thread (new or already running), a forked or
spawned child process (DataLoader workers too), a second copy of its code (the module's
source run again by exec, cProfile's runctx, runpy, importlib), a C function; honest code
records nothing, profilers do not blind it, and it leaves nothing behind.

The children's targets live in tests/course/spy_children.py (a spawned child imports them).
"""
from __future__ import annotations

import concurrent.futures as cf
import cProfile
import importlib.util
import inspect
import multiprocessing as mp
import os
import runpy
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from tests.conftest import slow
from tests.course import spy_children as kids
from perflab.analysis import stragglers
from perflab.course.cases import run_cases
from perflab.labs.checking import SWITCHED_OFF, code_fingerprint, resolve, watch_calls

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = {kids.FORBIDDEN: stragglers.predicted_slowdown}


def _in_process(ctx: str, fn, *args) -> int:
    p = mp.get_context(ctx).Process(target=fn, args=args)
    p.start()
    p.join(60)
    return p.exitcode


# --- threads --------------------------------------------------------------------------------
def test_a_call_from_a_thread_started_in_the_block_is_recorded():
    with watch_calls(TARGET) as hits:
        with cf.ThreadPoolExecutor(2) as pool:
            assert pool.submit(kids.delegate).result() == 1.5
    assert hits == [kids.FORBIDDEN]


def test_a_call_from_a_thread_that_already_ran_is_recorded():
    """A pool made before the block (an earlier cell) whose idle worker runs the call."""
    pool = cf.ThreadPoolExecutor(1)
    try:
        pool.submit(len, "warm").result()   # the worker thread exists and waits
        with watch_calls(TARGET) as hits:
            pool.submit(kids.delegate).result()
        with watch_calls(TARGET) as clean:
            pool.submit(kids.honest).result()
    finally:
        pool.shutdown()
    assert hits == [kids.FORBIDDEN] and clean == []


def test_a_plain_thread_and_an_honest_thread():
    with watch_calls(TARGET) as hits:
        t = threading.Thread(target=kids.honest)
        t.start()
        t.join()
    assert hits == []
    with watch_calls(TARGET) as hits:
        t = threading.Thread(target=kids.delegate)
        t.start()
        t.join()
    assert hits == [kids.FORBIDDEN]


# --- child processes ------------------------------------------------------------------------
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_a_call_in_a_child_process_is_recorded(ctx):
    with watch_calls(TARGET) as hits:
        assert _in_process(ctx, kids.delegate) == 0
        assert hits == []   # the child's hit is in the file until the block ends
    assert hits == [kids.FORBIDDEN]


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_an_honest_child_process_records_nothing(ctx):
    with watch_calls(TARGET) as hits:
        assert _in_process(ctx, kids.honest) == 0
    assert hits == []


def test_a_copy_of_the_code_in_a_spawned_child_is_recorded():
    with watch_calls(TARGET) as hits:
        assert _in_process("spawn", kids.copy_and_call) == 0
    assert hits == [kids.FORBIDDEN]


def test_a_spawned_child_gets_a_target_list_larger_than_a_pipe_buffer():
    scope: dict = {}
    exec("".join(f"def f{i}():\n    return {i}\n" for i in range(800)), scope)  # noqa: S102
    many = {f"{'x' * 80}{i}": scope[f"f{i}"] for i in range(800)}
    with watch_calls({**many, **TARGET}) as hits:
        assert _in_process("spawn", kids.delegate) == 0
    assert hits == [kids.FORBIDDEN]


def test_a_forkserver_started_in_the_block_is_recorded(tmp_path):
    """In a fresh interpreter: a forkserver already running in this test process (from
    another test) would have been started before the block, which is a documented limit."""
    script = textwrap.dedent(f"""
        import multiprocessing as mp, sys
        sys.path.insert(0, {os.getcwd()!r})
        from perflab.labs.checking import watch_calls
        from tests.course import spy_children as kids
        if __name__ == "__main__":
            with watch_calls({{kids.FORBIDDEN: kids.stragglers.predicted_slowdown}}) as hits:
                p = mp.get_context("forkserver").Process(target=kids.delegate)
                p.start(); p.join(60)
            print("HITS", hits, p.exitcode)
    """)
    (tmp_path / "fs.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "fs.py")], capture_output=True,
                         text=True, timeout=120)
    assert f"HITS ['{kids.FORBIDDEN}'] 0" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("ctx", ["fork", pytest.param("spawn", marks=slow)])
def test_a_call_in_a_dataloader_worker_is_recorded(ctx):
    import torch.utils.data as tud

    for fn, expected in [("delegate", [kids.FORBIDDEN]), ("honest", [])]:
        loader = tud.DataLoader(kids.Items(fn), batch_size=None, num_workers=1,
                                multiprocessing_context=ctx)
        with watch_calls(TARGET) as hits:
            assert [float(v) for v in loader] == [1.5, 1.5]
        assert hits == expected, fn


def test_run_cases_fails_an_answer_that_delegates_from_a_thread_or_a_process():
    def cases(rng):
        return [[1.0, 0.5], [2.0, 1.0]]

    def judge(case, got):
        assert abs(got - (case[0] + case[1]) / case[0]) < 1e-12

    run_cases(cases, lambda c: kids.honest(*c), judge, forbid=[kids.FORBIDDEN])
    with pytest.raises(AssertionError, match=f"ran perflab's {kids.FORBIDDEN}"):
        run_cases(cases, lambda c: cf.ThreadPoolExecutor(1).submit(kids.delegate, *c).result(),
                  judge, forbid=[kids.FORBIDDEN])

    def in_a_child(case):
        with mp.get_context("fork").Pool(1) as pool:
            return pool.apply(kids.delegate, case)

    with pytest.raises(AssertionError, match=f"ran perflab's {kids.FORBIDDEN}"):
        run_cases(cases, in_a_child, judge, forbid=[kids.FORBIDDEN])


# --- copies of the code ---------------------------------------------------------------------
def _exec_copy():
    scope = {"__name__": stragglers.__name__}
    exec(compile(inspect.getsource(stragglers), "<copy>", "exec"), scope)  # noqa: S102
    return scope["predicted_slowdown"]


def _runctx_copy():
    scope = {"__name__": stragglers.__name__}
    cProfile.Profile().runctx(inspect.getsource(stragglers), scope, scope)
    return scope["predicted_slowdown"]


def _file_copy(how):
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "my_helpers.py")
    with open(path, "w") as f:
        f.write(inspect.getsource(stragglers))
    if how == "runpy":
        return runpy.run_path(path, run_name=stragglers.__name__)["predicted_slowdown"]
    spec = importlib.util.spec_from_file_location(stragglers.__name__, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.predicted_slowdown


@pytest.mark.parametrize("make", [_exec_copy, _runctx_copy, lambda: _file_copy("runpy"),
                                  lambda: _file_copy("importlib")],
                         ids=["exec", "cProfile-runctx", "runpy", "importlib-file"])
def test_a_second_copy_of_the_code_is_recorded(make):
    with watch_calls(TARGET) as hits:
        copy = make()
        assert copy is not stragglers.predicted_slowdown
        assert copy.__code__ is not stragglers.predicted_slowdown.__code__
        assert hits == []   # defining the copy runs module code, not the helper
        assert copy(1.0, 0.5) == 1.5
    assert hits == [kids.FORBIDDEN]


def test_the_fingerprint_sees_through_layout_but_not_other_code():
    def code_of(src, name="predicted_slowdown", filename="<a>"):
        scope: dict = {}
        exec(compile(src, filename, "exec"), scope)  # noqa: S102
        return scope[name].__code__

    real = code_fingerprint(stragglers.predicted_slowdown.__code__)
    src = inspect.getsource(stragglers.predicted_slowdown)
    relaid = ("\n\n\n" + src.replace('    """', '    # a comment\n    """', 1)
              .replace("return (step_s + delay_s) / step_s", "return (step_s+delay_s)/step_s"))
    undocumented = src.split('"""')[0] + src.split('"""')[2]
    assert code_fingerprint(code_of(src, filename="elsewhere.py")) == real
    assert code_fingerprint(code_of(relaid)) == real
    assert code_fingerprint(code_of(undocumented)) == real
    # an honest function of the same name and its own body; a renamed copy; other names
    honest = "def predicted_slowdown(step_s, delay_s):\n    return 1 + delay_s / step_s\n"
    renamed = src.replace("def predicted_slowdown", "def my_slowdown")
    other_vars = src.replace("step_s", "s")
    assert code_fingerprint(code_of(honest)) != real
    assert code_fingerprint(code_of(renamed, "my_slowdown"))[1] != real[1]
    assert code_fingerprint(code_of(other_vars)) != real


def test_an_honest_function_with_the_helpers_name_records_nothing():
    scope: dict = {}
    exec("def predicted_slowdown(step_s, delay_s):\n"  # noqa: S102
         "    return (step_s + delay_s) / step_s\n", scope)
    with watch_calls(TARGET) as hits:
        assert scope["predicted_slowdown"](1.0, 0.5) == 1.5
    assert hits == []


# --- C functions, classes, refusals ---------------------------------------------------------
def test_a_c_function_is_watched_here_and_in_a_spawned_child():
    import math

    with watch_calls({"math.sqrt": math.sqrt}) as hits:
        kids.square_root()
    assert hits == ["math.sqrt"]
    with watch_calls({"math.sqrt": math.sqrt}) as hits:
        assert _in_process("spawn", kids.square_root) == 0
    assert hits == ["math.sqrt"]
    with watch_calls({"math.sqrt": math.sqrt}) as hits:
        kids.honest()
    assert hits == []


def test_a_target_the_spy_cannot_see_is_refused_before_anything_changes():
    before = (sys.getprofile(), sys.gettrace())
    with pytest.raises(ValueError, match="has no Python code and is not a C function"):
        with watch_calls({"int": int}):
            pass
    with pytest.raises(ValueError, match="has no Python code"):
        run_cases(lambda rng: [1], lambda c: c, lambda c, g: None, forbid=["builtins.int"])
    assert (sys.getprofile(), sys.gettrace()) == before


# --- profilers, tracers, and what is left behind -------------------------------------------
def test_profilers_in_the_answer_do_not_blind_the_spy():
    line_profiler = pytest.importorskip("line_profiler")
    prof = cProfile.Profile()
    with watch_calls(TARGET) as hits:
        prof.enable()          # cProfile holds the profile hook: the trace hook watches
        kids.delegate()
        prof.disable()
    assert hits == [kids.FORBIDDEN]
    with watch_calls(TARGET) as hits:
        prof.enable()
        prof.disable()         # the profile hook is free: the trace hook puts it back
        lp = line_profiler.LineProfiler(kids.honest)
        lp.runcall(kids.honest)   # line_profiler holds the trace hook for a while
        kids.delegate()
    assert hits == [kids.FORBIDDEN]
    with watch_calls(TARGET) as hits:
        lp = line_profiler.LineProfiler(kids.delegate)
        lp.runcall(kids.delegate)  # called while line_profiler holds the trace hook
    assert hits == [kids.FORBIDDEN]


def test_switching_both_hooks_off_is_recorded_and_fails_the_check():
    with watch_calls(TARGET) as hits:
        sys.setprofile(None)
        sys.settrace(None)
        kids.delegate()
    assert hits == [SWITCHED_OFF]

    def off(case):
        sys.setprofile(None)
        sys.settrace(None)
        return kids.delegate(*case)

    with pytest.raises(AssertionError, match="could not be checked for delegation"):
        run_cases(lambda rng: [[1.0, 0.5]], off, lambda c, g: None, forbid=[kids.FORBIDDEN])


def test_nothing_is_left_behind_and_blocks_nest():
    import multiprocessing.util as mp_util

    before = (sys.getprofile(), sys.gettrace(), threading.getprofile(), threading.gettrace(),
              mp_util.spawnv_passfds)
    spy_dirs = set(os.listdir(tempfile.gettempdir()))
    with watch_calls(TARGET) as outer:
        with watch_calls({"dedent": textwrap.dedent}) as inner:
            textwrap.dedent(" a")
        kids.delegate()
        assert sys.gettrace() is not None and sys.getprofile() is not None  # outer still on
    assert outer == [kids.FORBIDDEN] and inner == ["dedent"]
    assert (sys.getprofile(), sys.gettrace(), threading.getprofile(), threading.gettrace(),
            mp_util.spawnv_passfds) == before
    left = {d for d in set(os.listdir(tempfile.gettempdir())) - spy_dirs
            if d.startswith("perflab-spy-")}
    assert not left
    with pytest.raises(RuntimeError):
        with watch_calls(TARGET):
            raise RuntimeError("student code failed")
    assert (sys.getprofile(), sys.gettrace()) == before[:2]


def _forbidden_names() -> set[str]:
    """Every name in a ``forbid=[...]`` of the solutions."""
    import json
    import re
    from pathlib import Path

    names = set()
    for nb in sorted((Path(__file__).resolve().parents[2] / "solutions").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            for found in re.findall(r"forbid=\[([^\]]*)\]", "".join(cell["source"])):
                names.update(re.findall(r"[\"']([\w.]+)[\"']", found))
    return names


def test_the_forbidden_names_of_every_lab_resolve_to_something_the_spy_sees():
    """Every ``forbid=[...]`` of the solutions names a function or class with Python code,
    or a C function: none is silently unwatched."""
    from perflab.labs.checking import _targets

    names = _forbidden_names()
    assert len(names) > 20
    codes, c_funcs, _ = _targets({n: resolve(n) for n in sorted(names)})
    assert set(codes.values()) | set(c_funcs.values()) == names


def test_no_reference_answer_has_the_fingerprint_of_a_forbidden_helper():
    """The reference solutions are honest: none of their functions (compiled, not run) is
    taken for a copy of a helper any lab forbids."""
    import types
    from pathlib import Path

    import nbformat

    from perflab.course.answers import _python_of, answers_of
    from perflab.labs.checking import _targets

    codes, _, _ = _targets({n: resolve(n) for n in sorted(_forbidden_names())})
    seen = 0
    for path in sorted((Path(__file__).resolve().parents[2] / "solutions").glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for gid, src in answers_of(nb, nb)[0].items():
            stack = [compile(_python_of(src), gid, "exec")]
            while stack:
                code = stack.pop()
                stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
                seen += 1
                assert code_fingerprint(code) not in codes, (path.name, gid, code.co_qualname)
    assert seen > 100


@slow
def test_in_a_jupyter_kernel_threads_children_and_copies_are_seen(tmp_path):
    """Where grading runs it: an IPython kernel (its own threads already running), a
    thread pool made in an earlier cell, a spawned child running a ``%%writefile``
    module, a copy made with cProfile's runctx; and an honest answer in the same kernel."""
    import nbformat
    from nbclient import NotebookClient

    cells = [
        "import concurrent.futures as cf, inspect, multiprocessing as mp, sys, cProfile\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from perflab.course.cases import run_cases\n"
        "from perflab.analysis import stragglers\n"
        "pool = cf.ThreadPoolExecutor(1)\n"
        "pool.submit(len, 'warm').result()",
        "%%writefile child_mod.py\n"
        "from perflab.analysis import stragglers\n"
        "def work(q, c):\n"
        "    q.put(stragglers.predicted_slowdown(*c))",
        "import child_mod\n"
        "def in_spawned_child(c):\n"
        "    ctx = mp.get_context('spawn'); q = ctx.Queue()\n"
        "    p = ctx.Process(target=child_mod.work, args=(q, c)); p.start()\n"
        "    v = q.get(timeout=120); p.join(); return v\n"
        "def in_copy(c):\n"
        "    g = {'__name__': stragglers.__name__}\n"
        "    cProfile.Profile().runctx(inspect.getsource(stragglers), g, g)\n"
        "    return g['predicted_slowdown'](*c)\n"
        "def judge(case, got):\n"
        "    assert abs(got - (case[0] + case[1]) / case[0]) < 1e-12\n"
        "verdicts = {}\n"
        "def in_old_thread(c):\n"
        "    return pool.submit(stragglers.predicted_slowdown, *c).result()\n"
        "for name, answer in [('old thread', in_old_thread),\n"
        "                     ('spawned child', in_spawned_child), ('copy', in_copy),\n"
        "                     ('honest', lambda c: (c[0] + c[1]) / c[0])]:\n"
        "    try:\n"
        "        run_cases(lambda rng: [[1.0, 0.5]], answer, judge,\n"
        "                  forbid=['predicted_slowdown'])\n"
        "        verdicts[name] = 'pass'\n"
        "    except AssertionError as e:\n"
        "        verdicts[name] = 'delegated' if 'ran perflab' in str(e) else str(e)\n"
        "print('VERDICTS', verdicts, sys.getprofile(), sys.gettrace())",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert ("VERDICTS {'old thread': 'delegated', 'spawned child': 'delegated', "
            "'copy': 'delegated', 'honest': 'pass'} None None") in out, out
