# integer-alibi on a CUDA machine: builds the CUTLASS kernels with nvcc at first use and runs the
# test suite, GPU tests included.   docker build -t alibi . && docker run --gpus all alibi
FROM nvidia/cuda:12.8.1-devel-ubuntu24.04

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv git \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/alibi
ENV PATH=/opt/alibi/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt .ci/constraints.txt
COPY alibi alibi
COPY tests tests
# CUDA build of torch (its default wheel on Linux) with the triton it pins; the CPU pins in
# .ci/constraints.txt are for CI.
RUN python3 -m pip install --no-cache-dir "torch==2.9.1" && \
    grep -vE '^(torch|triton)==' .ci/constraints.txt > /tmp/constraints.txt && \
    python3 -m pip install --no-cache-dir -c /tmp/constraints.txt -e '.[test]'

CMD ["python3", "-m", "pytest", "-q"]
