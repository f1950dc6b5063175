"""Conformance: does a kernel pair give the same bits, and where not, is the difference the one predicted?

- `pipeline`: two kernels, a tile source, the scale regimes, every check, one report: the one pipeline
  of `alibi conform`, `alibi run` and `alibi.testing` (`run_conformance`);
- `checks`: the paper's seven checks and the three that close its blind spot; `verdict`: a check's
  outcome (`Verdict`), the check identifiers in report order, and how verdicts combine;
- `differences`: the positions and both values of the elements where two arms differ;
- `pair_prediction`: a pair certified from its declared epilogue models alone (`alibi predict-pair`);
- `results`: the typed results (`UnitResult`, `Report`) with their published schema; `report`:
  report.json, report.md and junit.xml of a `Report`;
- `unit_store`: finished units on disk, verified before a resume trusts them; `shard`: units across
  the GPUs of a host and across Ray workers;
- `matrix`: every pair of a kernel set at once (`alibi matrix`); `token_risk`: check 7's input, a
  replay's flip analysis; `bench`: how fast the pipeline runs and where its time goes (`alibi bench conform`).
"""
