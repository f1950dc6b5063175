"""Where `alibi conform`'s time goes: `alibi bench conform` of one pair on one source, unprofiled (5 plain and 5 staged
runs after its warm-up), then again under cProfile; then, with `--cuda`, one `run_conformance` under torch.profiler
(host and CUDA activity, no stage timer).

    python analysis/h200/profile_conform.py OUT_FILE KERNEL_A KERNEL_B DEVICE (--synthetic PRESET | --tiles DIR)
        [--cuda]

Writes to OUT_FILE the bench table and the 40 functions with the most own and with the most cumulative time; with
`--cuda` also OUT_FILE's stem + `-cuda.txt`: the unprofiled bench's plain wall, the GPU's busy time against the
wall of the profiled run, and the operators by CUDA time and by count (analysis/h200/throughput.sh runs it on the
GPU, with the synthetic presets at M = 512).
"""

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

from alibi.conform.bench import bench_conform, format_table
from alibi.conform.pipeline import choose_pair, run_conformance, source_from_dir, source_from_preset

out, kernel_a, kernel_b, device, kind, value = sys.argv[1:7]
cuda = "--cuda" in sys.argv[7:]
source = source_from_preset(value, rows=512) if kind == "--synthetic" else source_from_dir(value)
pair = choose_pair(kernel_a, kernel_b)
plain = bench_conform(pair, source, devices=[device], repeats=5)  # unprofiled: the warm-up, and the plain walls
profile = cProfile.Profile()
profile.enable()
result = bench_conform(pair, source, devices=[device], repeats=1)
profile.disable()
text = io.StringIO()
text.write(format_table(result) + "\n\n")
for key in ("tottime", "cumulative"):
    pstats.Stats(profile, stream=text).sort_stats(key).print_stats(40)
Path(out).write_text(text.getvalue())
print(format_table(result))

if cuda:
    (t,) = plain.timings
    lines = [(f"plain runs (bench, unprofiled), {t.repeats}: median {t.wall.seconds:.4f} s, "
              f"{t.wall.elements_per_s / 1e6:.1f} M el/s; spread {t.wall.spread[0]:.4f}–{t.wall.spread[1]:.4f}")]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        run_conformance(pair, source, device=device)
        torch.cuda.synchronize()
        profiled = time.perf_counter() - t0
    events = prof.key_averages()
    # the device's own events (kernels, copies, sets): an operator's self device time repeats its kernels'
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type != torch.autograd.DeviceType.CPU)
    lines.append(f"profiled run: wall {profiled:.4f} s (profiler overhead included), GPU busy {gpu_us / 1e6:.4f} s "
                 f"(self time of the device's events), {sum(e.count for e in events)} events")
    lines.append(events.table(sort_by="self_device_time_total", row_limit=45, max_name_column_width=70))
    lines.append(events.table(sort_by="count", row_limit=45, max_name_column_width=70))
    lines.append(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))
    Path(out).with_name(Path(out).stem + "-cuda.txt").write_text("\n".join(lines) + "\n")
    print(lines[0] + "\n" + lines[1])
