"""Moved to :mod:`tilecore.ops.attention_kvcache.op` (issue 30). This name is that module itself (an alias in
``sys.modules``: attributes set here are set there) for importers not yet updated; remove it once none is."""
import sys

from tilecore.ops.attention_kvcache import op

sys.modules[__name__] = op
