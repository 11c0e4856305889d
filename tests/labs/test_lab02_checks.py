"""Lab 02's checks on real wrong answers: each wrong Dataset, DataLoader call or
prefetcher below runs through the check cell's own probe (as in grading), and the judge
must fail it; the reference solution passes. Delegating to perflab fails too."""
from __future__ import annotations

import pytest

from tests.labs.labcheck import Lab

LAB = Lab("02")


@pytest.fixture(scope="module")
def ns():
    return LAB.namespace()


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
    "delegates to perflab.CachedBatches": '''
def MyCachedDataset(images, labels):
    return perflab.CachedBatches(perflab.DecodedCache(images, labels, tuple("abcdefghij"),
                                                      images.shape[-1], "memory", None, 0.0))''',
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
}

CASES = [("my_cached_dataset", "check_cached_dataset", WRONG_DATASETS),
         ("my_loader", "check_loader", WRONG_LOADERS),
         ("my_prefetcher", "check_prefetcher", WRONG_PREFETCHERS)]

#: The checks whose wrong answers run here (tests/labs/test_grading_checks.py reads it).
CHECKS_TESTED = [c for _, c, _ in CASES]


@pytest.mark.parametrize("answer, check", [(a, c) for a, c, _ in CASES])
def test_reference_answer_passes(ns, answer, check):
    v = _verdict(ns, LAB.solution(answer), check)
    assert v.passed, v.message


@pytest.mark.parametrize("check, name, code", [
    (c, name, code) for _, c, wrongs in CASES for name, code in wrongs.items()],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and len(v) < 45 else "")
def test_wrong_answer_fails(ns, check, name, code):
    v = _verdict(ns, code, check)
    assert not v.passed, f"{name!r} passed {check}"
    assert v.message


def test_fixed_pipeline_judge_fails_wrong_configs():
    """check_fixed_pipeline grades the configuration (its probe measures, which is slow);
    its judge runs here on facts: a config without a cache, with the storage fixed, or
    not a RunConfig fails."""
    from perflab.course.checks import run_judge, split_check
    check = split_check(LAB.cells["check_fixed_pipeline"])
    knobs = {"storage_latency_ms": 4.0, "compute_only": False, "model": "resnet18",
             "image_size": 64, "batch_size": 32, "amp": "off", "device": "cpu", "dataset": None,
             "seed": 0, "decoded_cache": "off", "device_prefetch": False, "num_workers": 0}
    right = {"fixed_knobs": {**knobs, "decoded_cache": "memory", "device_prefetch": True},
             "slow_knobs": knobs}
    assert run_judge(check, right).passed
    for wrong in ({**knobs, "device_prefetch": True}, {**knobs, "decoded_cache": "memory",
                  "storage_latency_ms": 0.0}, None, {**knobs, "decoded_cache": "memory",
                  "device_prefetch": True, "batch_size": 8}):
        assert not run_judge(check, {"fixed_knobs": wrong, "slow_knobs": knobs}).passed


def test_every_lab02_check_has_wrong_answers():
    from perflab.course.answers import autograded
    assert set(autograded(LAB.nb)) == {c for _, c, _ in CASES} | {"check_fixed_pipeline"}
