"""Shared fixtures: the embedded engine and randomly initialised tiny model pairs."""
from __future__ import annotations

import os

# Under pytest-xdist (`make test`: two workers on two cores) each worker computes on one thread, and so does
# every process it starts (wb.load() reads OMP_NUM_THREADS; so do notebook kernels, CLI and server subprocesses):
# two OpenMP teams of two on two cores spin against each other. Set before torch is imported.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from tiny_models import make_pair  # noqa: E402

torch.set_num_threads(1 if XDIST_WORKER else min(2, os.cpu_count() or 1))


TINY_SHAPES = {
    "l4-h32": dict(vocab=64, hidden=32, layers=4, layer_ids=(1, 2), block_size=8),
    "l3-h48-b5": dict(vocab=97, hidden=48, heads=4, kv_heads=2, layers=3, layer_ids=(0, 2), block_size=5),
    "l6-h32-d2": dict(vocab=50, hidden=32, layers=6, draft_layers=2, layer_ids=(1, 3, 5), block_size=16),
}


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory):
    out = {}
    for i, (name, kw) in enumerate(TINY_SHAPES.items()):
        out[name] = make_pair(tmp_path_factory.mktemp(name), seed=i, **kw)
    return out


@pytest.fixture(scope="session")
def tiny_engines(tiny_pairs):
    import workbench as wb

    return {name: wb.load(target=t, draft=d) for name, (t, d) in tiny_pairs.items()}


@pytest.fixture(scope="session")
def engine():
    """The embedded default."""
    import workbench as wb

    return wb.load()


@pytest.fixture(scope="session")
def eval_prompts():
    from workbench.shipped import eval_prompts

    return eval_prompts()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread: two threads spin against each other on a busy 2-core machine.
    Module-scoped (``pytestmark = pytest.mark.usefixtures("one_thread")``); the old count is restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def heavy_first(item) -> bool:
    """A notebook's cells or a test marked slow: its file goes to a worker early, so that no long file is
    left for last while the other worker waits."""
    return item.nodeid.split("::")[0].endswith(".ipynb") or item.get_closest_marker("slow") is not None


def pytest_collection_modifyitems(config, items):
    """Under xdist (``--dist loadfile --no-loadscope-reorder``: whole files in collection order), the files holding
    a slow test or a notebook come first; within a file the order stays as written."""
    if not XDIST_WORKER:
        return
    heavy = {item.nodeid.split("::")[0] for item in items if heavy_first(item)}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in heavy)  # stable: files keep their order
