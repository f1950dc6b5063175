"""The bit-exact reference: what a scaled INT8/FP8 GEMM must produce, computed on the CPU without rounding doubt.

- `numerics`: bit views, round-to-nearest-even, ulp distances, subnormals, powers of two;
- `quant`: the quantization conventions (symmetric int8 per-row/per-column scales, fp8 e4m3);
- `emulator`: the exact integer accumulator and the epilogue models (`EpilogueModel`), executed bit for bit.

Imports nothing from alibi but `alibi.errors` (and `alibi.tiles.tile.Tile` for annotations only).
"""
