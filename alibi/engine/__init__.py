"""Inside a real serving engine: capture and kernel arms inside vLLM (docs/vllm-engine.md).

`vllm_plugin` is loaded by vLLM itself (entry-point group `vllm.general_plugins`) in every engine
process; `vllm_offline` is the child process that drives an offline engine; `vllm_runs` turns what
they wrote into alibi's capture folders and replay records.
"""
