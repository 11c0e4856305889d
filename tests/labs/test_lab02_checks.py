"""Lab 02's graded checks on real wrong answers: each wrong Dataset, DataLoader call,
prefetcher or fixed configuration below runs as grading runs it (the student's code on
hidden cases drawn from a seed, in this process as in the kernel; the judge apart, on
the answers as JSON) and fails on a hidden case; the reference solution passes at
several seeds and an honest variant written differently passes. Delegating to perflab
fails too."""
from __future__ import annotations

import pytest

from tests.labs.labcheck import REFERENCE_SEEDS, Lab

LAB = Lab("02")


@pytest.fixture(scope="module")
def ns():
    scope = LAB.namespace()
    # Exercise 4 starts from `slow` (section 3 defines it beside a sweep not run here)
    LAB.run_code(scope, 'slow = baseline.replace(storage_latency_ms=4.0, label="")')
    return scope


def _verdict(ns, code: str, check: str):
    return LAB.verdict(ns, code, check)


WRONG_DATASETS = {
    "float images": '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, i):
        return torch.from_numpy(self.images[i]).float() / 255, int(self.labels[i])''',
    "tensor labels": '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, i):
        return torch.from_numpy(self.images[i]), torch.tensor(self.labels[i])''',
    "off by one": '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, i):
        return torch.from_numpy(self.images[i - 1]), int(self.labels[i])''',
    "wrong length": '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return self.images.size
    def __getitem__(self, i):
        return torch.from_numpy(self.images[i]), int(self.labels[i])''',
    "delegates to perflab's CachedBatches": '''
def MyCachedDataset(images, labels):
    from perflab.data.cache import CachedBatches, DecodedCache
    return CachedBatches(DecodedCache(images, labels, tuple("abcdefghij"),
                                      images.shape[-1], "memory", None, 0.0))''',
    "the example's ten images": '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return 10
    def __getitem__(self, i):
        return torch.from_numpy(np.asarray(self.images[i])), int(self.labels[i])''',
    "numpy labels": '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, i):
        return torch.from_numpy(np.asarray(self.images[i])), self.labels[i]''',
}

_OK_LOADER = '''
def my_loader(dataset, *, batch_size, seed, num_workers, device):
    workers = num_workers > 0
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(seed), num_workers=num_workers,
        pin_memory=torch.device(device).type == "cuda", persistent_workers=workers,
        prefetch_factor=4 if workers else None)'''
WRONG_LOADERS = {
    "no generator (global seed)": _OK_LOADER.replace(
        "generator=torch.Generator().manual_seed(seed), ", ""),
    "torch.manual_seed instead of a generator": _OK_LOADER.replace(
        "    workers = num_workers > 0", "    workers = num_workers > 0\n    torch.manual_seed(seed)"
        ).replace("generator=torch.Generator().manual_seed(seed), ", ""),
    "no shuffle": _OK_LOADER.replace("shuffle=True", "shuffle=False"),
    "keeps the last batch": _OK_LOADER.replace("drop_last=True", "drop_last=False"),
    "always pins memory": _OK_LOADER.replace('pin_memory=torch.device(device).type == "cuda"',
                                             "pin_memory=True"),
    "workers not persistent": _OK_LOADER.replace("persistent_workers=workers",
                                                 "persistent_workers=False"),
    "default prefetch_factor": _OK_LOADER.replace("prefetch_factor=4 if workers else None",
                                                  "prefetch_factor=2 if workers else None"),
    "another seed": _OK_LOADER.replace("manual_seed(seed)", "manual_seed(seed + 1)"),
    "delegates to perflab.make_loader": '''
def my_loader(dataset, *, batch_size, seed, num_workers, device):
    return perflab.make_loader(RunConfig.preset("tiny", batch_size=batch_size, seed=seed,
                                                num_workers=num_workers))''',
    "the example's batch size": _OK_LOADER.replace("batch_size=batch_size", "batch_size=4"),
    "a new generator every epoch (re-seeded)": \
        _OK_LOADER.replace("return torch.utils.data.DataLoader(", "loader = torch.utils.data.DataLoader(")
        + '''
    class Reseeded:
        def __init__(self, inner):
            self.inner = inner
            self.__dict__.update({k: getattr(inner, k) for k in ("dataset", "drop_last", "num_workers",
                                  "pin_memory", "persistent_workers", "prefetch_factor")})
        def __iter__(self):
            self.inner.generator.manual_seed(seed)
            return iter(self.inner)
    return Reseeded(loader)''',
}

