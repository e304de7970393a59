"""CRIU: pure option builders (``options``), the one place that runs the binary (``runner``)
and image rewriting through pycriu (``images``)."""
