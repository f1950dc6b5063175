# integer-alibi on a CUDA machine: builds the CUTLASS kernels with nvcc at first use and runs the
# test suite, GPU tests included.   docker build -t alibi . && docker run --gpus all alibi
#
# Not built here: the machines this project is developed on have no Docker daemon and no registry
# access, so no image has been built from this file. What is checked (tests/test_dockerfile.py):
# the torch version below is the one README.md and .ci/constraints.txt pin, and the CUDA base
# matches the CUDA major of that torch wheel on PyPI (torch 2.13.0: CUDA 13) and the nvcc 13.0
# the GPU results were built with.
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04

# The torch of README.md's install lines and .ci/constraints.txt (a test fails when they disagree).
ARG TORCH_VERSION=2.13.0

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv git \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/alibi
ENV PATH=/opt/alibi/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt .ci/constraints.txt
COPY alibi alibi
COPY tests tests
# The CUDA build of torch (its default wheel on Linux, with the triton it pins), then the package under
# the constraints, whose torch and triton lines are the CPU CI's (the torch pin is the same version).
RUN python3 -m pip install --no-cache-dir "torch==${TORCH_VERSION}" && \
    grep -vE '^(torch|triton)==' .ci/constraints.txt > /tmp/constraints.txt && \
    python3 -m pip install --no-cache-dir -c /tmp/constraints.txt -e '.[test]'

CMD ["python3", "-m", "pytest", "-q"]