_OK_PREFETCHER_CPU = '''
class MyPrefetcher:
    def __init__(self, batches, device, prepare=None):
        self.it, self.device, self.prepare = iter(batches), torch.device(device), prepare
    def __iter__(self):
        return self
    def __next__(self):
        x, y = next(self.it)
        x, y = x.to(self.device), y.to(self.device)
        return self.prepare(x, y) if self.prepare else (x, y)'''
WRONG_PREFETCHERS = {
    "no lookahead (a pass-through)": _OK_PREFETCHER_CPU,
    "delegates to perflab.DevicePrefetcher": '''
def MyPrefetcher(batches, device, prepare=None):
    return perflab.DevicePrefetcher(batches, device, prepare=prepare)''',
    "forgets prepare": '''
class MyPrefetcher:
    def __init__(self, batches, device, prepare=None):
        self.it, self.device = iter(batches), torch.device(device)
        self.next = self._load()
    def _load(self):
        try:
            x, y = next(self.it)
        except StopIteration:
            return None
        return x.to(self.device), y.to(self.device)
    def __iter__(self):
        return self
    def __next__(self):
        if self.next is None:
            raise StopIteration
        out, self.next = self.next, self._load()
        return out''',
    "drops the last batch": '''
class MyPrefetcher:
    def __init__(self, batches, device, prepare=None):
        self.it, self.device, self.prepare = iter(batches), torch.device(device), prepare
        self.next = self._load()
    def _load(self):
        x, y = next(self.it)
        x, y = x.to(self.device), y.to(self.device)
        return self.prepare(x, y) if self.prepare else (x, y)
    def __iter__(self):
        return self
    def __next__(self):
        out = self.next
        self.next = self._load()
        return out''',
    "the example's prepare (doubles x)": '''
class MyPrefetcher:
    def __init__(self, batches, device, prepare=None):
        self.it, self.device = iter(batches), torch.device(device)
        self.next = self._load()
    def _load(self):
        try:
            x, y = next(self.it)
        except StopIteration:
            return None
        return x.to(self.device) * 2, y.to(self.device)
    def __iter__(self):
        return self
    def __next__(self):
        if self.next is None:
            raise StopIteration
        out, self.next = self.next, self._load()
        return out''',
}

def _fix(body: str) -> str:
    """An Exercise 4 answer: ``my_fix_pipeline`` returning ``body``."""
    return f"def my_fix_pipeline(slow_config):\n    return {body}\n"


#: The old exercise's cheat (issue 43): the answer cell rewrites `slow`, the record the
#: old check compared `my_fixed` with, so that a config with a smaller batch looks like
#: an unchanged one (the old check read `my_fixed` and `slow` from the notebook: it
#: passed). The check now calls the function on configurations it draws itself.
_FABRICATED_SLOW = (
    'my_fixed = slow.replace(decoded_cache="memory", device_prefetch=True, batch_size=8)\n'
    'slow = my_fixed.replace(decoded_cache="off", device_prefetch=False)\n'
    'def my_fix_pipeline(slow_config):\n    return my_fixed\n')

