"""Every module that keys calls with ``SignatureMemo(globals())`` has a ``signature`` of its own: the memo builds a
miss's signature with ``namespace["signature"]``, so a module whose import of it was dropped as "unused" (pyflakes
cannot see the lookup by name) fails with KeyError on its first keyed call (session 38: linear_attention/op.py)."""
import importlib
from pathlib import Path

import tilecore

ROOT = Path(tilecore.__file__).resolve().parent


def _memo_sites():
    for path in sorted(ROOT.rglob("*.py")):
        if "SignatureMemo(globals())" in path.read_text():
            yield "tilecore." + ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_memo_site_has_signature():
    sites = list(_memo_sites())
    assert len(sites) >= 5  # attention, kvcache, varlen, linear_attention, norm, ... (the search found them)
    for name in sites:
        module = importlib.import_module(name)
        assert callable(getattr(module, "signature", None)), f"{name} keys calls by SignatureMemo(globals()) " \
            f"but has no `signature` (import it from tilecore.tiles.launch)"
