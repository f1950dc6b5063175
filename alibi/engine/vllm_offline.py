"""The child process that runs an offline vLLM engine for alibi: `python -m alibi.engine.vllm_offline JOB RESULT`.

JOB (JSON): `model` (a W8A8 checkpoint folder), `prompts` (lists of token ids), `mode` (`prompt_logprobs`:
one forward over each prompt, vLLM's top-`logprobs` and the prompt token's log-probability at every
position; `generate`: greedy decoding of `max_tokens` tokens), `max_model_len`. The plugin
(`alibi.engine.vllm_plugin`) captures or swaps the kernel inside it when the parent set
ALIBI_CAPTURE_DIR / ALIBI_KERNEL. RESULT (JSON) receives the outputs, vLLM's version and the
engine settings. vLLM spawns its engine-core and worker processes, so the work sits under
`if __name__ == "__main__":`.
"""

from __future__ import annotations

import json
import os
import sys

from alibi.engine import vllm_plugin

ENGINE_ARGS = {"dtype": "bfloat16", "enforce_eager": True, "enable_prefix_caching": False, "seed": 0}


def run_job(job: dict) -> dict:
    # deferred: keeps vllm out of start-up (and out of the processes vLLM spawns, which import this module)
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=job["model"], max_model_len=int(job.get("max_model_len", 1024)), **ENGINE_ARGS)
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in job["prompts"]]
    if job["mode"] == "prompt_logprobs":
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=int(job.get("logprobs", 2)),
                                detokenize=False)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results = [[None if row is None else {str(t): lp.logprob for t, lp in row.items()}
                    for row in out.prompt_logprobs] for out in outputs]
    elif job["mode"] == "generate":
        params = SamplingParams(max_tokens=int(job["max_tokens"]), temperature=0.0, ignore_eos=True,
                                detokenize=False)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results = [list(out.outputs[0].token_ids) for out in outputs]
    else:
        raise ValueError(f"unknown mode {job['mode']!r}")
    vllm_plugin.finish()
    return {"mode": job["mode"], "results": results, "vllm_version": vllm.__version__,
            "engine_args": {**ENGINE_ARGS, "max_model_len": int(job.get("max_model_len", 1024))},
            "env": {k: os.environ.get(k) for k in ("ALIBI_CAPTURE_DIR", "ALIBI_KERNEL", "VLLM_CPU_KVCACHE_SPACE",
                                                 "VLLM_ENABLE_V1_MULTIPROCESSING")}}


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    result = run_job(job)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(result, f)
