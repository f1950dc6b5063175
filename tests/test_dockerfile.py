"""The Dockerfile installs the versions the README and CI install (issue 26: it pinned torch 2.9.1 on a
CUDA 12.8 base while README and CI used torch 2.13.0, and nothing compared them). No image is built here
(no Docker on these machines): these tests read the files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hostile import REPO

# CUDA major of the default (PyPI) Linux wheel of each torch release this project pins.
TORCH_CUDA_MAJOR = {"2.13.0": 13}


def dockerfile_torch(text: str) -> str:
    found = re.findall(r"^ARG TORCH_VERSION=(\S+)$", text, re.M)
    literal = re.findall(r"torch==(\d[\w.+]*)", text)
    assert len(found) == 1, "the Dockerfile names its torch once, as ARG TORCH_VERSION"
    assert literal == [], f"the Dockerfile pins torch=={literal[0]} outside TORCH_VERSION"
    return found[0]


def readme_torch(text: str) -> set[str]:
    return set(re.findall(r"pip install[^\n`]*?torch==(\d[\w.]*)", text))


def constraints_torch(text: str) -> str:
    return re.search(r"^torch==(\S+)$", text, re.M).group(1)


def cuda_base_major(text: str) -> int:
    return int(re.search(r"^FROM nvidia/cuda:(\d+)\.\d+(\.\d+)?-devel", text, re.M).group(1))


def test_the_dockerfile_installs_the_torch_of_the_readme_and_the_constraints():
    docker = (REPO / "Dockerfile").read_text()
    readme, pins = readme_torch((REPO / "README.md").read_text()), constraints_torch(
        (REPO / ".ci" / "constraints.txt").read_text())
    assert readme == {pins}, f"README installs torch {sorted(readme)}, the constraints pin {pins}"
    assert dockerfile_torch(docker) == pins


def test_the_dockerfile_cuda_base_matches_its_torch_wheels_cuda():
    docker = (REPO / "Dockerfile").read_text()
    torch_version = dockerfile_torch(docker)
    assert torch_version in TORCH_CUDA_MAJOR, f"record the CUDA major of torch {torch_version}'s PyPI wheel here"
    assert cuda_base_major(docker) == TORCH_CUDA_MAJOR[torch_version]


@pytest.mark.parametrize("dockerfile, message", [
    ('ARG TORCH_VERSION=2.13.0\nRUN pip install "torch==2.9.1"\n', "outside TORCH_VERSION"),
    ('FROM nvidia/cuda:12.8.1-devel-ubuntu24.04\nRUN pip install "torch==2.9.1"\n', "names its torch once"),
    ("FROM nvidia/cuda:12.8.1-devel-ubuntu24.04\nARG TORCH_VERSION=2.9.1\n", None),
])
def test_a_dockerfile_pinning_another_torch_is_caught(tmp_path, dockerfile, message):
    if message is not None:
        with pytest.raises(AssertionError, match=message):
            dockerfile_torch(dockerfile)
    else:
        assert dockerfile_torch(dockerfile) != constraints_torch((REPO / ".ci" / "constraints.txt").read_text())
        assert cuda_base_major(dockerfile) == 12
