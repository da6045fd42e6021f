"""The reviewed equivalent-mutant list, and the Markdown/JSON report and console summary of a run."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from deepgemm.mutate.operators import Mutant
from deepgemm.mutate.runner import KILLED, OUTCOMES, Result

EQUIVALENTS_FILE = Path(__file__).resolve().parent / "equivalents.json"


# ---------------------------------------------------------------------------------------------
# Equivalent mutants

def load_equivalents(path: Path | None = None) -> list[dict]:
    """Entries {"site", "snippet", "reason"} of a reviewed list (default: the built-in kernels')."""
    path = Path(path) if path else EQUIVALENTS_FILE
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:   # not JSON, or not UTF-8
        raise ValueError(f"{path}: not a JSON file ({exc})") from None
    entries = data.get("equivalents") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError(f'{path}: expected a list of entries, or {{"equivalents": [...]}}')
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f'{path}: entry {i} is not an object {{"site", "snippet", "reason"}}')
        missing = {"site", "reason"} - set(e)
        if missing:
            raise ValueError(f"{path}: entry {i} lacks {sorted(missing)}")
        wrong = sorted(k for k in ("site", "snippet", "reason")
                       if k in e and not isinstance(e[k], str) and not (k == "snippet" and e[k] is None))
        if wrong:
            raise ValueError(f"{path}: entry {i}: {', '.join(wrong)} must be text")
    return entries


def match_equivalents(mutants: list[Mutant], entries: list[dict]) -> tuple[dict[str, str], list[dict]]:
    """(site id -> reason, stale entries). An entry applies to the mutant with its site id while
    that line still reads as the entry's snippet; if the line moved (an edit above it), to the one
    mutant of the same file, operator and column whose line reads as the snippet. An entry that
    matches nothing is stale: the code changed, and the judgement must be made again."""
    by_site = {m.site_id: m for m in mutants}
    out, stale = {}, []
    for e in entries:
        snippet = e.get("snippet")
        m = by_site.get(e["site"])
        if m is not None and (snippet is None or m.snippet == snippet):
            out[m.site_id] = e["reason"]
            continue
        file, _line, col, op = (e["site"].rsplit(":", 3) + ["", "", "", ""])[:4]
        moved = [c for c in mutants if c.file == file and c.operator == op and str(c.col) == col
                 and snippet is not None and c.snippet == snippet]
        if len(moved) == 1:
            out[moved[0].site_id] = e["reason"] + f" (reviewed as {e['site']})"
        elif m is not None or any(c.file == file and c.operator == op for c in mutants):
            stale.append(e)   # its file and operator are in this run, but no mutant there matches any more
    return out, stale


# ---------------------------------------------------------------------------------------------
# Counts and summary

def counts_by_kernel(mutants: list[Mutant]) -> dict[str, Counter]:
    """kernel -> Counter of families over the mutants of every file the kernel is built from."""
    out: dict[str, Counter] = {}
    for m in mutants:
        for k in m.kernels or ("(source)",):
            out.setdefault(k, Counter())[m.family] += 1
    return out


def listing(mutants: list[Mutant], families: tuple[str, ...]) -> str:
    """--list: one line per mutant, then the counts per file and per kernel."""
    lines = [f"{m.site_id:62} {m.describe()}" for m in mutants]
    used = [f for f in families if any(m.family == f for m in mutants)]
    lines.append("")
    header = f"{'file':36} {'kernels':22} " + " ".join(f"{f[:5]:>5}" for f in used) + "  total"
    lines.append(header)
    per_file: dict[str, list[Mutant]] = {}
    for m in mutants:
        per_file.setdefault(m.file, []).append(m)
    for file, ms in per_file.items():
        c = Counter(m.family for m in ms)
        kernels = ",".join(ms[0].kernels) or "-"
        lines.append(f"{file:36} {kernels[:22]:22} " + " ".join(f"{c[f]:>5}" for f in used) + f"  {len(ms):>5}")
    lines.append("")
    lines.append(f"{'kernel (own file + headers)':59} " + " ".join(f"{f[:5]:>5}" for f in used) + "  total")
    for kernel, c in counts_by_kernel(mutants).items():
        lines.append(f"{kernel:59} " + " ".join(f"{c[f]:>5}" for f in used) + f"  {sum(c.values()):>5}")
    perf = sum(1 for m in mutants if m.performance)
    lines.append(f"\n{len(mutants)} mutants ({len(mutants) - perf} for the test tier, {perf} performance mutants "
                 f"for the regression gate) in {len(per_file)} files")
    return "\n".join(lines)


def summarize(results: list[Result]) -> dict:
    counts = Counter(r.outcome for r in results)
    killed = sum(counts[o] for o in KILLED)
    judged = killed + counts["survived"]
    return {"counts": {o: counts[o] for o in OUTCOMES}, "mutants": len(results), "killed": killed,
            "score": round(killed / judged, 4) if judged else None,
            "score_with_compile_errors": round((killed + counts["did-not-compile"]) /
                                               (judged + counts["did-not-compile"]), 4)
            if judged + counts["did-not-compile"] else None}


