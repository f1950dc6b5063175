"""One example invocation per command, shown at the end of `alibi <command> --help`.

`EXAMPLES` maps a command path (`"conform"`, `"replay teacher-forced"`) to one command line. A group
(`alibi replay`) shows the examples of its commands. `attach_examples` puts them in each parser's
epilog, after whatever epilog the command module wrote; tests/cli/test_help_examples.py holds that
every command has one and that each parses with its own parser. Paths in the examples are the
README's and docs/models.md's: `model/` from `alibi model prepare`, `tiles/` from `alibi capture`,
the committed prompt set `experiments/prompts/wikipedia-8x512` (run from a clone).
"""

from __future__ import annotations

import argparse

SET = "experiments/prompts/wikipedia-8x512"

EXAMPLES: dict[str, str] = {
    "conform": "alibi conform --kernel-a torch-cpu --kernel-b triton --synthetic default --out alibi-report",
    "matrix": "alibi matrix --kernels torch-cpu,triton,emulator:a_then_w --synthetic default --out matrix",
    "kernels": "alibi kernels",
    "kernels build": "alibi kernels build cutlass --arch sm_90",
    "identify": "alibi identify torch-cpu",
    "probe fp8-mma": "alibi probe fp8-mma --out fp8-mma-probe",
    "mutants": "alibi mutants --base torch-cpu --out mutants",
    "boundary": "alibi boundary --kernel torch-cpu --out boundary.json",
    "run": "alibi run experiments/cpu-smoke.yaml",
    "manifest write": "alibi manifest write run-a --kind replay --kernel-log run-a/vllm.log --arm cutlass",
    "manifest verify": "alibi manifest verify tiles tiles-pow2 --treatment checkpoint",
    "manifest provenance": "alibi manifest provenance alibi-report --repo .",
    "prereg init": "alibi prereg init prereg/my-study --title 'CUTLASS vs Triton token flips'",
    "prereg lock": "alibi prereg lock prereg/my-study",
    "prereg amend": "alibi prereg amend prereg/my-study --reason 'one more prompt window'",
    "prereg verify": "alibi prereg verify prereg/my-study",
    "prereg status": "alibi prereg status prereg/my-study",
    "prereg evaluate": "alibi prereg evaluate prereg/my-study --result real=tf/flips/flips.json --out evaluation.json",
    "bench conform": "alibi bench conform --kernel-a cutlass --kernel-b triton --synthetic default --repeats 5 "
                     "--out bench",
    "bench runner": "alibi bench runner --model smollm2/w8a8 --kernel triton "
                    "--prompts experiments/prompts/wikipedia-64x512 --batch 64 --prompt-tokens 128 --out runner.json",
    "model prepare": "alibi model prepare smollm2-135m --out model",
    "model info": "alibi model info model/w8a8",
    "prompts build": "alibi prompts build --text corpus.txt --tokenizer model/w8a8 --windows 8 --tokens 512 --out set",
    "prompts show": f"alibi prompts show {SET}",
    "capture": f"alibi capture --model model/w8a8 --prompts {SET} --tokens 32 --kernel torch-cpu --out tiles",
    "capture-overhead": f"alibi capture-overhead --model model/w8a8 --prompts {SET} --tokens 512 --kernel torch-cpu",
    "predict": "alibi predict --tiles tiles --out predictions.json",
    "predict-pair": "alibi predict-pair cutlass triton --synthetic smollm2-135m-bias",
    "eval perplexity": f"alibi eval perplexity --model model/w8a8 --prompts {SET} --kernel torch-cpu",
    "eval generate": f"alibi eval generate --model model/w8a8 --prompts {SET} --kernel torch-cpu --prompt-tokens 64 "
                     "--new-tokens 32",
    "pow2-rewrite": "alibi pow2-rewrite model/w8a8 model/w8a8-pow2 --mode ceil --requantize-from model/bf16",
    "replay teacher-forced": f"alibi replay teacher-forced --model model/w8a8 --prompts {SET} --kernel-a torch-cpu "
                             "--kernel-b emulator:a_then_w --windows 1 --out tf",
    "replay greedy": f"alibi replay greedy --model model/w8a8 --prompts {SET} --kernel-a torch-cpu "
                     "--kernel-b emulator:a_then_w --windows 2 --prompt-tokens 64 --new-tokens 16 --out greedy",
    "replay prefill-vs-decode": f"alibi replay prefill-vs-decode --model model/w8a8 --kernel torch-cpu --prompts {SET} "
                                "--windows 1 --out prefill-decode",
    "variations": f"alibi variations --model model/w8a8 --kernel torch-cpu --prompts {SET} --windows 1 --out var",
    "locate": "alibi locate run-a run-b --out where",
    "analyze flips": "alibi analyze flips tf/arm-a tf/arm-b --out flips",
    "analyze depth": "alibi analyze depth int8 fp8 --rows rows --out fits",
    "sweep depth": "alibi sweep depth --kernel-a torch-cpu --kernel-b emulator:a_then_w --format int8 "
                   "--K 512,1024,2048,4096 --out int8-cpu",
    "sweep rows": "alibi sweep rows --kernel-a cutlass --kernel-b triton --elements 1e8 --out rows",
    "report html": "alibi report html alibi-report",
}


MARK = "\n\nexample"  # where the example block starts in an epilog (attach_examples writes it so)


class _KeepExamples(argparse.HelpFormatter):
    """Leaves the example block as written (one command per line) and fills every other text as before."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        head, sep, block = text.rpartition(MARK)
        if not sep:
            return super()._fill_text(text, width, indent)
        kept = "".join(indent + line for line in (MARK.lstrip("\n") + block).splitlines(keepends=True))
        return (super()._fill_text(head, width, indent) + "\n\n" if head.strip() else "") + kept


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: p for a in parser._actions if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
            for name, p in a.choices.items()}


def command_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                    ) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser under `parser`, by command path ("replay", "replay teacher-forced", ...)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for name, sub in _subcommands(parser).items():
        found[" ".join((*path, name))] = sub
        found.update(command_parsers(sub, (*path, name)))
    return found


def examples_for(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """The command's own example, then (for a group) one per command in it."""
    own = [EXAMPLES[path]] if path in EXAMPLES else []
    children = [e for name in _subcommands(parser) for e in examples_for(f"{path} {name}", _subcommands(parser)[name])]
    return own + [e for e in children if e not in own]


def attach_examples(parser: argparse.ArgumentParser) -> None:
    """Append each command's example(s) to its epilog (see the module docstring)."""
    for path, sub in command_parsers(parser).items():
        lines = examples_for(path, sub)
        if not lines:
            continue
        block = ("example:\n" if len(lines) == 1 else "examples:\n") + "".join(f"  {line}\n" for line in lines)
        sub.epilog = f"{(sub.epilog or '').rstrip()}\n\n{block}"
        if not issubclass(sub.formatter_class, _KeepExamples):
            sub.formatter_class = type(f"Examples{sub.formatter_class.__name__}", (_KeepExamples, sub.formatter_class), {})
