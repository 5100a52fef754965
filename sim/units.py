"""Unit constants. Everything inside dtsim is SI: seconds, bytes, bytes/s, FLOP/s."""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024**2
GiB = 1024**3
US = 1e-6
MS = 1e-3
TFLOPS = 1e12

# Bytes per element of each precision name used in scenarios.
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
