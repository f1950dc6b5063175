"""Every issue-16 hardening test fails on the code before its fix, and passes at HEAD.

Issue 16 asks that "each case above has a test that fails before the fix". This script checks it
for every test that the issue-16 commits added or changed, by running HEAD's tests against old code:

1. For each declared fix (`FIXES`: the commit that added or changed the tests, and the commit whose
   code is "before the fix" — the test commit's parent when fix and test came together, the fix
   commit's parent when a later commit only added the test), the tests are found from git itself:
   every `test_*` function of a `tests/**/test_*.py` file the commit touched whose source text
   differs from the parent's (new, or rewritten), and that still exists under that name at HEAD.
2. The old code is checked out into a temporary `git worktree`; its `tests/` folder is replaced by
   HEAD's (the test files and the helpers they import: the tests are the instrument, only the code
   is old). A fix that changed no code (a test that reaches a branch nothing reached before) has no
   "before": its entry names a *mutation* instead — one exact text replacement in HEAD's code that
   breaks the property the test claims — and the test must fail on the mutated code.
3. pytest runs only those test ids there (`-q -p no:cacheprovider`, junit XML for per-case outcomes;
   not `-x`, which would hide every outcome after the first expected failure), once per distinct
   old code, and once more on a clean worktree of HEAD.

A test that passes on the old code cannot fail for the reason it claims: the table lists it as
`cannot fail`. One that fails only because HEAD's test file does not import on the old code
(`collect-error`: the fix added the module the test imports) is listed apart, since that failure
shows the module was missing, not that the test would catch the bug.

    python analysis/hardening_regressions.py [--out analysis/results/hardening-regressions.json]
                                             [--only COMMIT ...] [--timeout 900]

Writes the `HardeningRegressions` record (schema below, docs/hardening.md) and prints a table.
Needs a git checkout; the main working tree is not touched (worktrees live under a temporary folder
and are removed, also on failure).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCHEMA = "alibi.hardening-regressions/1"
DEFAULT_OUT = REPO / "analysis" / "results" / "hardening-regressions.json"
# pytest's address space: a test of an unbounded allocation that runs in-process on old code must
# hit MemoryError, not the shared 24 GiB machine. 12 GiB leaves torch, triton and a real SmolLM2
# conversion (≈ 1 GiB resident) room.
ADDRESS_SPACE = 12 * 2**30


@dataclass(frozen=True)
class Mutation:
    """One exact replacement in HEAD's code: `path` (repo-relative), `old` (must occur exactly once)
    and `new`; `why` says which property it breaks."""

    path: str
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class Fix:
    """One issue-16 fix and its tests.

    commit: the commit that added or changed the tests (their names are read from its diff); None:
    only the ids in `tests`, recorded under the commit that added their file.
    item: the issue-16 case it closes, in a few words.
    before: the commit whose code is "before the fix" (default `commit^`: fix and test together).
    only / exclude: restrict the commit's tests by function name (one commit's tests can guard
    fixes of different commits).
    mutations: for a test of a branch that was right all along (no code changed): run HEAD's code
    with these replacements instead of old code.
    tests: test ids given by hand, added to the discovered ones (e.g. a test strengthened later).
    """

    commit: str | None
    item: str
    before: str | None = None
    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    tests: tuple[str, ...] = ()


_RUN_KILL = "test_alibi_run_killed_at_any_write_resumes_to_the_bytes_of_an_uninterrupted_run"
_CONFORM = "test_conform_killed_at_any_write_leaves_the_old_report_or_the_complete_new_one"
_KILL3 = "tests/cli/test_kill_prepare_predict_eval.py"
_PREPARE = "test_model_prepare_killed_at_any_write_leaves_the_old_checkpoints_or_the_complete_new_ones"
_PREDICT = "test_predict_out_killed_at_its_write_leaves_the_old_file_or_the_complete_new_one_and_no_partial"
_EVAL = "test_eval_out_killed_at_its_write_leaves_the_old_file_or_the_complete_new_one_and_no_partial"

_ISSUE_26 = "2a29ac7"
_ISSUE_36 = "578c7d7"  # the code issue 36's hostile user tried
_KILL_POINTS = ("test_resume_without_a_plan_starts_afresh_and_says_so",
                "test_a_kill_during_the_clean_up_leaves_nothing_the_next_run_does_not_remove",
                "test_conform_killed_at_any_write_resumes_with_resume_to_the_bytes_of_an_uninterrupted_run")
_RESUME_TRUST = ("test_an_edited_unit_with_an_impossible_count_is_refused_on_resume",
                 "test_an_impossible_count_is_refused_even_with_its_digest_in_the_ledger",
                 "test_a_planted_unit_whose_digest_the_run_never_recorded_is_refused",
                 "test_a_unit_from_another_run_is_refused", "test_a_unit_of_other_tile_bytes_is_refused",
                 "test_a_unit_outside_the_unit_schema_is_refused",
                 "test_untouched_units_resume_and_the_report_and_manifest_say_how_many_came_from_disk",
                 "test_verify_units_recomputes_stored_units_and_refuses_one_that_differs",
                 "test_verify_units_without_resume_is_refused")

_PREREG_REPLAY = ("test_a_pre_registered_arm_manifest_pins_the_lock_hash_and_head",
                  "test_a_protocol_that_cannot_be_relied_on_is_one_line_exit_2_and_nothing_written",
                  "test_an_amendment_while_the_replay_runs_leaves_nothing_written",
                  "test_prereg_overlapping_the_output_and_prereg_with_vllm_are_refused_in_one_line",
                  "test_a_pre_registered_pair_pins_the_lock_in_each_arm_and_in_the_folder",
                  "test_the_pair_refuses_an_arm_whose_manifest_records_another_protocol")
_REPLAY_KILL = ("test_a_fresh_teacher_forced_arm_killed_at_any_write_leaves_nothing_or_the_complete_arm",
                "test_an_overwriting_teacher_forced_arm_killed_at_any_write_leaves_the_old_arm_or_the_new_one",
                "test_a_teacher_forced_pair_killed_at_any_write_leaves_nothing_or_the_complete_pair")

FIXES: tuple[Fix, ...] = (
    Fix("62dffba", "hostile tiles: header-only read, element budget, one seed rule, bounded JSON/YAML"),
    Fix("107ca56", "source.synthetic.rows over the element budget", before="62dffba^"),
    Fix("85bd370", "shard-index entries outside the folder (silent partial pow2 rewrite), index values, "
                   "config types and sizes"),
    Fix("c23652f", "manifest provenance: the commit whose tree has a result's source digest"),
    Fix("ac1c284", "safe outputs: overlaps, files over folders, /proc, stale stages, atomic swap, staged "
                   "reports, format check, dirty tree, bounded records, cpu_isa, last resort, build lock"),
    Fix("50a9dd4", "conform reports and manifests record the CPU model and ISA", before="ac1c284^"),
    Fix("d23cfee", "kill tests: staged commits of every writing command", before="ac1c284^", exclude=(_RUN_KILL,)),
    Fix("d23cfee", "kill test: alibi run's folder appears with experiment.yaml and run.json", only=(_RUN_KILL,)),
    Fix("8d17c1b", "fma_f32: FLT_MAX at the fp32 overflow tie"),
    Fix("eedf167", "criteria: analysis YAML through the safe loader, results through bounded JSON"),
    Fix("5b75e18", "analyze depth: one overlap rule for --out"),
    Fix("face5ed", "the GGUF cross-check runs (gguf in the test extra)"),
    Fix("ba182d1", "last-resort line keeps an OSError's message without strerror"),
    Fix("1c1e8bc", "tile names escaped in report.md; identity contract on a subject that is not a list"),
    Fix("eea5db8", "eval --out naming a folder or an input, refused before the model loads"),
    Fix("539bd1b", "mutants --out overlapping --tiles"),
    Fix("a9af34f", "bench: padding-free baseline, eager and graph, L2-cold, interleaved repeats with spread"),
    Fix("f3f0087", "bench CLI: --repeats and --l2 warm,cold"),
    Fix("e12b27b", "GPU tests that could not fail (fp8 bound on sm_90, CUTLASS fused bias)"),
    # 7278b43 changed no code: its tests reach branches that were right all along, or replace tests
    # that compared a function with itself. Each is held against a mutation of HEAD's code instead.
    Fix("7278b43", "check 2's 16384 int32 bound", before="HEAD",
        only=("test_check_2_uses_the_16384_bound_exactly_when_both_operands_contain_minus_128",),
        mutations=(Mutation("alibi/exact/emulator.py", "return 128 * 128 if (a_min and w_min) else 128 * 127",
                            "return 128 * 127", "the bound ignores −128 in both operands"),)),
    Fix("7278b43", "check 3 at max|acc| exactly 2^24", before="HEAD",
        only=("test_check_3_passes_at_max_acc_exactly_2_to_the_24_and_fires_one_above",),
        mutations=(Mutation("alibi/exact/emulator.py", "lossless = max_abs <= FP32_EXACT_LIMIT",
                            "lossless = max_abs < FP32_EXACT_LIMIT", "2^24 itself counted as lossy"),)),
    Fix("7278b43", "pow2 identity excludes overflowing results", before="HEAD",
        only=("test_pow2_identity_excludes_overflowing_results_where_the_orders_really_differ",),
        mutations=(Mutation("alibi/conform/checks.py", "if reference_fp32 is None else _normal_range_mask(reference_fp32)",
                            "if True else _normal_range_mask(reference_fp32)", "nothing excluded"),)),
    Fix("7278b43", "real-scale tolerance with no finite pair", before="HEAD",
        only=("test_real_scale_tolerance_without_a_finite_pair_is_inapplicable_unless_the_non_finite_outputs_differ",),
        mutations=(Mutation("alibi/conform/checks.py", "if not bool(finite.any()) and not bool(nonfinite_mismatch.any()):",
                            "if not bool(finite.any()):", "differing non-finite outputs called inapplicable"),)),
    Fix("7278b43", "a pair without declared epilogue models is inconclusive", before="HEAD",
        only=("test_a_pair_with_no_declared_model_is_inconclusive_not_pass",),
        mutations=(Mutation("alibi/conform/pipeline.py", 'req = ["shared-operands", "epilogue-model"]',
                            'req = ["shared-operands"]', "the epilogue model no longer required"),)),
    Fix("7278b43", "the exact number of differing elements", before="HEAD",
        only=("test_emulator_orders_report_the_exact_number_of_differing_elements_per_tile",),
        mutations=(Mutation("alibi/conform/pipeline.py", "n_elements=out_a.numel(), n_differing=n_differing,",
                            "n_elements=out_a.numel(), n_differing=n_differing + 1,", "every count one too many"),)),
    Fix("7278b43", "assert_interchangeable raises on a fired check", before="HEAD",
        only=("test_a_faulty_kernel_raises_an_assertion_error_with_one_line_per_fired_check",),
        mutations=(Mutation("alibi/testing.py", "for c in report.checks if c.fired]", "for c in report.checks if False]",
                            "fired checks ignored"),)),
    Fix("7278b43", "assert_interchangeable strict mode", before="HEAD",
        only=("test_strict_mode_also_fails_on_required_checks_that_could_not_be_applied",),
        mutations=(Mutation("alibi/testing.py", "    if strict:\n", "    if False:\n", "strict ignored"),)),
    Fix("7278b43", "the entry-point plugin path", before="HEAD",
        only=("test_an_entry_point_kernel_is_listed_loaded_and_runs_through_conform",
              "test_an_entry_point_that_does_not_return_a_kernel_is_refused",
              "test_the_cli_runs_a_plugin_kernel_installed_in_another_process"),
        mutations=(Mutation("alibi/kernels/catalog.py", 'entry_points(group="alibi.kernels")',
                            'entry_points(group="alibi.kernels.none")', "installed plugins not found"),)),
    Fix("7278b43", "assert_interchangeable returns this run's report", before="HEAD",
        only=("test_interchangeable_kernels_return_the_report_for_further_assertions",),
        mutations=(Mutation("alibi/testing.py", "    report = run_conformance(pair, source, regimes, seed=seed, ulp_threshold=ulp_threshold)",
                            "    report = run_conformance(pair, source, [\"pow2\"], seed=seed, ulp_threshold=ulp_threshold)",
                            "the regimes asked for are ignored"),)),
    Fix("7278b43", "assert_interchangeable reads tiles from a folder or takes them in code", before="HEAD",
        only=("test_tiles_may_be_given_as_a_folder_or_in_code",),
        mutations=(Mutation("alibi/testing.py", "        return source_from_dir(tiles)",
                            "        return source_from_preset(\"tiny\", seed=seed)",
                            "a folder is replaced by other tiles"),)),
    # The kill tests of `model prepare`, `predict --out` and `eval --out` (the commands already staged
    # their writes: nothing to revert), and the conform kill test's re-run from the killed state:
    # held against an unstaged write, a truncated file visible before the commit, and a toolkit that
    # never removes stale stages.
    *(Fix(None, why, before="HEAD", tests=ids, mutations=(m,)) for why, ids, m in (
        ("model prepare writes in place", (_KILL3 + "::" + _PREPARE,),
         Mutation("alibi/model/prepare.py", "    with atomic.staged_dir(out) as stage:\n",
                  "    if (stage := Path(out)).mkdir(parents=True, exist_ok=True) is None:\n",
                  "checkpoints written straight into OUT")),
        ("predict --out writes a truncated file before the commit", (_KILL3 + "::" + _PREDICT,),
         Mutation("alibi/model/predictions.py", "    atomic.write_text(out, ",
                  "    open(out, 'w').write('{'); atomic.write_text(out, ", "a partial file at --out")),
        ("eval --out writes a truncated file before the commit", (_KILL3 + "::" + _EVAL,),
         Mutation("alibi/cli/eval.py", "        atomic.write_text(args.out, ",
                  "        open(args.out, 'w').write('{'); atomic.write_text(args.out, ", "a partial file at --out")),
        ("stale stages of killed runs never removed",
         tuple(f"{_KILL3}::{t}" for t in (_PREPARE, _PREDICT, _EVAL)) + (f"tests/test_kill.py::{_CONFORM}",),
         Mutation("alibi/io/atomic.py", "    path = Path(path)\n    pattern = re.compile(",
                  "    return []\n    path = Path(path)\n    pattern = re.compile(", "remove_stale_stages does nothing")),
        )),
    # Issue 26 (hardening, third round): each item's tests, run on the code at 2a29ac7, where the hostile
    # user found them (`before`); tests that only follow a changed file layout (the units ledger) are left out.
    Fix("766fea6", "issue 26 #1: a resumed conform trusts no stored unit it did not compute", before=_ISSUE_26,
        only=tuple(t for t in _RESUME_TRUST if t not in _KILL_POINTS)),
    Fix("766fea6", "issue 26 #2: every kill point of conform recoverable by --resume", before=_ISSUE_26,
        only=_KILL_POINTS),
    Fix("766fea6", "issue 26 #3: a tile header's dtype no tile has is one line, not safetensors' KeyError",
        before=_ISSUE_26, only=("test_a_tile_whose_header_declares_an_operand_dtype_no_tile_has_is_one_line_naming_it",
                                "test_a_tile_with_the_dtypes_a_tile_has_is_read")),
    Fix("766fea6", "issue 26 #4: a refused conform leaves no folder", before=_ISSUE_26,
        only=("test_a_refused_fp8_run_with_int8_only_kernels_leaves_no_folder",
              "test_a_refused_ray_run_without_ray_installed_leaves_no_folder",
              "test_a_fresh_run_that_fails_before_its_first_unit_removes_its_units_folder")),
    Fix("0594ae7", "issue 26 #5, #6: symlinked folders in manifests, prereg verify exit code, capture-overhead "
                   "--repeats 0", before=_ISSUE_26),
    Fix("c6417ed", "issue 26 #7: a zip member's size bounded before it is decompressed", before=_ISSUE_26),
    Fix("578a4a2", "issue 26 #8: the kernel cache cannot vouch for itself", before=_ISSUE_26,
        only=("test_a_library_and_record_both_replaced_in_the_cache_are_refused_by_the_pin_outside_it",
              "test_a_library_no_build_of_yours_pinned_is_refused_unless_the_recorded_flag_is_set",
              "test_a_cache_library_or_pin_file_others_can_write_is_refused",
              "test_a_library_owned_by_another_user_is_refused")),
    Fix("4894f48", "issue 26 #9: every committed result manifest verifies", before=_ISSUE_26),
    Fix("fd50fe0", "issue 26 #9: results pinned by commit and source digest, the study by its lock hash",
        before=_ISSUE_26),
    Fix("729ba1a", "issue 26 #10: the Dockerfile's torch is the README's", before=_ISSUE_26),
    Fix("ede9515", "issue 26 #2: run --resume with no run folder falls back to a fresh run, named on one line",
        before=_ISSUE_26),
    Fix("35fc8d3", "issue 26 #9: a pre-registered replay's manifests pin the protocol's lock and head",
        before=_ISSUE_26, only=_PREREG_REPLAY),
    # The replay already staged its writes at 2a29ac7 (the kill tests fail there only for --prereg, which they
    # use): each is held against HEAD's code with the arm, or the pair, written straight into --out instead.
    Fix("35fc8d3", "issue 26 #2: every kill point of replay teacher-forced recoverable (the arm)", before="HEAD",
        only=_REPLAY_KILL[:2], mutations=(Mutation(
            "alibi/tokens/teacher_forced.py", "    with atomic.staged_dir(out) as stage:\n        write_records(",
            "    if (stage := Path(out)).mkdir(parents=True, exist_ok=True) is None:\n        write_records(",
            "an arm written straight into --out"),)),
    Fix("35fc8d3", "issue 26 #2: every kill point of replay teacher-forced recoverable (the pair)", before="HEAD",
        only=_REPLAY_KILL[2:], mutations=(Mutation(
            "alibi/tokens/teacher_forced.py", "        with atomic.staged_dir(out) as stage:\n            for label",
            "        if (stage := Path(out)).mkdir(parents=True, exist_ok=True) is None:\n            for label",
            "the pair written straight into --out"),)),
    Fix("247c985", "issue 26 #9: every committed result tied to a commit by a manifest, or registered as not",
        before=_ISSUE_26, only=("test_every_committed_result_is_tied_to_a_commit_or_registered_as_not",
                                "test_every_register_entry_says_why_and_what_would_make_it_again_and_is_still_unpinned",
                                "test_a_result_that_names_its_commit_only_inside_its_json_has_a_manifest_pinning_that_commit",
                                "test_a_json_result_of_a_dirty_tree_cannot_be_pinned_after_the_fact")),
    # Issue 36 #3, plugins isolated and unable to impersonate: each case is the command run with a hostile plugin
    # installed and the outcome expected, its test held against the code where it was found.
    *(Fix(None, f"issue 36 #3: {case}", before=_ISSUE_36, tests=(f"tests/kernels/test_plugin_isolation.py::{test}",))
      for case, test in (
        ("`alibi kernels` / `alibi conform --kernel-a P` with P's import calling sys.exit: P listed unavailable with "
         "the reason, the rest listed; conform exit 3, one line, no report",
         "test_a_plugin_whose_import_calls_sys_exit_is_listed_unavailable_with_the_reason_and_the_rest_still_listed"),
        ("`alibi kernels` with P's import hanging: P refused after ALIBI_PLUGIN_TIMEOUT, the rest listed",
         "test_a_plugin_whose_import_hangs_is_refused_after_the_timeout_and_the_rest_still_listed"),
        ("`alibi conform --kernel-a P` with P's import hanging: exit 3, one line, the process does not wait for it",
         "test_conform_with_a_plugin_whose_import_hangs_exits_3_with_one_line_and_does_not_wait_for_it"),
        ("`alibi kernels` / `alibi conform --kernel-a P` with P's available() raising, exiting or answering no "
         "(bool, reason): P listed unavailable with the reason; conform exit 3, one line",
         "test_a_plugin_whose_available_raises_or_answers_no_pair_is_listed_unavailable_and_conform_exits_3"),
        ("`alibi conform --kernel-a P` with P's Kernel.name a built-in's or another name: exit 3, one line naming "
         "both, no report under either name",
         "test_a_plugin_whose_kernel_name_is_not_its_entry_point_name_gets_no_report_under_either_name"),
        ("`alibi kernels` with a plugin registered as torch-cpu, emulator:…, mutant:…: one row per built-in name, "
         "the plugin listed apart as refused; the name runs the built-in",
         "test_a_plugin_registered_under_a_builtin_name_is_listed_apart_as_refused_and_the_name_keeps_meaning_the_builtin"),
        ("`alibi kernels` / `alibi conform --kernel-a P` with two packages registering P: refused naming both, "
         "exit 3", "test_two_packages_registering_one_name_are_refused_naming_both_not_one_picked_silently"),
        ("`alibi kernels` with P declaring formats = 8 or a string epilogue: P listed unavailable naming it",
         "test_a_plugin_with_a_malformed_declaration_is_listed_unavailable_naming_the_attribute"),
        ("`alibi conform --kernel-a P` with P's scaled_mm calling sys.exit(0): exit 4, one line, no report",
         "test_a_plugin_kernel_that_calls_sys_exit_while_it_runs_is_exit_4_in_one_line_not_exit_0_without_a_report"),
        ("`ALIBI_PLUGIN_TIMEOUT=soon alibi kernels`: exit 2, one line naming it",
         "test_a_bad_plugin_timeout_is_one_line_naming_the_setting"),
        ("`from alibi.kernels import Kernel` (the previous README's plugin API): works, warning with the new import",
         "test_the_previous_readmes_plugin_import_keeps_working_and_names_the_new_one"),
        ("`alibi conform --kernel-a P` with P written against the previous README's import: loads and runs",
         "test_a_plugin_written_against_the_previous_readme_loads_and_runs"),
      )),
    # Issue 36 #2, nothing alibi did not write is deleted or overwritten: each case is a command re-run over an
    # output holding something alibi did not write, and the outcome expected; held against the code where found.
    *(Fix(None, f"issue 36 #2: {case}", before=_ISSUE_36, tests=(test,)) for case, test in (
        ("`alibi conform --out R` twice, then again with R/.git/HEAD and R/.notes added: exit 2, one line naming "
         ".git/HEAD, R and the place beside it unchanged",
         "tests/io/test_foreign_files.py::test_conform_rerun_refuses_a_folder_holding_a_file_it_did_not_write"),
        ("`alibi conform --out R` over an earlier report whose manifest lists only report.json: exit 2 naming "
         "junit.xml (the manifest decides, not the file names)",
         "tests/io/test_foreign_files.py::test_conform_rerun_trusts_the_manifest_not_the_names_of_a_report_s_files"),
        ("`alibi matrix --out M` again with M/.notes added: exit 2, one line naming .notes, M unchanged",
         "tests/io/test_foreign_files.py::test_matrix_rerun_refuses_a_folder_holding_a_hidden_file_it_did_not_write"),
        ("`alibi variations --overwrite --out V` with V/mine.txt added to an earlier variations output: exit 2, one "
         "line naming mine.txt, V unchanged",
         "tests/tokens/test_variations.py::test_variations_overwrite_refuses_a_folder_holding_a_file_the_user_added"),
        ("`alibi pow2-rewrite IN OUT --overwrite` with OUT/.notes added to an earlier rewrite: exit 2 naming .notes, "
         "nothing changed",
         "tests/model/test_pow2_rewrite.py::test_overwrite_refuses_a_rewritten_checkpoint_holding_a_file_it_did_not_write"),
        ("`alibi capture --out C` / `alibi prompts build --out S` again with .notes added: exit 2 naming it, no "
         "stage left",
         "tests/model/test_capture_cli.py::test_capture_and_prompts_build_refuse_an_out_holding_a_file_they_did_not_write"),
        ("any folder output (`atomic.staged_dir`: model prepare, capture, sweep, mutants, analyze) over a folder "
         "without a manifest: refused naming its first file, the block never runs",
         "tests/io/test_foreign_files.py::test_a_folder_without_a_manifest_is_never_replaced_and_its_first_file_is_named"),
        ("a folder output over an earlier one holding an empty folder the user made: refused naming it",
         "tests/io/test_foreign_files.py::test_an_empty_folder_the_user_made_inside_an_output_is_refused"),
        ("`model prepare`'s layout (OUT/bf16, OUT/w8a8, a manifest each, none at OUT): replaced; with a file "
         "added in OUT/w8a8/tok: refused naming w8a8/tok/added.json",
         "tests/io/test_foreign_files.py::test_nested_outputs_are_replaced_by_their_own_manifests_until_a_file_none_lists_appears"),
        ("a file saved into the old output while the new one is staged: refused before the swap, the stage removed",
         "tests/io/test_foreign_files.py::test_a_file_put_into_the_output_while_the_new_one_is_staged_is_refused_before_the_swap"),
        ("a symbolic link at the output path: refused, the link and its target left as they were",
         "tests/io/test_foreign_files.py::test_a_symbolic_link_at_the_output_path_is_refused_and_left_in_place"),
        ("stages and write probes of other processes inside an output count as alibi's; a name that only looks "
         "like one does not",
         "tests/io/test_foreign_files.py::test_stages_and_write_probes_of_other_processes_are_alibi_s_own"),
        ("`alibi report html DIR --out notes.html` over the user's file, and into a folder holding the user's own "
         "report.html: exit 2, one line, the file unchanged; its own page is re-rendered",
         "tests/io/test_foreign_files.py::test_report_html_refuses_to_overwrite_a_file_it_did_not_render"),
    )),
    # Issue 36 #4, resource and environment failures are one line: each case is the command run against a full
    # disk (ENOSPC simulated at the write), an absurd count, a hidden output option, a hostile trace or a concurrent
    # amend, and the outcome expected; held against the code where it was found.
    *(Fix(None, f"issue 36 #4: {case}", before=_ISSUE_36, tests=(f"tests/io/test_resource_failures.py::{test}",))
      for case, test in (
        ("`alibi pow2-rewrite IN OUT --keep-weights` with the disk full at the first or second shard: exit 2, one "
         "line naming OUT and the fix, no stage, no folder made on the way, IN byte for byte",
         "test_a_full_disk_during_pow2_rewrite_is_one_line_naming_the_output_and_leaves_nothing"),
        ("`alibi model prepare smollm2-135m --out M` with the disk full at the first checkpoint: exit 2, one line "
         "naming M, nothing left",
         "test_a_full_disk_during_model_prepare_is_one_line_naming_the_output_and_leaves_nothing"),
        ("`alibi conform --out D/sub/R` with the disk full at the plan, at a unit, at the report's last file: exit "
         "2, one line naming R and --out, no units folder, no D/sub",
         "test_a_full_disk_during_conform_is_one_line_naming_out_and_a_fresh_run_leaves_nothing"),
        ("`alibi conform --resume` with the disk full: exit 2, one line naming the kept units and --resume, the "
         "units as they were",
         "test_a_full_disk_during_a_resumed_conform_keeps_the_units_and_says_to_resume"),
        ("a library's error wrapping ENOSPC (safetensors' `os error 28`) outside a staged write: exit 2, one line",
         "test_a_library_error_that_wraps_enospc_outside_a_staged_write_is_one_line_exit_2"),
        ("`alibi sweep rows --elements 1e30`, `sweep depth --seeds 10^12`, `analyze flips|depth --bootstrap "
         "10^12`: exit 2, one line naming the option and the limit, before any work or input read",
         "test_absurd_counts_are_refused_in_one_line_naming_the_option_before_any_work"),
        ("`alibi variations … --execution decode@1 --execution-out X` with X under /proc, under a file, or a "
         "folder: exit 2, one line naming --execution-out, before the model loads",
         "test_the_hidden_execution_out_is_refused_before_the_model_loads"),
        ("an execution saved while the disk fills: one line, no partial file",
         "test_an_execution_is_saved_atomically_and_a_full_disk_leaves_no_file"),
        ("a trace.pt holding a pickled object, lacking 'name', with a digest of another shape or of no call, or "
         "empty: one InputError naming the file, no `weights_only=False` advice",
         "test_a_pickled_incomplete_or_misshapen_trace_is_one_input_error_without_weights_only_advice"),
        ("a pickled trace.pt: refused without being unpickled (its payload never runs)",
         "test_a_pickled_trace_is_never_unpickled"),
        ("two `alibi prereg amend` of one folder at once: one records its amendment, the other is refused in one "
         "line; the chain verifies with one entry",
         "test_of_two_concurrent_amends_one_wins_and_the_other_is_refused"),
        ("the same without flock (an amend that took no lock wrote meanwhile): the log's compare-and-swap refuses "
         "the later writer, the earlier amendment kept",
         "test_an_amendment_recorded_meanwhile_by_a_writer_without_the_lock_refuses_the_other"),
        ("`alibi prereg amend P` while another process holds P: exit 2, one line, nothing written",
         "test_prereg_amend_while_another_process_holds_the_folder_is_one_line_exit_2_and_writes_nothing"),
      )),
    # Issue 36 #0, the default run tests every part of a declaration: each case is what a new user ran with a kernel
    # that departs from its declaration, and the outcome expected; held against the code where it was found.
    *(Fix(None, f"issue 36 #0: {case}", before=_ISSUE_36, tests=(test,)) for case, test in (
        ("`alibi conform --kernel-a K --kernel-b torch-cpu` (default source) with K declaring add_before_cast and "
         "casting before it adds its bias: verdict FAIL, epilogue-model fired",
         "tests/conform/test_default_source.py::test_a_kernel_that_lies_about_its_bias_mode_fails_the_default_conform"),
        ("the same with K fusing its bias (fma) or casting first, declaring add_before_cast: FAIL",
         "tests/conform/test_default_source.py::"
         "test_a_kernel_declaring_add_before_cast_that_fuses_or_casts_first_fails_the_default_conform"),
        ("the README's pytest example (`assert_interchangeable(K, \"torch-cpu\")`, no tiles) with that K: "
         "NotInterchangeable, epilogue-model fired",
         "tests/conform/test_default_source.py::"
         "test_assert_interchangeable_without_tiles_fails_a_kernel_that_lies_about_its_bias_mode"),
        ("the default source: bf16 and fp16 outputs, a bias in fp32 and in the output dtype, M = 1 and a prefill M",
         "tests/conform/test_default_source.py::"
         "test_the_default_source_has_fp32_and_output_dtype_biases_bf16_and_fp16_outputs_and_decode_and_prefill_m"),
        ("each of the 15 epilogue models: every one-attribute departure (order, rounding, bias mode) shows on the "
         "default source in each of bf16/fp16 × decode/prefill",
         "tests/conform/test_default_source.py::test_every_single_attribute_departure_of_every_model_shows_on_the_default_source"),
        ("a source claiming every attribute without fp16 tiles or a bias: verdict inconclusive, naming the "
         "attribute, arm and context (never pass)",
         "tests/conform/test_default_source.py::"
         "test_a_source_that_claims_every_attribute_but_lacks_float16_and_biases_is_inconclusive_naming_them"),
        ("the default run of an honest pair: pass, and the report's source.exercised shows nothing left unexercised",
         "tests/conform/test_default_source.py::"
         "test_the_default_source_records_that_it_exercised_every_attribute_of_both_declarations"),
        ("`alibi identify K` with K declaring a model its bits do not match: exit 1, one line naming the declared "
         "model and the match; an honest K exits 0",
         "tests/controls/test_identify.py::"
         "test_identify_exits_1_naming_the_match_when_the_declared_model_is_not_among_the_matches"),
    )),
    # Issue 36 #1, every command that reads a result verifies it first: each case is a command run on a result
    # changed after alibi wrote it, forged to contradict itself (its manifest rewritten to match), without its
    # manifest, of another kind or of an older schema lacking what is compared, and the outcome expected; held
    # against the code where it was found.
    *(Fix(None, f"issue 36 #1: {case}", before=_ISSUE_36, tests=(test,)) for case, test in (
        ("`alibi locate A B` with a logit digest of B's run.json changed: exit 2, one line naming B and its "
         "manifest (was: identical)",
         "tests/tokens/test_locate_verified.py::"
         "test_locate_refuses_a_run_whose_logit_digest_was_changed_after_it_was_written"),
        ("`alibi locate A B` with B's manifest.json removed: exit 2, one line naming B",
         "tests/tokens/test_locate_verified.py::test_locate_refuses_a_run_folder_without_its_manifest"),
        ("`alibi locate A B` with B an alibi-greedy-run/v1 run (no logit digests), its manifest intact: exit 2 "
         "naming run.json and the logit digests it lacks, never `identical`",
         "tests/tokens/test_locate_verified.py::"
         "test_locate_refuses_an_older_run_without_logit_digests_instead_of_calling_it_identical"),
        ("`alibi locate A B` with B's manifest of another kind (flip-analysis): exit 2 naming the kind",
         "tests/tokens/test_locate_verified.py::test_locate_refuses_a_folder_whose_manifest_is_of_another_kind"),
        ("`alibi report html M` with M/matrix.json's cells set to bitwise after it was written: exit 2 naming "
         "matrix.json and its manifest, no page",
         "tests/governance/test_verified_results.py::test_report_html_refuses_a_matrix_json_changed_after_it_was_written"),
        ("`alibi report html M` with every cell forged bitwise and the manifest rewritten to match: exit 2, "
         "\"contradicts itself: … says bitwise with 243 differing elements\" (was: drawn all-bitwise)",
         "tests/governance/test_verified_results.py::test_report_html_refuses_a_forged_all_bitwise_matrix_even_under_a_rewritten_manifest"),
        ("`alibi report html M` with a cell whose totals are not its units' sums, a unit explained with "
         "predicted ≠ differing, or a pair missing (manifest rewritten): exit 2 naming the contradiction",
         "tests/governance/test_verified_results.py::test_report_html_refuses_a_matrix_whose_cell_contradicts_its_units"),
        ("`alibi report html D` on a report.json no manifest covers: exit 2 naming the file, nothing written",
         "tests/html/test_cli_report.py::"
         "test_a_folder_no_manifest_covers_is_refused_naming_its_json_and_nothing_is_written"),
        ("`alibi prereg evaluate P --result real=F/flips.json` with one byte of flips.json changed: exit 2 naming "
         "it (was: judged)",
         "tests/governance/test_verified_results.py::test_prereg_evaluate_refuses_a_flips_json_that_fails_its_own_manifest"),
        ("`alibi prereg evaluate P --result real=loose.json` with no manifest covering it: exit 2 naming it",
         "tests/governance/test_verified_results.py::test_prereg_evaluate_refuses_a_result_no_manifest_covers"),
        ("`alibi prereg evaluate P --result m=M/matrix.json` forged all-bitwise under a rewritten manifest: exit 2, "
         "contradicts itself",
         "tests/governance/test_verified_results.py::test_prereg_evaluate_refuses_a_matrix_that_contradicts_itself"),
        ("`alibi analyze depth S` / `--rows R` with one byte added to depth.json / rows.json: exit 2 naming it",
         "tests/sweep/test_cli_sweep.py::test_analyze_depth_refuses_a_sweep_changed_after_it_was_written"),
        ("`alibi analyze flips A B` with B/records.json edited, with and without --allow-unverified: exit 2 "
         "naming it (was: an identity violation that --allow-unverified waived)",
         "tests/tokens/test_flips.py::"
         "test_an_edited_records_file_is_refused_before_it_is_read_even_with_allow_unverified"),
        ("`alibi conform --replay F/flips.json` with its flip rate edited to 0: exit 2 naming it, no report",
         "tests/conform/test_cli_conform.py::"
         "test_a_replay_flips_json_changed_after_it_was_written_is_refused_before_check_7_reads_it"),
        ("`alibi conform --resume` with an edited unit and a planted ledger.shard-3.json of the run's plan "
         "recording it: exit 2 naming the unit, not in the run's ledger",
         "tests/conform/test_resume_trust.py::"
         "test_a_planted_ledger_of_a_shard_the_run_never_started_does_not_vouch_for_a_unit"),
        ("a resumed sharded run whose unit is vouched for only by the ledger of another shard, or of a shard it "
         "never started: refused naming the unit; by the shard it was assigned to: trusted",
         "tests/conform/test_resume_trust.py::"
         "test_a_shard_ledger_vouches_only_for_the_units_the_run_assigned_to_that_shard"),
    )),
    # Issue 36 #5, `alibi variations` detects what it was built for: each case is a runner fault of the kind seen
    # natively on the H200, or the default run, and the outcome expected; held against the code where found.
    *(Fix(None, f"issue 36 #5: {case}", before=_ISSUE_36, tests=(f"tests/tokens/{test}",)) for case, test in (
        ("an attention core that varies only at decode in batches of 6 or more (4 prompts, default sizes): "
         "batch-size-6 fails naming the attention core at the first decode step; batches of 2 and 4 hold",
         "test_variations_protocol.py::"
         "test_an_attention_core_that_varies_only_in_large_batches_at_decode_fails_the_large_batch_alone"),
        ("an attention fault at the last row of a large batch only: named at prompt 0's needle row",
         "test_variations_protocol.py::test_an_attention_fault_at_the_last_row_only_is_named_at_the_needle_row"),
        ("an attention core that differs from run to run: the repeat variation (3 runs in one process) fails "
         "naming it",
         "test_variations_protocol.py::test_a_nondeterministic_attention_core_fails_the_repeat_variation_and_is_named"),
        ("`alibi variations` at default sizes: batches 2, 4, N+2 with needle rows, 3 repeats, the cold restart at "
         "the large batch, all recorded and stated as what a pass certifies",
         "test_variations_protocol.py::"
         "test_the_default_run_records_its_sizes_restarts_at_the_large_batch_and_says_what_a_pass_certifies"),
        ("the deterministic runner on the CPU: every default variation holds, every row of each batch compared",
         "test_variations.py::test_the_deterministic_runner_passes_every_default_variation_on_the_tiny_llama"),
        ("`alibi variations --batch-sizes 2,100000` or `--repeats 1000000`: exit 2, one line naming the option "
         "and the limit, before the model loads",
         "test_variations.py::test_an_absurd_batch_or_repeat_count_is_refused_before_any_model_loads"),
    )),
    # Issue 36 #6, behaviours of the new code that no test guarded: each was right all along, so each test is held
    # against a mutation of HEAD's code that breaks the behaviour it claims.
    *(Fix(None, f"issue 36 #6: {case}", before="HEAD", tests=(test,), mutations=(Mutation(path, old, new, why),))
      for case, test, (path, old, new, why) in (
        ("a variation failing at 4 of 16 positions: positions_identical = 12, as counted row by row on the logits",
         "tests/tokens/test_variations_evidence.py::"
         "test_a_variation_failing_at_some_positions_only_counts_exactly_the_rows_whose_logits_are_bitwise_equal",
         ("alibi/tokens/variations.py", "identical = sum(a.logits[ka] == b.logits[kb] for ka, kb in keys)",
          "identical = len(keys) if all(a.logits[ka] == b.logits[kb] for ka, kb in keys) else 0",
          "all or nothing counted")),
        ("two executions whose logits agree while the last MLP differs at a context position: the variation does "
         "not hold and names the module",
         "tests/tokens/test_variations_evidence.py::"
         "test_executions_whose_logits_agree_while_a_module_inside_differs_do_not_hold_and_name_the_module",
         ("alibi/tokens/variations.py", "holds=identical == compared and first is None)",
          "holds=identical == compared)", "a pass judged on the logits alone")),
        ("`alibi locate A B` of runs whose tokens and logits agree while a module differs: not identical, exit 1",
         "tests/tokens/test_variations_evidence.py::"
         "test_locate_calls_runs_whose_logits_and_tokens_agree_but_a_module_differs_not_identical",
         ("alibi/tokens/locate.py", "rows[0] == rows[1] and div is None", "rows[0] == rows[1]",
          "identical judged on the logits alone")),
        ("3 tiles × 2 regimes judged in one batch, a different element planted in each: pow2-identity fires in "
         "each pow2 unit with its own first mismatch",
         "tests/conform/test_judge.py::test_pow2_identity_fires_in_each_unit_of_one_batch_with_that_units_own_first_mismatch",
         ("alibi/conform/judge.py", '_first(masks, "pow2", i)', '_first(masks, "pow2", next(iter(masks["pow2"])))',
          "every unit given the first pow2 unit's mismatch")),
        ("the deterministic attention with a padded, non-causal mask per batch row: within 1e-5 of a float64 "
         "softmax built without the code under test",
         "tests/model/test_invariant_attention.py::"
         "test_attention_with_a_padded_non_causal_mask_agrees_with_a_float64_softmax_over_the_allowed_keys",
         ("alibi/model/invariant.py", "allowed = allowed.expand(b, hq, s, length)",
          "allowed = allowed[:1].expand(b, hq, s, length)", "every batch row masked by row 0's mask")),
        ("padded keys holding NaN leave every bit of the attention unchanged",
         "tests/model/test_invariant_attention.py::"
         "test_padded_keys_do_not_change_a_bit_of_the_result_even_when_they_hold_nan",
         ("alibi/model/invariant.py",
          "terms = torch.where(ok[..., None], weights[..., None] * v[:, :, None], -0.0)",
          "terms = weights[..., None] * v[:, :, None]", "masked values multiplied by a zero weight, not dropped")),
    )),
    # Issue 36 #0, held also against mutations of HEAD's code (on the code where it was found most of these tests
    # fail only to import, which shows the module was missing, not that they catch the departure)
    *(Fix(None, f"issue 36 #0 (mutation): {case}", before="HEAD", tests=(f"tests/conform/test_default_source.py::{test}",),
          mutations=(mutation,))
      for case, test, mutation in (
        *((case, test, Mutation("alibi/tiles/synthetic.py", "        tiles += declaration_probes(seed)",
                                "        tiles += []", "the default source without its declaration probes"))
          for case, test in (
            ("a kernel declaring add_before_cast that casts first fails the default conform",
             "test_a_kernel_that_lies_about_its_bias_mode_fails_the_default_conform"),
            ("one that fuses or casts first, declaring add_before_cast, fails it",
             "test_a_kernel_declaring_add_before_cast_that_fuses_or_casts_first_fails_the_default_conform"),
            ("assert_interchangeable without tiles fails it",
             "test_assert_interchangeable_without_tiles_fails_a_kernel_that_lies_about_its_bias_mode"),
            ("the default source has both bias dtypes, both outputs, decode and prefill M",
             "test_the_default_source_has_fp32_and_output_dtype_biases_bf16_and_fp16_outputs_and_decode_and_prefill_m"),
            ("every one-attribute departure of every model shows on the default source",
             "test_every_single_attribute_departure_of_every_model_shows_on_the_default_source"),
            ("the default run records every attribute of both declarations exercised",
             "test_the_default_source_records_that_it_exercised_every_attribute_of_both_declarations"))),
        ("a source claiming every attribute without float16 tiles or a bias is inconclusive, naming them",
         "test_a_source_that_claims_every_attribute_but_lacks_float16_and_biases_is_inconclusive_naming_them",
         Mutation("alibi/conform/pipeline.py", "        not_exercised = unexercised(accounting)",
                  "        not_exercised = []", "what no tile exercised no longer makes the verdict inconclusive")),
      )),
    # Issue 36 #6, a matrix pair without an exact prediction is never `explained` (right all along: a mutation)
    Fix(None, "issue 36 #6: a matrix pair whose arm declares no epilogue model: not-judged naming the arm, never "
        "explained", before="HEAD",
        tests=("tests/conform/test_matrix.py::test_a_pair_with_an_undeclared_arm_is_never_explained_and_says_which_arm",),
        mutations=(Mutation("alibi/conform/matrix.py", "    elif all(u.explained for u in units):",
                            "    elif all(u.explained is not False for u in units):",
                            "units without a prediction counted as explained"),)),
    # Issue 36 #7, the first hour honestly told: each case is what a new user read or ran, and the outcome expected;
    # held against the code and documents where it was found.
    *(Fix(None, f"issue 36 #7: {case}", before=_ISSUE_36, tests=(test,)) for case, test in (
        ("`alibi replay teacher-forced` of both arms without scikit-learn: exit 2 at once, one line naming "
         "integer-alibi[analysis], nothing written",
         "tests/cli/test_optional_library.py::"
         "test_replay_of_both_arms_without_scikit_learn_stops_at_once_in_one_line_naming_the_install"),
        ("`alibi analyze flips` without scikit-learn: one line",
         "tests/cli/test_optional_library.py::test_analyze_flips_without_scikit_learn_stops_in_one_line"),
        ("the README's Real models block names the install it needs, and the quick start installs it",
         "tests/test_readme_commands.py::test_the_model_section_names_the_install_its_block_needs_and_the_quick_start_installs_it"),
        ("the trace digest's collision bound for bf16 logit rows: 48 effective bits, as their digests hold",
         "tests/governance/test_doc_claims.py::"
         "test_the_trace_digests_stated_bound_for_bf16_rows_is_the_bits_their_digests_can_hold"),
        ("torchao-int8's differing elements against triton/vllm-triton: 20,754,309, as the committed matrix counts",
         "tests/governance/test_doc_claims.py::"
         "test_the_ecosystem_readme_gives_torchao_int8s_differing_elements_as_its_committed_matrix_counts_them"),
    )),
    # Issue 36 regression of #0: the default tiles' fp32-bias probes refused every pair with vLLM's kernels (bias in
    # the output dtype only) in conform, matrix and predict-pair; held against HEAD with the pair-aware source undone.
    *(Fix(None, f"issue 36 #0 regression: {case}", before="HEAD", tests=(f"tests/conform/test_output_dtype_bias_pairs.py::{test}",),
          mutations=(Mutation("alibi/conform/exercised.py",
                              '    if not narrow or not source.record.get("exercises_declarations"):',
                              "    if True:", "the default source not narrowed to the pair's declarations"),))
      for case, test in (
        ("`alibi conform` on the default tiles with a kernel declaring vLLM's output-dtype bias: pass, the 4 fp32-bias "
         "probes left out and said so, every attribute exercised",
         "test_a_pair_with_an_output_dtype_bias_kernel_passes_the_default_conform_without_the_fp32_bias_probes"),
        ("`alibi matrix` of two such kernels, torch-cpu and an emulator on the default tiles: exit 0, every cell "
         "pass; the fp32-bias probes left out of those kernels' pairs only",
         "test_the_matrix_on_the_default_tiles_runs_output_dtype_bias_kernels_and_leaves_only_their_fp32_probes_out"),
        ("`alibi predict-pair` with such a kernel on the default tiles: the fp32-bias probes left out and said so; "
         "kept for a pair without one",
         "test_predict_pair_on_the_default_tiles_leaves_out_only_the_probes_an_arm_never_takes"),
    )),
)


# --- git --------------------------------------------------------------------------------------------

def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def rev(spec: str) -> str:
    return git("rev-parse", "--verify", f"{spec}^{{commit}}").strip()


def show(commit: str, path: str) -> str | None:
    proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


def test_functions(source: str | None) -> dict[str, str]:
    """{pytest name (`test_x` or `TestC::test_x`): source text with decorators} of a test module."""
    if source is None:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    lines = source.splitlines()

    def text(node: ast.AST) -> str:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "\n".join(lines[start - 1: node.end_lineno])

    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            found[node.name] = text(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for m in node.body:
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name.startswith("test"):
                    found[f"{node.name}::{m.name}"] = text(m)
    return found


def changed_tests(commit: str) -> list[str]:
    """Test ids (`tests/…py::name`) that `commit` added or whose source it changed."""
    files = git("diff-tree", "--no-commit-id", "--name-only", "-r", commit, "--", "tests").split()
    ids = []
    for path in files:
        if not re.fullmatch(r"tests/(.+/)?test_[^/]+\.py", path):
            continue
        after, before = test_functions(show(commit, path)), test_functions(show(f"{commit}^", path))
        ids += [f"{path}::{name}" for name, src in after.items() if before.get(name) != src]
    return ids


def locate_at_head(test_id: str) -> str | None:
    """The id of `test_id` at HEAD: the same file, or — when the file was moved or the test moved
    between files — the one HEAD test file defining a test of that name; None if there is none."""
    path, name = test_id.split("::", 1)
    if name in test_functions(show("HEAD", path)):
        return test_id
    files = [f for f in git("ls-tree", "-r", "--name-only", "HEAD", "tests").split()
             if re.fullmatch(r"tests/(.+/)?test_[^/]+\.py", f)]
    found = [f for f in files if name in test_functions(show("HEAD", f))]
    return f"{found[0]}::{name}" if len(found) == 1 else None


def added_by(path: str) -> str:
    """The commit that added the file `path` (for tests given by id)."""
    return git("log", "--diff-filter=A", "--format=%H", "-1", "HEAD", "--", path).strip() or rev("HEAD")


def tests_of(fix: Fix) -> tuple[list[str], list[str]]:
    """(ids at HEAD, ids of the commit no test at HEAD carries) of `fix`."""
    found = changed_tests(fix.commit) if fix.commit else []
    keep = [t for t in found if (not fix.only or t.split("::", 1)[1] in fix.only)
            and t.split("::", 1)[1] not in fix.exclude]
    located = {t: locate_at_head(t) for t in [*keep, *fix.tests]}
    return (list(dict.fromkeys(v for v in located.values() if v)), [t for t, v in located.items() if v is None])


# --- results ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TestOutcome:
    """One test function (all its parametrized cases) on the old code and at HEAD.

    test: the pytest id at HEAD. commit: the issue-16 commit that added or changed it. item: the
    case it guards. old_code: the commit its old run used (full hash), or "HEAD" with `mutation`.
    mutation: the replacements applied to that code (None for plain old code). old / head: the
    outcome there — `failed` (a case failed or raised), `collect-error` (HEAD's test module did not
    import on that code), `passed`, `skipped` (every case skipped, e.g. needs a GPU), `timeout`,
    `not-run`. old_cases_failed / cases: counts of parametrized cases (at HEAD). verdict:
    `fails before the fix` (old failed, head passed), `fails on the mutation` (the same, against a
    mutation of HEAD's code), `fails only to import` (old collect-error,
    head passed), `cannot fail` (old passed), `not run here` (skipped on this machine), `fails at
    HEAD` (head did not pass).
    """

    test: str
    commit: str
    item: str
    old_code: str
    mutation: str | None
    old: str
    head: str
    old_cases_failed: int
    cases: int
    verdict: str


@dataclass(frozen=True)
class HardeningRegressions:
    """The check's record. schema: `alibi.hardening-regressions/1`. head: the commit tested. machine:
    CPU model, cores, Python and torch versions. seconds: wall time. tests: one `TestOutcome` each.
    counts: {verdict: number of tests}. gone: "commit: test id" of the tests an issue-16 commit
    added that no HEAD test file defines any more (removed or renamed since)."""

    schema: str
    head: str
    machine: dict
    seconds: float
    tests: tuple[TestOutcome, ...]
    counts: dict = field(default_factory=dict)
    gone: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> HardeningRegressions:
        doc = json.loads(text)
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} record (schema {doc.get('schema')!r})")
        return cls(schema=doc["schema"], head=doc["head"], machine=doc["machine"], seconds=doc["seconds"],
                   tests=tuple(TestOutcome(**t) for t in doc["tests"]), counts=doc["counts"],
                   gone=tuple(doc.get("gone", ())))


def verdict(old: str, head: str, mutated: bool = False) -> str:
    if head == "skipped" or (old == "skipped" and head in ("skipped", "passed")):
        return "not run here"
    if head != "passed":
        return "fails at HEAD"
    return {"failed": "fails on the mutation" if mutated else "fails before the fix",
            "collect-error": "fails only to import", "passed": "cannot fail"}.get(old, f"old {old}")


# --- running pytest in a worktree -------------------------------------------------------------------

def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def worktree(base: str, into: Path, mutations: Sequence[Mutation]) -> Path:
    """A detached worktree of `base` at `into`, with HEAD's tests/ and `mutations` applied."""
    git("worktree", "add", "--detach", "--quiet", str(into), base)
    shutil.rmtree(into / "tests")
    archive = subprocess.run(["git", "archive", "HEAD", "tests"], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for m in mutations:
        target = into / m.path
        text = target.read_text() if target.is_file() else ""
        if text.count(m.old) != 1:  # HEAD's code moved on: the mutation no longer says what it should
            raise StaleMutation(f"{m.path}: the text to replace occurs {text.count(m.old)} times, not once")
        target.write_text(text.replace(m.old, m.new))
    return into


class StaleMutation(Exception):
    """A mutation's text is not in HEAD's code exactly once (the code was rewritten since)."""


def run_pytest(tree: Path, ids: Sequence[str], timeout: float, label: str) -> dict[str, tuple[str, int, int]]:
    """{test id: (outcome, failed cases, cases)} for `ids` run by pytest in `tree`."""
    report = tree / ".alibi-junit.xml"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("TRITON_INTERPRET", None)  # the tests that need it set it themselves
    # --continue-on-collection-errors: one test module that does not import on old code must not stop
    # the other modules' tests of the same run (pytest otherwise runs none of them).
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           "-o", "junit_family=xunit1",
           f"--junitxml={report}", *ids]
    start = time.perf_counter()
    print(f"[{label}] {len(ids)} tests in {tree.name} …", file=sys.stderr, flush=True)
    try:
        subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=_limit,
                       check=False)
    except subprocess.TimeoutExpired:
        print(f"[{label}] timed out after {timeout:.0f} s", file=sys.stderr, flush=True)
        return {i: ("timeout", 0, 0) for i in ids}
    print(f"[{label}] done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    got = outcomes(report, ids) if report.is_file() else {i: ("not-run", 0, 0) for i in ids}
    # An id of a module that does not import is "not found", and pytest then runs no test at all
    # (--continue-on-collection-errors does not cover that): run the others again without them.
    retry = [i for i, (o, _, _) in got.items() if o == "not-run"]
    if retry and len(retry) < len(ids) and any(o == "collect-error" for o, _, _ in got.values()):
        report.unlink(missing_ok=True)
        got |= run_pytest(tree, retry, timeout, f"{label} (without the modules that do not import)")
    return got


def outcomes(report: Path, ids: Iterable[str]) -> dict[str, tuple[str, int, int]]:
    cases: dict[str, list[str]] = defaultdict(list)
    broken_modules = set()
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if not case.get("classname") or (case.get("file") is None and "error" in kinds):
            broken_modules.add(case.get("name", "").replace(".", "/"))  # a collection error names the module
            continue
        path = case.get("file")
        cls = case.get("classname").rsplit(".", 1)[-1]
        name = re.sub(r"\[.*\]$", "", case.get("name"))
        test = f"{path}::{cls}::{name}" if cls.startswith("Test") else f"{path}::{name}"
        cases[test].append("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
    result = {}
    for test in ids:
        got = cases.get(test, [])
        module = test.split("::")[0].removesuffix(".py")
        if not got:
            result[test] = ("collect-error", 0, 0) if module in broken_modules else ("not-run", 0, 0)
        elif "failed" in got:
            result[test] = ("failed", got.count("failed"), len(got))
        elif set(got) == {"skipped"}:
            result[test] = ("skipped", 0, len(got))
        else:
            result[test] = ("passed", 0, len(got))
    return result


def machine() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


def check(fixes: Sequence[Fix], timeout: float) -> HardeningRegressions:
    start = time.perf_counter()
    head = rev("HEAD")
    plan = []  # (fix, test id at HEAD, old code)
    gone = []
    for fix in fixes:
        ids, lost = tests_of(fix)
        gone += [f"{fix.commit}: {t}" for t in lost]
        base = rev(fix.before or f"{fix.commit}^")
        plan += [(fix, t, base) for t in ids]
    groups: dict[tuple[str, tuple[Mutation, ...]], list[str]] = defaultdict(list)
    for fix, test, base in plan:
        groups[(base, fix.mutations)].append(test)
    old_results: dict[tuple[str, tuple[Mutation, ...], str], tuple[str, int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="alibi-hardening-") as tmp:
        trees = []
        try:
            for n, ((base, mutations), ids) in enumerate(groups.items()):
                try:
                    tree = worktree(base, Path(tmp) / f"old-{n}-{base[:8]}", mutations)
                except StaleMutation as exc:
                    print(f"stale mutation: {exc}", file=sys.stderr)
                    tree = Path(tmp) / f"old-{n}-{base[:8]}"
                    got_all = {t: ("stale-mutation", 0, 0) for t in ids}
                else:
                    got_all = run_pytest(tree, sorted(set(ids)), timeout, f"old {base[:8]}")
                trees.append(tree)
                for test, got in got_all.items():
                    old_results[(base, mutations, test)] = got
                git("worktree", "remove", "--force", str(tree))
                trees.remove(tree)
            tree = worktree(head, Path(tmp) / "head", ())
            trees.append(tree)
            head_results = run_pytest(tree, sorted({t for _, t, _ in plan}), timeout, "HEAD")
        finally:
            for tree in trees:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False,
                               capture_output=True)
            subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)
    rows = []
    for fix, test, base in plan:
        old, failed, _ = old_results[(base, fix.mutations, test)]
        now, _, cases = head_results[test]
        mutation = "; ".join(f"{m.path}: {m.why}" for m in fix.mutations) or None
        rows.append(TestOutcome(test=test, commit=rev(fix.commit or added_by(test.split("::")[0]))[:12], item=fix.item,
                                old_code="HEAD" if fix.mutations and base == head else base, mutation=mutation,
                                old=old, head=now, old_cases_failed=failed, cases=cases,
                                verdict=verdict(old, now, bool(fix.mutations))))
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r.verdict] += 1
    return HardeningRegressions(SCHEMA, head, machine(), round(time.perf_counter() - start, 1), tuple(rows),
                                dict(sorted(counts.items())), tuple(gone))