WRONG_FIXED = {
    "no decoded cache": _fix('slow_config.replace(device_prefetch=True, num_workers=2, '
                             'persistent_workers=True)'),
    "the disk fixed instead": _fix('slow_config.replace(decoded_cache="memory", '
                                   'device_prefetch=True, storage_latency_ms=0.0)'),
    "a cache, nothing ahead": _fix('slow_config.replace(decoded_cache="memory")'),
    "a smaller batch": _fix('slow_config.replace(decoded_cache="memory", device_prefetch=True, '
                            'batch_size=8)'),
    "fewer steps": _fix('slow_config.replace(decoded_cache="memory", device_prefetch=True, '
                        'steps=5)'),
    "the bound itself": _fix('slow_config.replace(decoded_cache="memory", device_prefetch=True, '
                             'compute_only=True)'),
    "not a RunConfig": _fix('{"decoded_cache": "memory", "device_prefetch": True}'),
    # right for this lab's `slow` (no workers), an invalid config for one that has some
    "no workers, prefetch_factor kept": _fix(
        'slow_config.replace(decoded_cache="memory", device_prefetch=True, num_workers=0, '
        'persistent_workers=False)'),
    # not a function of its input: the notebook's own `slow`, fixed
    "the notebook's slow, whatever the input": _fix(
        'slow.replace(decoded_cache="memory", device_prefetch=True)'),
    "a fabricated slow record": _FABRICATED_SLOW,
}

#: One honest answer per check, written differently from the reference: it passes.
HONEST = {
    "check_cached_dataset": ("as_tensor, negative indices by hand", '''
class MyCachedDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.rows, self.marks = images, labels
    def __len__(self):
        return self.rows.shape[0]
    def __getitem__(self, index):
        if index < 0:
            index += len(self)
        return torch.as_tensor(self.rows[index]), self.marks[index].item()'''),
    "check_loader": ("keyword arguments built up", '''
def my_loader(dataset, *, batch_size, seed, num_workers, device):
    g = torch.Generator()
    g.manual_seed(seed)
    options = dict(batch_size=batch_size, shuffle=True, drop_last=True, generator=g,
                   num_workers=num_workers, pin_memory=str(device).startswith("cuda"))
    if num_workers:
        options.update(persistent_workers=True, prefetch_factor=4)
    return torch.utils.data.DataLoader(dataset, **options)'''),
    "check_prefetcher": ("preloads on the first next()", '''
class MyPrefetcher:
    def __init__(self, batches, device, prepare=None):
        self.source, self.device, self.prepare = iter(batches), torch.device(device), prepare
        self.pending, self.started = None, False
    def _stage(self):
        batch = next(self.source, None)
        if batch is not None:
            x, y = (t.to(self.device) for t in batch)
            batch = self.prepare(x, y) if self.prepare else (x, y)
        self.pending = batch
    def __iter__(self):
        return self
    def __next__(self):
        if not self.started:
            self.started = True
            self._stage()
        if self.pending is None:
            raise StopIteration
        out = self.pending
        self._stage()
        return out'''),
    "check_fixed_pipeline": ("a memory-mapped cache fed by workers", '''
def my_fix_pipeline(given):
    knobs = dict(decoded_cache="mmap", num_workers=max(2, given.num_workers),
                 persistent_workers=True, prefetch_factor=2)
    return given.replace(**knobs)'''),
    "check_prefetcher_streams": ("an event instead of wait_stream, `with stream:`, .cuda()", '''
class MyPrefetcher:
    def __init__(self, batches, device, prepare=None):
        self.source, self.device, self.prepare = iter(batches), torch.device(device), prepare
        self.side = torch.cuda.Stream() if torch.cuda.is_available() and self.device.type == "cuda" else None
        self.ready = None
        self._stage()
    def _stage(self):
        batch = next(self.source, None)
        if batch is None:
            self.ready = None
            return
        if self.side is None:
            x, y = (t.to(self.device) for t in batch)
            self.ready, self.event = (self.prepare(x, y) if self.prepare else (x, y)), None
            return
        with self.side:
            x, y = (t.cuda(non_blocking=True) for t in batch)
            self.ready = self.prepare(x, y) if self.prepare else (x, y)
            self.event = torch.cuda.Event()
            self.event.record()
    def __iter__(self):
        return self
    def __next__(self):
        if self.ready is None:
            raise StopIteration
        out = self.ready
        if self.event is not None:
            consumer = torch.cuda.current_stream()
            consumer.wait_event(self.event)
            for t in out:
                t.record_stream(consumer)
        self._stage()
        return out'''),
}

