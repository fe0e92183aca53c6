"""Drop-in call signatures of other libraries, on tilecore's ops.

* ``tilecore.compat.flash_attn``: flash-attn 2's ``flash_attn_func``, ``flash_attn_varlen_func`` and
  ``flash_attn_with_kvcache`` (argument names, (batch, seqlen, heads, head_dim) layout, return values),
  so a model swaps one import.
"""
