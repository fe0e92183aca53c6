"""attention's CPU path without Triton's interpreter (no public function of its own: ``tilecore.attention``
routes CPU tensors here where dispatch.backend_for says "reference"):

* ``plan``: torch_path, "sdpa" (torch's CPU flash kernel) where every score is sure to be finite, else
  "reference" (float32 math by blocks of rows, NaN- and inf-faithful);
* ``launch``: both paths' forward and backward (the flash kernel's backward takes dlse through extra
  head-dim columns).
"""
