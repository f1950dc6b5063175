"""Where `alibi conform`'s time goes: `alibi bench conform` of one pair on one source under cProfile, after one
unprofiled warm-up run. Writes the bench table and the 40 functions with the most own and with the most
cumulative time to OUT_FILE (and prints the table).

    python analysis/h200/profile_conform.py OUT_FILE KERNEL_A KERNEL_B DEVICE (--synthetic PRESET | --tiles DIR)

(analysis/h200/throughput.sh runs it on the GPU, with the synthetic presets at M = 512.)
"""

import cProfile
import io
import pstats
import sys

from alibi.conform.bench import bench_conform, format_table
from alibi.conform.pipeline import choose_pair, source_from_dir, source_from_preset

out, kernel_a, kernel_b, device, kind, value = sys.argv[1:7]
source = source_from_preset(value, rows=512) if kind == "--synthetic" else source_from_dir(value)
pair = choose_pair(kernel_a, kernel_b)
bench_conform(pair, source, devices=[device], repeats=1)
profile = cProfile.Profile()
profile.enable()
result = bench_conform(pair, source, devices=[device], repeats=1)
profile.disable()
text = io.StringIO()
text.write(format_table(result) + "\n\n")
for key in ("tottime", "cumulative"):
    pstats.Stats(profile, stream=text).sort_stats(key).print_stats(40)
with open(out, "w") as f:
    f.write(text.getvalue())
print(format_table(result))
