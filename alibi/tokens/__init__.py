"""Tokens: turning layer differences into token differences, and the statistics of the flips.

Replay (each writes typed records under a manifest):

- `setup`: what every replay command checks before it loads a model, and its output's manifest;
- `records`: teacher-forced records, what one arm predicted at each scored position;
- `teacher_forced`: one arm over pinned text, position by position;
- `greedy`: greedy continuations of each arm and where they first differ;
- `prefill_decode`: prefill versus decode within one arm, with first-divergence attribution;
- `variations`: is a token's logit independent of batch (size, rows, neighbours), chunking, prefill vs decode, KV
  cache, repetition and restart;
- `locate`: the first module where two traced runs part (`alibi locate`).

Flip statistics (`alibi analyze flips`, check 7's input):

- `steps`: one arm's records as every shape reads them (`Step`, `ArmSteps`);
- `foreign`: per-position records published by another tool, read into `ArmSteps`;
- `arms`: one arm's records, whichever tool wrote them; `join`: two arms joined position by position;
- `margin`: arm A's margin as a predictor of a flip (ROC-AUC, bootstrap, calibration);
- `flips`: how often two arms pick different top-1 tokens, and how well the margin predicts it.
"""
