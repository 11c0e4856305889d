"""The review column's scan (perflab.course.answers.scan_answer): every member of the exec
family (how a second copy of a forbidden helper's code is made at run time) is a finding,
and the review column is empty for every reference answer of every lab and every honest
variant the tests hold (no noise: an instructor reads a column that only speaks up when
it matters)."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import nbformat
import pytest

from perflab.course.answers import (COURSE_ALLOW, allowances, answers_of, scan_answer)
from perflab.course.checks import parse_python

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def _keys(src: str, allow=()) -> set[str]:
    return {f.key for f in scan_answer("ex", src, allow)}


@pytest.mark.parametrize("src, keys", [
    ("exec(open('helpers.py').read())", {"name exec"}),
    ("f = eval('lambda x: x')", {"name eval"}),
    ("c = compile(src, 'x', 'exec')", {"name compile"}),
    ("import runpy\nns = runpy.run_path('copy.py')", {"import runpy", "exec family run_path"}),
    ("from runpy import run_module", {"import runpy", "exec family run_module"}),
    ("import cProfile\ncProfile.Profile().runctx(src, g, g)", {"exec family runctx"}),
    ("import cProfile\ncProfile.run(src)", {"attribute cProfile.run", "exec family run"}),
    ("import profile as p\np.run(src)", {"attribute profile.run", "exec family run"}),
    ("prof = cProfile.Profile()\nprof.run(src)", {"exec family run"}),
    ("with cProfile.Profile() as prof:\n    prof.run(src)", {"exec family run"}),
    ("from cProfile import runctx", {"import cProfile.runctx", "exec family runctx"}),
    ("import importlib.util as u\nspec = u.spec_from_file_location('m', path)\n"
     "m = u.module_from_spec(spec)\nspec.loader.exec_module(m)",
     {"import importlib.util", "exec family spec_from_file_location",
      "exec family module_from_spec", "exec family exec_module"}),
    ("from importlib.machinery import SourceFileLoader\n"
     "m = SourceFileLoader('m', path).load_module()",
     {"import importlib.machinery", "exec family SourceFileLoader", "exec family load_module"}),
    ("m = perflab.labs.checking.importlib.util.spec_from_file_location('m', p)",
     {"attribute importlib", "exec family spec_from_file_location"}),
    ("import types\nf = types.FunctionType(code, {})",
     {"attribute types.FunctionType", "exec family FunctionType"}),
    ("from types import FunctionType, CodeType",
     {"import types.FunctionType", "import types.CodeType", "exec family FunctionType",
      "exec family CodeType"}),
    ("code = f.__code__.replace(co_consts=(1,))",
     {"attribute __code__", "exec family code.replace"}),
    ("g.__code__ = f.__code__", {"attribute __code__", "exec family __code__ assignment"}),
    ("fn = getattr(prof, 'runctx')", {"getattr runctx"}),
    ("import inspect\nframe = inspect.currentframe()", {"attribute inspect.currentframe"}),
    ("from inspect import stack, signature", {"import inspect.stack"}),
    ("import inspect\nf = getattr(inspect, 'current' + 'frame')", {"module inspect"}),
    ("perflab.labs.checking.sys.settrace(None)", {"attribute sys.settrace"}),
    ("import sys\nhook = sys.gettrace()", {"attribute sys.gettrace"}),
    ("from perflab.labs.checking import watch_calls", {"import perflab.labs.checking"}),
    ("import pdb, trace, pkgutil", {"import pdb", "import trace", "import pkgutil"}),
    ("from pathlib import Path\nPath(p).open('w').write(x)", {"open for writing"}),
    ("import io\nio.open(p, 'a').write(x)", {"open for writing"}),
])
def test_the_exec_family_and_its_neighbours_are_findings(src, keys):
    assert _keys(src) == keys


@pytest.mark.parametrize("src", [
    "import inspect\nparams = inspect.signature(fn).parameters",
    "from inspect import signature, isclass",
    "from types import SimpleNamespace\nns = SimpleNamespace(a=1)",
    "import types\nns = types.SimpleNamespace(a=1)",
    "import cProfile, pstats\nprof = cProfile.Profile()\nprof.enable()\nf()\nprof.disable()\n"
    "stats = pstats.Stats(prof)",
    "lp = line_profiler.LineProfiler(f)\nlp.runcall(f, 1)",
    "from torch.profiler import profile\nwith profile() as prof:\n    prof.step()",
    "cfg = dataclasses.replace(cfg, batch_size=8)\ntext = s.replace('a', 'b')",
    "from pathlib import Path\nrows = Path('data.txt').open().read()",
    "import io\nbuf = io.open('x.txt', 'r').read()",
    "model = torch.compile(model)\nrx = re.compile('a+')\nmodel.eval()",
    "import subprocess_like_name\nsubprocess_like_name.run()",
    "import numpy as np\naddress = np.zeros(3).ctypes.data",
])
def test_honest_idioms_are_not_findings(src):
    assert _keys(src) == set()


def test_documented_torch_settings_are_allowed_in_every_answer_through_allowances():
    src = ("torch.backends.cudnn.benchmark = True\n"
           "torch.backends.cuda.matmul.allow_tf32 = False\n"
           "torch._dynamo.config.cache_size_limit = 64\n"
           "torch.backends.cudnn.is_available = lambda: True\n")
    assert _keys(src, COURSE_ALLOW) == {"module attribute torch.backends.cudnn.is_available"}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "x = 1", metadata={"nbgrader": {"solution": True, "grade_id": "a"},
                           "perflab": {"allow": ["import gc"]}})])
    assert allowances(nb) == {"a": COURSE_ALLOW + ("import gc",)}


def _answer_cells():
    for path in SOLUTIONS:
        nb = nbformat.read(str(path), as_version=4)
        answers, _ = answers_of(nb, nb)
        allow = allowances(nb)
        for gid, src in answers.items():
            yield path.name, gid, src, allow.get(gid, ())


def test_no_reference_answer_of_any_lab_is_flagged():
    cells = list(_answer_cells())
    assert len(SOLUTIONS) == 13 and len(cells) > 60
    flagged = [f"{name}: {flag} | {flag.text}" for name, gid, src, allow in cells
               for flag in scan_answer(gid, src, allow)]
    assert flagged == []


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _strings(v)


def _honest_variants() -> list[tuple[str, str]]:
    """Every honest answer the tests hold: module-level names with "honest" in them
    (strings, dicts, tuples), entries keyed "honest..." of module-level dicts, and
    ``honest = "..."`` literals inside test functions."""
    out = []
    files = sorted((ROOT / "tests" / "labs").glob("test_lab*_checks.py")) + \
        sorted((ROOT / "tests" / "course").glob("test_grading*.py"))
    for path in files:
        module = importlib.import_module(
            ".".join(path.relative_to(ROOT).with_suffix("").parts))
        found = []
        for name, value in vars(module).items():
            if "honest" in name.lower() and not callable(value):
                found.append(value)
            if isinstance(value, dict):
                found += [v for k, v in value.items()
                          if isinstance(k, str) and "honest" in k.lower()]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and "honest" in t.id.lower() for t in node.targets):
                try:
                    found.append(ast.literal_eval(node.value))
                except ValueError:
                    pass  # computed: the module-level value above has it
        out += [(path.name, s) for s in _strings(found)]
    return out


def test_no_honest_variant_in_the_tests_is_flagged():
    variants = _honest_variants()

    def parses(src):
        try:
            parse_python(src)
            return True
        except SyntaxError:
            return False

    assert sum(parses(s) and "\n" in s for _, s in variants) > 40  # the check is not vacuous
    flagged = [f"{name}: {flag} | {flag.text}" for name, src in variants
               for flag in scan_answer("honest", src, COURSE_ALLOW)]
    assert flagged == []


# The notebook's shell (issue 43, item 2): a held-out attack round reached IPython's shell
# from an answer without a flagged name (``exit._ip``, ``get_ipython()`` in a
# ``%%writefile`` body that the magic's allowance covered) and rewrote later cells with an
# input transformer or a ``pre_run_cell`` callback. Each attack beside an honest neighbour.
SHELL_ALLOW = ("name get_ipython", "IPython run_cell_magic")  # the %%writefile cells' metadata


@pytest.mark.parametrize("src, keys", [
    ("ip = exit._ip", {"name exit", "attribute _ip"}),
    ("quit._ip.input_transformers_post.append(rewrite)",
     {"name quit", "attribute _ip", "IPython input_transformers_post"}),
    ("holders = [exit, quit]", {"name exit", "name quit"}),
    ("shell = getattr(quit, '_ip')", {"name quit", "getattr _ip"}),
    ("shell = _ip", {"name _ip"}),
    ("%%writefile mymod.py\ndef hook():\n    return get_ipython()", {"name get_ipython"}),
    ("get_ipython().input_transformers_cleanup.insert(0, rewrite)",
     {"name get_ipython", "IPython input_transformers_cleanup"}),
    ("manager = shell.input_transformer_manager", {"IPython input_transformer_manager"}),
    ("shell.ast_transformers.append(node_rewriter)", {"IPython ast_transformers"}),
    ("shell.events.register('pre_run_cell', rewrite)", {"IPython events"}),
    ("events.register(rewrite)", {"IPython events"}),
    ("ev = shell.events\nev.register('post_run_cell', rewrite)", {"IPython events"}),
    ("shell.events.unregister('pre_execute', rewrite)", {"IPython events"}),
    ("shell.register_magic_function(fake, 'cell', 'writefile')",
     {"IPython register_magic_function"}),
    ("shell.set_custom_exc((Exception,), swallow)", {"IPython set_custom_exc"}),
    ("shell.user_ns['check_answer'] = lambda *a: None", {"IPython user_ns"}),
    ("f = getattr(shell, 'input_transformers_post')", {"getattr input_transformers_post"}),
    ("import sys\nsys.modules['json'] = fake", {"attribute sys.modules"}),
    ("import sys\nsys.modules.pop('perflab.timing')", {"attribute sys.modules"}),
    ("import sys\ndel sys.modules['perflab']", {"attribute sys.modules"}),
    ("import sys\nsys.modules.update(json=fake)", {"attribute sys.modules"}),
    ("import sys\nsys.modules.setdefault('json', fake)", {"attribute sys.modules"}),
    ("import sys as s\ns.modules['json'] = fake", {"attribute sys.modules"}),
    ("from sys import modules\nmodules['json'] = fake", {"attribute sys.modules"}),
    ("from sys import modules as m", {"attribute sys.modules"}),
    ("from sys import *", {"attribute sys.*"}),
    ("mods = getattr(sys, 'modules')", {"getattr modules"}),
    ("from os import system", {"attribute os.system"}),
    # a cell magic is found where IPython finds it, so is its body
    ("\n\n%%writefile mymod.py\nip = get_ipython()", {"name get_ipython"}),
    ("  %%writefile mymod.py\n  ip = get_ipython()", {"name get_ipython"}),
    ("%%capture\nget_ipython().events.register('pre_run_cell', f)",
     {"name get_ipython", "IPython events"}),
    ("%%time\nip = get_ipython()\n%run evil.py", {"name get_ipython", "IPython run_line_magic"}),
    ("%%timeit -n 3 import os; os.system('ls')\nf()", {"attribute os.system", "IPython system"}),
    ("%%writefile torch.py\nx = 1", {"writefile target torch.py"}),
    ("%%writefile sitecustomize.py\nx = 1", {"writefile target sitecustomize.py"}),
    ("%%writefile -a conftest.py\nx = 1", {"writefile target conftest.py"}),
    ("%%writefile ../../grader.py\nx = 1", {"writefile target ../../grader.py"}),
    ("%%writefile {target}\nnot python (", {"writefile target {target}"}),
])
def test_reaching_the_notebooks_shell_is_a_finding(src, keys):
    assert _keys(src) == keys
    assert _keys(src, SHELL_ALLOW + COURSE_ALLOW) == keys  # never covered by an allowance


@pytest.mark.parametrize("src", [
    "exit()", "quit()", "import sys\nsys.exit(1)", "ip = '10.0.0.1'\nhosts = [ip]",
    "dev = rt.events[rt.events.stream >= 0]\nrows = prof.events()",
    "registry.register('resnet18', build)\nmodel.register_buffer('mask', m)",
    "transformer = model.transformer\nns = dict(user='a')",
    "for m in model.modules():\n    m.eval()\nn = len(list(model.named_modules()))",
    "import os\nthreads = os.cpu_count()", "import sys\nsize = sys.getsizeof(x)",
    "from sys import getsizeof, version_info", "from os import cpu_count, path",
    "w = getattr(model, 'weight')",
    "%time loss = step()", "%%time\nloss = step()", "%%timeit -n 3 -r 2\nstep()",
    "%%timeit x = make_batch()\nstep(x)", "%%capture out\nstep()",
    "%%writefile mymod.py\nimport os\nimport sys\n\n\ndef sizes(x):\n"
    "    return sys.getsizeof(x), os.cpu_count()\n",
    "\n%%writefile -a mymod.py\ndef f():\n    return 1",
])
def test_honest_neighbours_of_the_shell_findings_are_not_findings(src):
    assert _keys(src) == set()


def test_an_allowance_of_the_shell_covers_a_line_magics_own_line_only():
    allow = ("name get_ipython", "IPython run_line_magic", "IPython run_cell_magic")
    assert _keys("%matplotlib inline\nx = 1", allow) == set()
    assert [(f.line, f.key) for f in scan_answer(
        "ex", "\n%matplotlib inline\nip = get_ipython()", allow)] == [(3, "name get_ipython")]
    # IPython hands another cell magic its body on the magic's line: not covered
    assert _keys("%%bash\nrm -rf ~", allow) == {"name get_ipython", "IPython run_cell_magic"}
    # a line that looks like a transformed magic but is the student's Python: not covered
    assert _keys("get_ipython().run_line_magic('matplotlib', 'inline')", allow) == {
        "name get_ipython", "IPython run_line_magic"}
    assert _keys('x = """\n%"""; get_ipython()', allow) == {"name get_ipython"}


def test_a_writefile_answer_of_the_references_keeps_no_allowance_for_its_body():
    """Lab 06's ``ddp_file`` cell allows ``name get_ipython`` (its metadata): a line added
    to the module that reaches the shell is still a finding, on its own line."""
    nb = nbformat.read(str(ROOT / "solutions" / "06_ddp_overlap.ipynb"), as_version=4)
    answers, _ = answers_of(nb, nb)
    allow = allowances(nb)["ddp_file"]
    assert "name get_ipython" in allow
    assert scan_answer("ddp_file", answers["ddp_file"], allow) == []
    src = answers["ddp_file"].rstrip("\n") + ("\n_shell = get_ipython()\n"
                                              "_shell.events.register('pre_run_cell', _hook)\n")
    n = src.count("\n")
    assert [(f.line, f.key) for f in scan_answer("ddp_file", src, allow)] == [
        (n - 1, "name get_ipython"), (n, "IPython events")]
    assert scan_answer("ddp_file", "\n" + answers["ddp_file"], allow) == []


# -- what one exercise forbids (solution-cell metadata perflab.forbid; Lab 11's attention) --------
_FORBID = ["scaled_dot_product_attention", "_scaled_dot_product_*", "torch.nn.attention",
           "flex_attention"]


def test_scan_forbidden_flags_calls_strings_and_dotted_imports_not_comments():
    from perflab.course.answers import scan_forbidden

    src = ("%%writefile ring_student.py\n"
           "import torch.nn.functional as F\n"
           "# not F.scaled_dot_product_attention: tiles\n"
           "o = F.scaled_dot_product_attention(q, k, v)\n"
           "op = getattr(torch.ops.aten, '_scaled_dot_product_flash_attention')\n"
           "from torch.nn.attention import sdpa_kernel\n"
           "my_flex_attention_free = 1  # a longer name is not the forbidden one\n")
    flags = scan_forbidden("ring_file", src, _FORBID)
    assert [(f.line, f.key) for f in flags] == [
        (4, "forbidden scaled_dot_product_attention"), (5, "forbidden _scaled_dot_product_*"),
        (6, "forbidden torch.nn.attention")]
    assert flags[0].text == "o = F.scaled_dot_product_attention(q, k, v)"
    assert scan_forbidden("ring_file", src, ()) == []


def test_lab11_forbids_the_attention_kernels_and_its_reference_uses_none():
    from perflab.course.answers import forbidden_names, scan_forbidden
    from tests.labs.labcheck import Lab

    lab = Lab("11")
    forbid = forbidden_names(lab.nb)
    assert {"tiled_attention", "flash_backward", "triton_attention", "ring_file"} <= set(forbid)
    for gid, names in forbid.items():
        assert "scaled_dot_product_attention" in names and "_flash_attention_*" in names
        assert scan_forbidden(gid, lab.solution(gid), names) == [], gid
