"""The README's "Certify your own kernel" example runs as written: its kernel class, then its pytest test.

The two Python blocks are taken from README.md itself, so the example cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_kernel_example_declares_its_model_and_passes_its_own_readme_test():
    kernel_src = next(b for b in _python_blocks() if b.startswith("# my_kernel.py"))
    test_src = next(b for b in _python_blocks() if "assert_interchangeable" in b)
    namespace: dict = {}
    exec(compile(kernel_src, "README.md:my_kernel.py", "exec"), namespace)  # noqa: S102 - our own README
    kernel = namespace["MyKernel"]()
    assert kernel.epilogue.name == "a_then_w+add_before_cast"
    exec(compile(test_src, "README.md:test", "exec"), namespace)  # noqa: S102
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()


def test_the_readme_example_kernel_is_identified_as_the_model_it_declares():
    from alibi.identify import identify
    from alibi.synthetic import synthetic_tiles

    namespace: dict = {}
    exec(compile(next(b for b in _python_blocks() if b.startswith("# my_kernel.py")), "README.md", "exec"), namespace)  # noqa: S102
    found = identify(namespace["MyKernel"](), synthetic_tiles("epilogue-probe-bias", seed=0))
    assert [c.model for c in found if c.matches] == ["a_then_w+add_before_cast"]
