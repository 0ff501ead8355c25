"""gunicorn.conf.py's hooks, called as gunicorn calls them."""

import gc
import runpy
from pathlib import Path
from types import SimpleNamespace

SETTINGS = runpy.run_path(str(Path(__file__).resolve().parents[2] / "gunicorn.conf.py"))


def test_a_worker_freezes_what_it_built_once_it_is_warm_and_only_then():
    post_request, warm = SETTINGS["post_request"], SETTINGS["FREEZE_AFTER_REQUESTS"]
    gc.unfreeze()
    try:
        post_request(SimpleNamespace(nr=warm - 1), None, {}, None)
        assert gc.get_freeze_count() == 0
        post_request(SimpleNamespace(nr=warm), None, {}, None)
        frozen = gc.get_freeze_count()
        assert frozen > 0  # everything alive now: modules, the app, what the first calls kept
        made_since = [[] for _ in range(1000)]  # what a second freeze would take in
        post_request(SimpleNamespace(nr=warm + 1), None, {}, None)
        assert gc.get_freeze_count() < frozen + len(made_since)  # once, not after every call (freed ones leave)
    finally:
        gc.unfreeze()
