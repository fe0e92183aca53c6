"""Operations: one folder each (public function, custom-op registration, kernels, reference, and the
cases ``tilecore tour`` shows, in its ``tour.py``)."""