def summary_line(summary: dict) -> str:
    c = summary["counts"]
    parts = [f"{summary['mutants']} mutants:",
             f"{summary['killed']} killed ({c['killed']} by a test, {c['killed-static']} by the static checks, "
             f"{c['timeout']} by the time limit),",
             f"{c['survived']} survived,", f"{c['did-not-compile']} did not compile,",
             f"{c['equivalent']} equivalent,", f"{c['same-code']} with the unmutated machine code,",
             f"{c['performance']} performance (not run)"]
    if c["passed-static"]:
        parts[-1] += ","
        parts.append(f"{c['passed-static']} compile and pass the static checks (need the GPU tier)")
    if c["error"]:
        parts[-1] += ","
        parts.append(f"{c['error']} could not be judged (error)")
    if c["unfinished"]:
        parts[-1] += ","
        parts.append(f"{c['unfinished']} unfinished (stopped by a time limit shorter than the baseline allows; "
                     "--resume runs them again)")
    line = " ".join(parts)
    if summary["score"] is not None:
        line += (f". Mutation score {100 * summary['score']:.1f} % of the {summary['killed'] + c['survived']} "
                 f"compiling, non-equivalent mutants run ({100 * summary['score_with_compile_errors']:.1f} % "
                 f"counting compile errors as kills)")
    return line + "."


# ---------------------------------------------------------------------------------------------
# Files

def write(out_dir: Path, meta: dict, baseline: Result | None, results: list[Result], stale: list[dict]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results)
    data = {"version": 1, **meta, "summary": summary,
            "baseline": baseline.as_dict() if baseline else None,
            "stale_equivalents": stale, "mutants": [r.as_dict() for r in results]}
    json_path = out_dir / "mutants.json"
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path = out_dir / "mutants.md"
    md_path.write_text(markdown(meta, summary, baseline, results, stale))
    return json_path, md_path


def _cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")[:160]


def markdown(meta: dict, summary: dict, baseline: Result | None, results: list[Result], stale: list[dict]) -> str:
    lines = ["# Mutation testing report", "",
             f"Kernels: {', '.join(meta.get('kernels') or []) or meta.get('source', '-')}; mode: {meta.get('mode')}; "
             f"test command: `{meta.get('test_cmd') or '-'}`; started {meta.get('started')}.", "",
             summary_line(summary), ""]
    if baseline is not None:
        lines += [f"Baseline (unmutated sources): {baseline.outcome} in {baseline.seconds:.1f} s"
                  + (f" (tests {baseline.test_seconds:.1f} s)" if baseline.test_seconds is not None else "")
                  + f"; per-mutant time limit {meta.get('timeout') or '-'} s.", ""]
    by = Counter(r.outcome for r in results)
    fam: dict[str, Counter] = {}
    for r in results:
        fam.setdefault(r.mutant.family, Counter())[r.outcome] += 1
    shown = [o for o in OUTCOMES if by[o]]
    lines += ["| family | " + " | ".join(shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for f, c in fam.items():
        lines.append(f"| {f} | " + " | ".join(str(c[o]) for o in shown) + " |")
    lines.append("")
    sections = [
        ("survived", "Survived: no test noticed these (gaps, or equivalents to review)",
         ("site", "change", "line"), lambda r: (r.mutant.site_id, r.mutant.describe(), r.mutant.snippet)),
        ("killed", "Killed by a test", ("site", "change", "first failing test", "s"),
         lambda r: (r.mutant.site_id, r.mutant.describe(), f"{r.killer} {r.detail or ''}", f"{r.seconds:.1f}")),
        ("killed-static", "Killed by the static checks", ("site", "change", "problem"),
         lambda r: (r.mutant.site_id, r.mutant.describe(), r.detail)),
        ("timeout", "Killed by the time limit (a hang or a crawl)", ("site", "change", "limit"),
         lambda r: (r.mutant.site_id, r.mutant.describe(), r.killer)),
        ("did-not-compile", "Did not compile (killed by the compiler)", ("site", "change", "variant", "first errors"),
         lambda r: (r.mutant.site_id, r.mutant.describe(), r.killer, r.detail)),
        ("passed-static", "Compile and pass the static checks (the GPU tier decides)", ("site", "change"),
         lambda r: (r.mutant.site_id, r.mutant.describe())),
        ("error", "Could not be judged", ("site", "why", "output"),
         lambda r: (r.mutant.site_id, r.killer, r.detail)),
        ("unfinished", "Unfinished: stopped by a time limit too short to count as a kill (run again)",
         ("site", "change", "limit"), lambda r: (r.mutant.site_id, r.mutant.describe(), r.killer)),
        ("equivalent", "Equivalent (reviewed; not run)", ("site", "change", "reason"),
         lambda r: (r.mutant.site_id, r.mutant.describe(), r.detail)),
        ("same-code", "Same machine code as the unmutated sources in every build (not run)", ("site", "change", "builds"),
         lambda r: (r.mutant.site_id, r.mutant.describe(), r.detail)),
        ("performance", "Performance mutants (for the benchmark regression gate; not run)", ("site", "change"),
         lambda r: (r.mutant.site_id, r.mutant.describe())),
    ]
    for outcome, title, header, row in sections:
        rows = [r for r in results if r.outcome == outcome]
        if not rows:
            continue
        lines += [f"## {title} ({len(rows)})", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        lines += ["| " + " | ".join(_cell(x) for x in row(r)) + " |" for r in rows]
        lines.append("")
    if stale:
        lines += ["## Stale equivalent entries (the code changed: review again)", ""]
        lines += [f"- `{e['site']}`: {e.get('reason', '')}" for e in stale]
        lines.append("")
    lines += ["Reproduce one mutant: `python -m deepgemm mutate --sites SITE_ID` with the same options "
              "(add `--keep-work` to keep the mutated copy).", ""]
    return "\n".join(lines)
