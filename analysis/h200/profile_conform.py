"""Where `alibi conform`'s time goes on the GPU: `alibi bench conform` (cutlass vs triton, check device cuda) on the
Qwen3-1.7B preset and on `smollm2-135m-full` (the SmolLM2 capture's 210 shapes at M = 512, synthetic), under
cProfile, after one unprofiled warm-up run each. Writes, per source, the bench table and the 45 functions with
the most own time and with the most cumulative time, into the folder given.

    python analysis/h200/profile_conform.py OUT_DIR
"""

import cProfile
import io
import pstats
import sys
from pathlib import Path

from alibi.conform.bench import bench_conform, format_table
from alibi.conform.pipeline import choose_pair, source_from_preset

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
pair = choose_pair("cutlass", "triton")
for preset in ("qwen3-1.7b", "smollm2-135m-full"):
    source = source_from_preset(preset, rows=512)
    bench_conform(pair, source, devices=["cuda"], repeats=1)
    profile = cProfile.Profile()
    profile.enable()
    result = bench_conform(pair, source, devices=["cuda"], repeats=1)
    profile.disable()
    text = io.StringIO()
    text.write(format_table(result) + "\n\n")
    for key in ("tottime", "cumulative"):
        pstats.Stats(profile, stream=text).sort_stats(key).print_stats(45)
    (out / f"{preset}.txt").write_text(text.getvalue())
    profile.dump_stats(str(out / f"{preset}.prof"))
    print(format_table(result))
