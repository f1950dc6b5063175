"""Tiles: one GEMM invocation's operands, how they are stored, and where they come from.

- `tile`: the `Tile` type (a_q, s_a, w_q, s_w, optional bias, out_dtype, meta) and its safetensors files;
- `safetensors_header`: the bounded reader of a safetensors header, checked before any tensor is read;
- `synthetic`: seeded tiles with the layer shapes and operand statistics of real models (the presets);
- `exposing`: tiles built so that every fault of `alibi.kernels.mutants` changes output bits;
- `out_bias_probe`: epilogue probes with the bias in the output dtype (`alibi identify`).
"""
