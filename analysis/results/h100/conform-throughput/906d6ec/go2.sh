# one call: before (gpu_payload/src-before.tar.gz) vs after (gpu_payload/src.tar.gz) throughput on the preset and the
# SmolLM2 shapes, the GPU tests of the changed code, then the host-cost probe of the after code
THROUGHPUT_SYNTHETIC=${SYN:-1} bash analysis/h200/ecosystem_chain.sh throughput > $OUT/chain.log 2>&1
cat $OUT/throughput-summary.txt | tail -3
W=/tmp/alibi; export ALIBI_CACHE=$W/alibi_cache ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CONFIG=$W/alibi_config TRITON_CACHE_DIR=$W/triton-cache
(cd /tmp/src && PYTHONPATH=/tmp/src timeout 150 python -m pytest -m gpu -q -p no:cacheprovider tests/conform/test_bench.py tests/kernels/test_private_copy.py tests/exact/test_emulator_device.py tests/conform/test_pipeline_order.py > $OUT/pytest-gpu.txt 2>&1; tail -3 $OUT/pytest-gpu.txt)
(cd /tmp/src && PYTHONPATH=/tmp/src timeout 100 python $OLDPWD/probe_tmp/host_costs.py smollm2-135m-full > $OUT/probe-after.txt 2>&1)
