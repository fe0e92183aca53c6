"""attention(q, k, v, rotary=(cos, sin)): rotary embedding applied to Q and K inside attention (issue 37), the
path ``tilecore.attention`` routes a call with ``rotary`` to. No public function of its own.

* ``op``: the checks, the four paths (tl, gluon, turned, composite) and their custom ops;
* ``plan``: which path serves which call, and the schedule of the Gluon forward with K turned in its launch;
  ``configs``: the measured cases;
* ``gluon_forward``: Hopper's forward with Q (and K) turned inside the Gluon kernel (attention's forward op
  wrapped);
* ``launch``: the tl kernels with Q and K turned as they load them (attention.kernels_tl's ROTARY);
* ``reference``: the float64 reference.
"""
