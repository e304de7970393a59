"""CUDA: ``driver`` is the only caller of cuda.bindings; ``procs`` finds CUDA processes
without touching the driver."""
