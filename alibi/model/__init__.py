"""Real models for the toolkit: GGUF sources, compressed-tensors W8A8 checkpoints, a runner with a
swappable kernel, pinned prompt sets, operand capture and per-layer predictions.

Modules (one concept each):

- `gguf_file`: numpy-only GGUF reader and dequantizer (F32, F16, BF16, Q8_0, Q4_0, Q4_1);
- `gguf_source`: pinned model sources and the llama GGUF → Hugging Face conversion;
- `tokenizer`: tokenizer files from GGUF metadata, byte-stable across `tokenizers` versions;
- `checkpoint`: checkpoint folders (config, safetensors shards), digests, manifest verification;
- `compressed_tensors`: the W8A8 `int-quantized` scheme — parse, validate, read, write, quantize;
- `prepare`: `alibi model prepare` (GGUF → bf16 and W8A8 checkpoints with manifests);
- `wikitext`, `prompts`: plain text from a MediaWiki dump; pinned prompt sets;
- `runner`: transformers models whose quantized Linears call an alibi kernel;
- `trace`: a digest of every module's output per forward call, batch row and position, and the first
  module where two traces part (`first_divergence`);
- `capture`: operand recording as tiles, and its overhead benchmark;
- `predictions`: the per-layer headroom prediction list of a capture, with its digest;
- `evaluate`: perplexity and greedy continuations;
- `pow2_rewrite`: power-of-two weight scales for a W8A8 checkpoint (`alibi pow2-rewrite`);
- `digests`: sha256 helpers (files, canonical JSON, shard-independent tensor digests).

Importing this package imports nothing heavy; transformers and tokenizers are needed only by the
runner and by prompt-set building (the `model` extra).
"""
