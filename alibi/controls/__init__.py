"""Positive controls and arithmetic facts: evidence that the checks can fire, and why the alibi holds.

- `mutant_matrix`: the detection matrix, every check against every deliberately faulty kernel of
  `alibi.kernels.mutants` (`alibi mutants`);
- `boundary`: the arithmetic facts the integer alibi rests on, checked through each kernel (`alibi boundary`);
- `identify`: which known epilogue model a black-box kernel implements (`alibi identify`).
"""
