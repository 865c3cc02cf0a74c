import os

# Triton reads this at import time: run kernels under its CPU interpreter unless a run opts out.
os.environ.setdefault("TRITON_INTERPRET", "1")
