"""`import perflab` has no side effects (launching DDP from a notebook depends on it)."""
from __future__ import annotations

import subprocess
import sys


def test_import_has_no_side_effects():
    code = (
        "import logging, torch\n"
        "threads = torch.get_num_threads(); handlers = list(logging.getLogger().handlers)\n"
        "dtype = torch.get_default_dtype()\n"
        "import perflab\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised at import'\n"
        "assert torch.get_num_threads() == threads, 'thread count changed at import'\n"
        "assert logging.getLogger().handlers == handlers, 'logging configured at import'\n"
        "assert torch.get_default_dtype() == dtype\n"
        "import sys; assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "assert 'nbgrader' not in sys.modules\n"
        "print(sorted(perflab.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "RunConfig" in out.stdout and "experiment_panel" in out.stdout


def test_cli_and_rank_worker_do_not_import_scipy_stats():
    # Every spawned rank and every CLI command imports these; scipy.stats alone takes
    # seconds to import on a busy 2-core machine, so it is imported where it is used.
    code = ("import sys, perflab.cli, perflab.core.config, perflab.distributed.worker\n"
            "perflab.cli.build_parser()\n"
            "assert 'scipy.stats' not in sys.modules, 'scipy.stats imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
