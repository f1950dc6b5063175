"""Where two runs part: the first (call, prompt, position, module) whose bits differ.

`locate(run_a, run_b)` compares two greedy run folders (`alibi replay greedy … --kernel K`, one run
of one arm each): two arms, two cold restarts of one arm, or one arm at two batch sizes. Prompts
are matched by window index, so a prompt run alone and the same prompt as row 0 of a batch of 64
compare directly. It reports

- the tokens: prompts compared and how many generated identical sequences;
- the logits: every step's fp32 logit row, bit for bit through its digest, while the two sequences
  agree (after they part, the two rows no longer see the same inputs);
- with a trace in both folders (`--trace`): the first module whose output differs, by the earliest
  position and then execution order (`alibi.model.trace.first_divergence`), with the forward call
  of each run that computed it and whether it is a W8A8 Linear (the kernel) or the runner's own
  arithmetic.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alibi.errors import InputError, one_line
from alibi.governance.verified import read_verified
from alibi.io.typed import TypedResult

SCHEMA = "alibi-locate/v1"
RESULT_FILE = "locate.json"


@dataclass(frozen=True)
class LocateResult(TypedResult):
    """Two runs compared (schema `alibi-locate/v1`).

    run_a, run_b: the folders as given; kernel_a, kernel_b; batch_size_a, batch_size_b;
    prompts_compared: windows both runs generated for; identical_sequences; logit_rows_compared /
    logit_rows_identical: steps compared while the sequences agree, and those bitwise equal (None
    when a run has no logit digests); traced: both folders hold a trace; first_divergence: the first
    differing (prompt, position, module, kind, call_a, call_b) of the traces (None when they agree
    or were not traced); identical: every compared sequence and logit row (and traced module) agrees.
    """

    SCHEMA = SCHEMA
    JSON_SORT_KEYS = True
    REMEDY = "re-run `alibi locate`"
    FILE = RESULT_FILE

    run_a: str
    run_b: str
    kernel_a: str | None
    kernel_b: str | None
    batch_size_a: int
    batch_size_b: int
    prompts_compared: int
    identical_sequences: int
    logit_rows_compared: int | None
    logit_rows_identical: int | None
    traced: bool
    first_divergence: dict[str, Any] | None
    identical: bool
    schema: str = SCHEMA


RUN_FIX = "locate two run folders as `alibi replay greedy --kernel K --out RUN` wrote them (re-run a changed one)"


def read_located_run(folder: str | os.PathLike):
    """A greedy run folder, once its manifest (kind `replay`) vouches for every file in it, and only of a schema
    that has logit digests: a run without them would be compared on its tokens alone and could be called
    identical while its logits differ (`alibi.governance.verified`)."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.greedy import RUN_FILE, RUN_SCHEMA, GreedyRun

    if not Path(folder).is_dir():
        raise InputError(f"{one_line(str(folder))}: no such run folder; {RUN_FIX}")
    # the folder's manifest verifies every file, the trace included, before run.json is parsed
    return read_verified(Path(folder) / RUN_FILE, GreedyRun, ("replay",), schemas=(RUN_SCHEMA,),
                         lacks="logit digests", fix=RUN_FIX)


def locate(run_a: str | os.PathLike, run_b: str | os.PathLike) -> LocateResult:
    """Compare two greedy run folders (module docstring); each is verified first (`read_located_run`)."""
    # deferred: keeps torch out of start-up
    from alibi.model.trace import first_divergence
    from alibi.tokens.greedy import TRACE_FILE, logit_row_agreement
    from alibi.tokens.variations import load_execution

    a, b = read_located_run(run_a), read_located_run(run_b)
    if (a.prompt_tokens, a.new_tokens) != (b.prompt_tokens, b.new_tokens):
        raise InputError(f"{run_a} and {run_b}: runs of {a.prompt_tokens}+{a.new_tokens} and {b.prompt_tokens}+"
                         f"{b.new_tokens} tokens cannot be compared; locate two runs of one request")
    index_b = {w: i for i, w in enumerate(b.windows)}
    shared = [(i, index_b[w]) for i, w in enumerate(a.windows) if w in index_b]
    if not shared:
        raise InputError(f"{run_a} and {run_b}: no prompt window in common; locate two runs over the same prompts")
    for i, j in shared:
        if a.prompt_sha256[i] != b.prompt_sha256[j]:
            raise InputError(f"{run_a} and {run_b}: window {a.windows[i]} holds other tokens in the two runs "
                             "(another prompt set); locate two runs over the same prompts")
    same = sum(a.sequences[i] == b.sequences[j] for i, j in shared)
    rows = logit_row_agreement(a, b)
    paths = (Path(run_a) / TRACE_FILE, Path(run_b) / TRACE_FILE)
    traced = all(p.is_file() for p in paths)
    div = None
    if traced:
        ta, tb = (load_execution(p).trace for p in paths)
        windows = {a.windows[i] for i, _ in shared}
        keys = [k for k in set(ta.table()) & set(tb.table()) if k[0] in windows]
        found = first_divergence(ta, tb, keys)
        div = None if found is None else asdict(found)
    # no logit digests to compare (a v2 run cannot lack them: `read_located_run`) is never identical
    identical = same == len(shared) and rows is not None and rows[0] == rows[1] and div is None
    return LocateResult(run_a=str(run_a), run_b=str(run_b), kernel_a=a.kernel, kernel_b=b.kernel,
                        batch_size_a=a.batch_size, batch_size_b=b.batch_size, prompts_compared=len(shared),
                        identical_sequences=same, logit_rows_compared=None if rows is None else rows[1],
                        logit_rows_identical=None if rows is None else rows[0], traced=traced,
                        first_divergence=div, identical=identical)


def summary_lines(r: LocateResult) -> list[str]:
    lines = [f"locate: {r.run_a} ({r.kernel_a}, batch {r.batch_size_a}) vs {r.run_b} ({r.kernel_b}, batch {r.batch_size_b})",
             f"  identical sequences: {r.identical_sequences}/{r.prompts_compared}"]
    if r.logit_rows_compared is not None:
        lines.append(f"  logit rows bitwise identical: {r.logit_rows_identical}/{r.logit_rows_compared}")
    if not r.traced:
        lines.append("  no module trace in both runs (run them with --trace to name the first diverging module)")
    elif r.first_divergence is None:
        lines.append("  every traced module output identical")
    else:
        d = r.first_divergence
        lines.append(f"  first diverging: prompt {d['prompt']}, position {d['position']}, {d['module']} ({d['kind']}), "
                     f"forward call {d['call_a']} of run a, {d['call_b']} of run b")
    return lines


__all__ = ["LocateResult", "locate", "summary_lines"]