#: The reference prefetcher (the solution cell), and wrong variants of its stream logic:
#: each runs on the recording stand-in for torch.cuda and must fail the stream check.
_SOLUTION_PREFETCHER = LAB.solution("my_prefetcher")


def _variant(*swaps: tuple[str, str]) -> str:
    code = _SOLUTION_PREFETCHER
    for old, new in swaps:
        assert old in code, f"{old!r} is not in the reference prefetcher"
        code = code.replace(old, new)
    return code


_IN_SIDE_STREAM = "with torch.cuda.stream(self.stream) if self.stream else contextlib.nullcontext():"
WRONG_STREAM_PREFETCHERS = {
    "no wait_stream": _variant(("current.wait_stream(self.stream)", "pass")),
    "no record_stream": _variant(("x.record_stream(current)", "pass"),
                                 ("y.record_stream(current)", "pass")),
    "record_stream on x only": _variant(("y.record_stream(current)", "pass")),
    "record_stream on the side stream": _variant(("x.record_stream(current)", "x.record_stream(self.stream)"),
                                                 ("y.record_stream(current)", "y.record_stream(self.stream)")),
    "copies on the default stream": _variant((_IN_SIDE_STREAM, "if True:")),
    "a blocking copy": _variant(("non_blocking=True", "non_blocking=False")),
    "a host synchronize instead of wait_stream": _variant(
        ("current.wait_stream(self.stream)", "torch.cuda.synchronize()")),
    "the side stream waits for the consumer": _variant(
        ("current.wait_stream(self.stream)", "self.stream.wait_stream(current)")),
    "waits once, before any copy": _variant(
        ("        self._preload()\n\n    def _preload", "        if self.stream is not None:\n"
         "            torch.cuda.current_stream().wait_stream(self.stream)\n"
         "        self._preload()\n\n    def _preload"),
        ("current.wait_stream(self.stream)", "pass")),
    "prepare on the default stream": _variant(
        ("            self.next = self.prepare(x, y) if self.prepare else (x, y)\n",
         "        self.next = self.prepare(x, y) if self.prepare else (x, y)\n")),
    "a CPU pass-through": _OK_PREFETCHER_CPU,
    "delegates to perflab.DevicePrefetcher": WRONG_PREFETCHERS["delegates to perflab.DevicePrefetcher"],
}

CASES = [("my_cached_dataset", "check_cached_dataset", WRONG_DATASETS),
         ("my_loader", "check_loader", WRONG_LOADERS),
         ("my_prefetcher", "check_prefetcher", WRONG_PREFETCHERS),
         ("my_prefetcher", "check_prefetcher_streams", WRONG_STREAM_PREFETCHERS),
         ("my_fixed_pipeline", "check_fixed_pipeline", WRONG_FIXED)]

#: The checks whose wrong answers run here (tests/labs/test_grading_checks.py reads it).
CHECKS_TESTED = [c for _, c, _ in CASES]
GRADED_TESTED = tuple(CHECKS_TESTED)


@pytest.mark.parametrize("seed", REFERENCE_SEEDS)
@pytest.mark.parametrize("answer, check", [(a, c) for a, c, _ in CASES])
def test_reference_answer_passes(ns, answer, check, seed):
    scope = dict(ns)
    LAB.run_code(scope, LAB.solution(answer))
    v = LAB.judge(scope, check, seed=seed)
    assert v.passed, v.message


