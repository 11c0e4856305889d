"""perflab: measured, hands-on labs for making PyTorch training fast.

The names the labs use are re-exported here. Importing perflab has no side effects: no
CUDA initialisation, no logging set-up, no global torch flags.
"""
from perflab.config import RunConfig
from perflab.diagnosis import diagnose
from perflab.env import env_summary
from perflab.measurement import Measurement, compare, compare_table
from perflab.profiling import profile
from perflab.result import RunResult
from perflab.timing import PhaseTimer, measure
from perflab.train import run, train_step
from perflab.widgets import experiment_panel

__all__ = [
    "RunConfig", "RunResult", "Measurement", "PhaseTimer", "compare", "compare_table",
    "diagnose", "env_summary", "experiment_panel", "measure", "profile", "run", "train_step",
]
__version__ = "0.1.0"
