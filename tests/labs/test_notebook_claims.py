"""No typed-in results: the markdown of the labs states no measured figure.

Every number a lab shows about what happened must be an f-string over this run's
measurement (code output), never markdown prose. This test scans the markdown cells of
``solutions/NN_*.ipynb`` for a figure with a unit (time, memory, throughput, ratio,
percentage, FLOPs, pixels) and fails on any that is not a configured value or a cited
source, listed below per notebook with the reason it is not a result. Keep the lists
short: prefer rewriting the sentence, or printing the figure from a measurement.

Not scanned: code spans and code blocks (code, not claims), LaTeX (formulas), link
targets, and nbgrader solution cells (the students' written answers).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The labs whose markdown is scanned: every lab but 00 (the course index).
LABS_SCANNED = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]

_NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|(?:one|two|three|four|five|six|seven|eight|nine|ten|a few|several|half a)\b)"
_RANGE = rf"{_NUM}(?:\s?(?:-|–|to)\s?{_NUM})?"
_UNIT = (r"(?:ns|us|µs|ms|s|secs?|seconds?|minutes?|mins?|hours?|"
         r"bytes?|KB|KiB|MB|MiB|GB|GiB|TB|TiB|"
         r"%|percent|x|×|times (?:faster|slower|more|less)|"
         r"[GMT]?FLOPs?(?:/s)?|[GMT]?FLOP|samples/s|images/s|it/s|steps/s|[GKMT]B/s|px|pixels|"
         # a machine's core count is a fact of the machine the lab ran on: print it from
         # os.sched_getaffinity / perflab's core label, never type it ("4 ranks share 2 cores")
         r"(?:CPU |physical |logical )?cores?|(?:logical )?CPUs)")
#: A figure with a unit: "35 ms", "1.5 GiB", "3.2x", "95 %", "about three minutes".
FIGURE = re.compile(rf"(?<![\w.#/]){_RANGE}\s?{_UNIT}(?![\w/])")

#: Every lab: (pattern, why it is not a typed-in result).
COMMON: list[tuple[str, str]] = [
    (r"95 % (?:bootstrap )?(?:confidence|CI)", "the confidence level of an interval: a setting, not a result"),
]
#: Per lab: (pattern, why it is not a typed-in result). Patterns match the figure's
#: context (40 characters either side); a figure is allowed when one matches there.
ALLOWED: dict[str, list[tuple[str, str]]] = {
    "01": [],
    "02": [],
    "03": [],
    "04": [
        (r"preset \((?:224|64) px", "the image sizes of the full and quick presets (RunConfig)"),
        (r"must drop by at least 45 %", "the check's pass threshold, a configured value"),
        (r"you need to be within 10 %", "the prediction check's tolerance, a configured value"),
    ],
    "05": [],
    "06": [],
    "07": [],
    "10": [],
    "09": [
        (r"p = g = 4 bytes", "the bytes per fp32 element (torch.finfo(torch.float32).bits / 8)"),
        (r"ZeRO-3\s+1\.5×", "the ZeRO paper's claim the student explains (Rajbhandari et al. 2020, "
                          "arXiv:1910.02054, section 7.2.2)"),
    ],
}


def _prose(markdown: str) -> str:
    """Markdown without code blocks, code spans, LaTeX and link targets."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"https?://\S+", " ", text)


def typed_figures(markdown: str, allowed: list[tuple[str, str]] = ()) -> list[str]:
    """The figures with units in ``markdown``'s prose that no allowed pattern covers,
    each with a little context."""
    text = _prose(markdown)
    found = []
    for m in FIGURE.finditer(text):
        context = text[max(0, m.start() - 40):m.end() + 40]
        if any(re.search(p, context, re.IGNORECASE) for p, _ in allowed):
            continue
        found.append(" ".join(context.split()))
    return found


def _notebook(lab: str) -> Path:
    paths = sorted((ROOT / "solutions").glob(f"{lab}_*.ipynb"))
    assert len(paths) == 1, f"solutions/{lab}_*.ipynb: found {paths}"
    return paths[0]


@pytest.mark.parametrize("lab", LABS_SCANNED)
def test_markdown_states_no_typed_in_result(lab):
    nb = nbformat.read(str(_notebook(lab)), as_version=4)
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            continue  # a written answer cell: the student's text
        bad += [f"cell {i}: ...{f}..." for f in typed_figures(cell.source, COMMON + ALLOWED.get(lab, []))]
    assert not bad, ("typed-in figures in markdown (print them from a measurement, or add a "
                     "justified pattern to ALLOWED):\n" + "\n".join(bad))


@pytest.mark.parametrize("text", [
    "One training step takes 35 ms on this machine.",
    "The fixed pipeline reaches 95 % of the bound.",
    "bf16 is 3.2x faster here",
    "the checkpointed model saves 1.5 GiB",
    "the lab finishes in about three minutes on two CPU cores",
    "throughput rises to 1,250 samples/s",
    "a 224-256 px photo",
    "speed drifts over 30 seconds",
    "each step costs 12 GFLOP",
    "4 ranks share 2 cores",
    "on two CPU cores the ranks take turns",
])
def test_a_typed_in_result_is_caught(text):
    assert typed_figures(f"Some prose. {text} More prose.")


@pytest.mark.parametrize("text", [
    "Run `time.sleep(0.003)` in the loop",           # code span
    "$$\\text{efficiency} = 0.5 x$$",                 # LaTeX
    "see Lab 04 and exercise 2 (3 points)",           # no unit
    "write 3-5 sentences",
    "the shape (B, 3, H, W)",
    "speed drifts over tens of seconds; the sensitive ones stay",
])
def test_code_formulas_and_plain_numbers_are_not_claims(text):
    assert typed_figures(text) == []


def test_an_allowed_pattern_covers_only_its_context():
    allowed = [(r"95 % confidence", "a setting")]
    assert typed_figures("whiskers with 95 % confidence", allowed) == []
    assert typed_figures("reaches 95 % of the bound", allowed)
