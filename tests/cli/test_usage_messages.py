"""Usage errors say what was meant: a mistyped command gets a "did you mean", the help it points to exists,
`alibi --help` lists the exit codes, and an unknown kernel name is refused before torch loads (issue 25)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from alibi.cli import EXIT_CODES, main


@pytest.mark.parametrize("argv,expected", [
    (["confrom"], "alibi: error: unknown command 'confrom'; did you mean 'conform'? (see 'alibi --help')"),
    (["kernels", "buld"], "alibi: error: unknown command 'buld'; did you mean 'build'? (see 'alibi kernels --help')"),
    (["conform", "--bogus"], "alibi: error: unrecognized arguments: --bogus (see 'alibi conform --help')"),
])
def test_a_mistyped_command_suggests_the_closest_one_and_names_help_that_exists(argv, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.strip() == expected and "alibi alibi" not in err


def test_alibi_help_lists_every_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert EXIT_CODES in out
    codes = [line.split()[0] for line in EXIT_CODES.splitlines()[1:]]
    assert codes == ["0", "1", "2", "3", "4", "130"]


def test_an_unknown_kernel_name_is_refused_before_torch_is_imported(tmp_path):
    probe = ("import sys; from alibi.cli import main; "
             f"rc = main(['conform', '--kernel-a', 'tch-cpu', '--kernel-b', 'triton', '--out', {str(tmp_path / 'r')!r}]); "
             "print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert proc.stderr.strip() == ("alibi: error: --kernel-a: unknown kernel 'tch-cpu'; did you mean 'torch-cpu'? "
                                   "(see 'alibi kernels')")
    assert not (tmp_path / "r").exists()


def test_a_known_kernel_name_passes_the_early_check(monkeypatch):
    from alibi.errors import InputError
    from alibi.kernels.catalog import check_kernel_name

    monkeypatch.delitem(sys.modules, "alibi.kernels.registry", raising=False)  # as in a fresh `alibi` process
    for name in ("torch-cpu", "vllm-triton", "emulator:w_then_a", "mutant:truncate-cast:triton"):
        check_kernel_name(name, "--kernel-a")
    with pytest.raises(InputError, match="did you mean 'vllm-triton'"):
        check_kernel_name("vllm-triron", "--kernel-b")
