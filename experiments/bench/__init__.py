"""Benchmarks: scripts that print a table and write result files (never timed tests).

``python -m experiments.bench.sim`` (simulator speed), ``.engine_cpu`` (CPU engine vs HF),
``.engine_gpu`` (engine runs on a GPU), ``.kernels_gpu`` (Triton kernels on a GPU)."""
