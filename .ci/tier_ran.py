#!/usr/bin/env python3
"""CI: fail when a tier's tests did not really run, from pytest's JUnit XML (--junitxml).

    .ci/tier_ran.py JUNIT_XML PREFIX [--forbid-reason TEXT ...]
                    [--every-file [--may-skip-whole FILE ...] [--hardware-reason TEXT ...]]

Every test under PREFIX (a folder, e.g. tests/cpu) that was skipped is named, and the exit status
is 1; with --forbid-reason, only those skipped for a reason starting with one of the TEXTs count.
Exit 1 too when no test under PREFIX ran at all. pytest exits 0 when every test skips, so a
tier-selection bug that skips the whole tier (a marker test inverted, say) passes pytest; this
check, outside pytest and its plugins, does not.

--every-file also fails a test file under PREFIX none of whose tests ran, whatever the reasons:
a selection bug that skips every test for a reason the tier allows elsewhere ("needs --sanitize",
say) leaves whole files with nothing run. Exempt are the files named by --may-skip-whole (those
that belong to another tier, or need a second GPU) and files whose every skip reason starts with
a --hardware-reason TEXT (a kernel this GPU cannot run).
"""
import argparse
import sys
import xml.etree.ElementTree as ET


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", help="pytest's --junitxml output")
    ap.add_argument("prefix", help="the tier's folder, e.g. tests/cpu")
    ap.add_argument("--forbid-reason", action="append", default=None, metavar="TEXT",
                    help="count only skips whose reason starts with TEXT (repeatable); default: every skip")
    ap.add_argument("--every-file", action="store_true", help="each test file under PREFIX must have a test that ran")
    ap.add_argument("--may-skip-whole", action="append", default=[], metavar="FILE",
                    help="with --every-file: a file (path as tests/gpu/test_x.py) that may have nothing run")
    ap.add_argument("--hardware-reason", action="append", default=[], metavar="TEXT",
                    help="with --every-file: a skip reason (its start) that may leave a whole file unrun")
    args = ap.parse_args(argv)
    depth = args.prefix.strip("/").count("/") + 2      # tests/gpu -> tests.gpu.test_x
    ran_files: set[str] = set()
    skip_reasons: dict[str, list[str]] = {}            # file -> the reasons its tests were skipped for
    module = args.prefix.strip("/").replace("/", ".") + "."
    ran, skipped = 0, []
    for case in ET.parse(args.junit).getroot().iter("testcase"):
        # a module skipped whole (at collection) is a testcase with no classname, named by the module
        where = case.get("classname") or case.get("name", "")
        if not (where + ".").startswith(module):
            continue
        file = "/".join(where.split(".")[:depth]) + ".py"
        skip = case.find("skipped")
        if skip is None:
            ran += 1
            ran_files.add(file)
            continue
        reason = skip.get("message", "")
        skip_reasons.setdefault(file, []).append(reason)
        if args.forbid_reason is None or any(reason.startswith(t) for t in args.forbid_reason):
            skipped.append(f"{where}::{case.get('name')}: {reason}")
    if skipped:
        print(f"tier_ran.py: {len(skipped)} test(s) under {args.prefix} skipped, where the tier must run:", file=sys.stderr)
        for line in skipped[:40]:
            print(f"  {line}", file=sys.stderr)
        if len(skipped) > 40:
            print(f"  ({len(skipped) - 40} more)", file=sys.stderr)
        return 1
    if ran == 0:
        print(f"tier_ran.py: no test under {args.prefix} ran", file=sys.stderr)
        return 1
    if args.every_file:
        exempt = {f.strip("/") for f in args.may_skip_whole}
        unrun = [f"{f}: {len(reasons)} skipped, e.g. {reasons[0]!r}" for f, reasons in sorted(skip_reasons.items())
                 if f not in ran_files and f not in exempt
                 and not all(any(r.startswith(t) for t in args.hardware_reason) for r in reasons)]
        if unrun:
            print(f"tier_ran.py: {len(unrun)} file(s) under {args.prefix} had no test run:", file=sys.stderr)
            for line in unrun:
                print(f"  {line}", file=sys.stderr)
            return 1
    print(f"tier_ran.py: {ran} test(s) under {args.prefix} ran, none skipped"
          + (" for: " + ", ".join(map(repr, args.forbid_reason)) if args.forbid_reason else "")
          + (f"; {len(ran_files)} of {len(ran_files | skip_reasons.keys())} file(s) had a test that ran" if args.every_file else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