def table(result: HardeningRegressions) -> str:
    lines = [f"{'commit':<8} {'old':<14} {'head':<8} verdict               test"]
    for r in result.tests:
        lines.append(f"{r.commit[:7]:<8} {r.old:<14} {r.head:<8} {r.verdict:<21} {r.test}")
    lines.append(f"{len(result.tests)} tests at {result.head[:12]} in {result.seconds:.0f} s: "
                 + ", ".join(f"{n} {v}" for v, n in result.counts.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="record to write (JSON)")
    ap.add_argument("--only", nargs="*", default=(), help="check only these commits (a prefix each; 'new' for "
                    "the tests given by id)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run (default 900)")
    ap.add_argument("--list", action="store_true", help="list the tests each fix covers and exit")
    args = ap.parse_args(argv)
    fixes = [f for f in FIXES if not args.only or any((f.commit or 'new').startswith(o) for o in args.only)]
    if args.list:
        for fix in fixes:
            ids, lost = tests_of(fix)
            for t in ids:
                print(f"{fix.commit} {'mutated ' if fix.mutations else ''}{t}")
            for t in lost:
                print(f"{fix.commit} (gone at HEAD) {t}")
        return 0
    result = check(fixes, args.timeout)
    sys.path.insert(0, str(REPO))
    from alibi.io import atomic

    atomic.write_text(args.out, result.to_json())
    print(table(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