@pytest.mark.parametrize("check", [c for _, c, _ in CASES])
def test_honest_variant_passes(ns, check):
    name, code = HONEST[check]
    v = _verdict(ns, code, check)
    assert v.passed, (name, v.message)


@pytest.mark.parametrize("check, name, code", [
    (c, name, code) for _, c, wrongs in CASES for name, code in wrongs.items()],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and len(v) < 45 else "")
def test_wrong_answer_fails(ns, check, name, code):
    v = _verdict(ns, code, check)
    assert not v.passed, f"{name!r} passed {check}"
    if name.startswith("delegates to"):
        assert "the graded call ran perflab's" in v.message or v.message.startswith("hidden case"), \
            v.message
    else:
        assert v.message.startswith("hidden case"), v.message


def test_fixed_pipeline_measures_nothing_in_grading():
    """The check of Exercise 4 calls the student's function on configurations it draws;
    the interleaved measurement it used to run sits in a grading-skip cell now."""
    from perflab.course.checks import split_check
    check = split_check(LAB.cells["check_fixed_pipeline"])
    assert "run_interleaved" not in check.probe + check.graded.answer_source
    shown = next(c for c in LAB.nb.cells if "fixed_result, fixed_bound = run_interleaved" in c.source)
    assert "grading-skip" in shown.metadata.get("tags", [])


def test_fixed_pipeline_is_graded_on_drawn_configurations():
    """The graded call reads no configuration of the notebook (issue 43): it calls
    my_fix_pipeline on slow-storage configurations the grader draws, one of them with
    workers, a prefetch factor and persistent workers already set."""
    from perflab import RunConfig
    from perflab.course.cases import draw_cases
    from perflab.course.checks import graded_functions, split_check

    graded = split_check(LAB.cells["check_fixed_pipeline"]).graded
    assert "slow" not in graded.answer_source and "my_fixed" not in graded.answer_source
    cases_fn, _ = graded_functions(graded, "check_fixed_pipeline")
    for seed in (0, 1, "grade:ada"):
        configs = [RunConfig(**c) for c in draw_cases(cases_fn, seed)]
        assert len(configs) >= 4 and all(c.storage_latency_ms > 0 for c in configs)
        assert any(c.num_workers and c.prefetch_factor and c.persistent_workers for c in configs)
        assert len({(c.batch_size, c.storage_latency_ms) for c in configs}) == len(configs)


def test_every_lab02_check_has_wrong_answers():
    from perflab.course.answers import autograded
    assert set(autograded(LAB.nb)) == {c for _, c, _ in CASES}
    assert set(HONEST) == {c for _, c, _ in CASES}


#: What the stream check says for each wrong stream variant (its first broken rule).
STREAM_REASONS = {
    "no wait_stream": "wait_stream(side_stream) first",
    "no record_stream": "without tensor.record_stream",
    "record_stream on x only": "without tensor.record_stream",
    "record_stream on the side stream": "without tensor.record_stream",
    "copies on the default stream": "copied on the default stream",
    "a blocking copy": "non_blocking=False",
    "a host synchronize instead of wait_stream": "wait_stream(side_stream) first",
    "the side stream waits for the consumer": "wait_stream(side_stream) first",
    "waits once, before any copy": "wait_stream(side_stream) first",
    "prepare on the default stream": "prepare ran on the default stream",
    "a CPU pass-through": "copied on the default stream",
    "delegates to perflab.DevicePrefetcher": "DevicePrefetcher",
}


@pytest.mark.parametrize("name", sorted(STREAM_REASONS))
def test_stream_wrong_answers_fail_for_their_reason(ns, name):
    v = _verdict(ns, WRONG_STREAM_PREFETCHERS[name], "check_prefetcher_streams")
    assert not v.passed and STREAM_REASONS[name] in v.message, (name, v.message[-300:])
