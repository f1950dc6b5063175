"""Sweeps: divergence between two kernels as the reduction depth K grows (`depth`) and across the
number of rows M (`rows`, the decode regime), with the typed records they write and their fits.

Modules: `operands` (seeded INT8/FP8 operands, nested prefixes), `arms` (resolving and placing the
two kernels, the CPU fp8 reference kernel), `compare` (the fp64 reference and the per-record
measurements, on the kernels' device), `clock` (wall time per phase, fenced by device
synchronization), `records` (the result types, JSON/CSV I/O), `depth` and `rows` (the two sweeps);
the fits: `depth_fits` (models of the differing fraction against K, held-out ranking, exponent
stability), `rates` (exact rates of rare events across groups: intervals, homogeneity, trend, ratio
bounds), `analysis` (fits.json of `alibi analyze depth`), `output` (sweep and fit folders), `figure`
(matplotlib figures), `summary` (the Markdown table of fits). See docs/sweeps.md.
"""
