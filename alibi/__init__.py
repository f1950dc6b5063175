"""integer-alibi: decide whether two scaled INT8/FP8 GEMM kernels are interchangeable."""

__version__ = "0.1.0"
