"""Mutation operators for CUDA kernel sources: small token/regex-level rewrites, one site at a time.

Every operator scans a `Source` (the file's text plus masked views of it) and yields edits
(start, end, replacement) on the original text. A `Mutant` is one such edit; its site id
``file:line:col:operator`` (1-based line and column of the first replaced character in the
unmodified file) names it in reports, in the equivalents list and on the command line
(``--sites``), and stays the same from run to run as long as the file does.

What the operators look at: `Source.code` is the text with comments and string literals blanked
(asm strings hold PTX, not C++), preprocessor lines blanked except `#if`/`#elif` conditions,
and `static_assert(...)` / `__launch_bounds__(...)` blanked (compile-time checks: mutating them
only makes the build fail). Blanking keeps every offset, so a match in a view is an edit in the
text. `Source.nocomment` keeps strings, for the operators that edit PTX (cache hints).

Families (``--operators`` takes family or operator names):
  boundary    <  <=  >  >= shifted by one in comparisons (edge guards, tails)
  loop        loop bound one short; ceil-division turned into floor-division (remainder tiles)
  sync        a barrier removed (__syncthreads, __syncwarp, named barriers, cluster barriers)
  fence       a memory/proxy fence removed (__threadfence*, fence.proxy.async, wgmma fence, ...)
  wait        a pipeline wait one group shallower; an mbarrier wait or a commit removed
  index       leading dimensions swapped (lda <-> ldb, ldc <-> ldd); row/column arguments of an
              addressing call swapped; blockIdx/gridDim .x <-> .y
  layout      a layout condition negated (DG_A_ROW, KCONTIG, A_KMAJ, ...)
  precision   an FP32 accumulation or the value handed to the epilogue rounded through fp16
  epilogue    bias after the activation; scale before it; alpha <-> beta; one step dropped
  fragment    fragment register/component swapped (r[0] <-> r[1], .x <-> .y, .z <-> .w)
  align       an alignment / in-bounds predicate forced true (vector path taken unconditionally)
  guard       one term of a && / || bounds condition dropped
  performance stage count, padding, block raster, unrolling, cache hints, half the grid: correct but slower;
              listed for the benchmark regression gate, not run by the test tier
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

Edit = tuple[int, int, str]   # (start, end, replacement) in the original text


# ---------------------------------------------------------------------------------------------
# The source and its masked views

def _blank(chars: list[str], start: int, end: int) -> None:
    for i in range(start, end):
        if chars[i] != "\n":
            chars[i] = " "


def match_paren(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at `open_at` ('(', '[' or '{'), or -1."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opener = text[open_at]
    closer = pairs[opener]
    depth = 0
    for i in range(open_at, len(text)):
        c = text[i]
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
    return -1


def split_top_level(text: str, start: int, end: int, separators: tuple[str, ...] = (",",)) -> list[tuple[int, int]]:
    """Spans of the pieces of text[start:end] between separators at bracket depth 0 (trimmed)."""
    spans, depth, piece = [], 0, start
    i = start
    while i < end:
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            sep = next((s for s in separators if text.startswith(s, i)), None)
            if sep:
                spans.append(piece)
                spans.append(i)
                i += len(sep)
                piece = i
                continue
        i += 1
    spans.append(piece)
    spans.append(end)
    out = []
    for a, b in zip(spans[::2], spans[1::2]):
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        out.append((a, b))
    return out


class Source:
    """One kernel file: its text, the masked views the operators scan, and line bookkeeping."""

    def __init__(self, path: str, text: str):
        self.path = path          # the file's name in site ids (relative to the kernel folder)
        self.text = text
        nocomment, code = list(text), list(text)
        i, n = 0, len(text)
        while i < n:
            if text.startswith("//", i):
                j = text.find("\n", i)
                j = n if j < 0 else j
                _blank(nocomment, i, j)
                _blank(code, i, j)
                i = j
            elif text.startswith("/*", i):
                j = text.find("*/", i + 2)
                j = n if j < 0 else j + 2
                _blank(nocomment, i, j)
                _blank(code, i, j)
                i = j
            elif text[i] in "\"'":
                quote, j = text[i], i + 1
                while j < n and text[j] != quote and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                _blank(code, i + 1, min(j, n))
                i = j + 1
            else:
                i += 1
        self.nocomment = "".join(nocomment)
        self._directive_lines: set[int] = set()
        lines = "".join(code).split("\n")
        offset, continued = 0, False
        for number, line in enumerate(lines, start=1):
            stripped = line.lstrip()
            if continued or stripped.startswith("#"):
                directive = re.match(r"#\s*(\w+)", stripped)
                keep = not continued and directive is not None and directive.group(1) in ("if", "elif")
                self._directive_lines.add(number)
                if not keep:
                    _blank(code, offset, offset + len(line))
                continued = line.rstrip().endswith("\\")
            offset += len(line) + 1
        masked = "".join(code)
        for m in re.finditer(r"\b(?:static_assert|__launch_bounds__)\s*\(", masked):
            close = match_paren(masked, m.end() - 1)
            if close > 0:
                end = close + 1
                if masked.startswith(";", end):
                    end += 1
                _blank(code, m.start(), end)
        self.code = "".join(code)
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_col(self, offset: int) -> tuple[int, int]:
        lo, hi = 0, len(self._line_starts) - 1
        while lo < hi:   # last line start <= offset
            mid = (lo + hi + 1) // 2
            if self._line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self._line_starts[lo] + 1

    def line_text(self, line: int) -> str:
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:end if end >= 0 else len(self.text)]

    def asm_statement(self, offset: int) -> tuple[int, int] | None:
        """The span of the `asm(...)` statement holding `offset`, or None."""
        if not hasattr(self, "_asm_spans"):
            self._asm_spans = []
            for m in re.finditer(r"\basm\s+(?:volatile\s*)?\(", self.code):
                close = match_paren(self.code, m.end() - 1)
                if close > 0:
                    self._asm_spans.append((m.start(), close + 1))
        return next(((a, b) for a, b in self._asm_spans if a <= offset < b), None)

    def is_directive(self, offset: int) -> bool:
        return self.line_col(offset)[0] in self._directive_lines

    def code_line(self, offset: int) -> str:
        line = self.line_col(offset)[0]
        start = self._line_starts[line - 1]
        end = self.code.find("\n", start)
        return self.code[start:end if end >= 0 else len(self.code)]


# ---------------------------------------------------------------------------------------------
# Operators and mutants

@dataclass(frozen=True)
class Operator:
    name: str                                     # "boundary.lt-to-le"
    doc: str                                      # one line: what the rewrite does
    find: Callable[[Source], Iterable[Edit]]
    performance: bool = False                     # correct but slower: for the regression gate

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


@dataclass(frozen=True)
class Mutant:
    file: str
    line: int
    col: int
    operator: str
    start: int
    end: int
    replacement: str
    original: str
    snippet: str                                  # the original line, stripped (for reports)
    performance: bool = False
    kernels: tuple = field(default=(), compare=False)   # the kernels built from this file

    @property
    def site_id(self) -> str:
        return f"{self.file}:{self.line}:{self.col}:{self.operator}"

    @property
    def family(self) -> str:
        return self.operator.split(".", 1)[0]

    def apply(self, text: str) -> str:
        if text[self.start:self.end] != self.original:
            raise ValueError(f"{self.site_id}: the file changed since the mutants were listed")
        return text[:self.start] + self.replacement + text[self.end:]

    def describe(self) -> str:
        before = " ".join(self.original.split())
        after = " ".join(self.replacement.split())
        if len(before) > 70:
            before = before[:67] + "..."
        if len(after) > 70:
            after = after[:67] + "..."
        return f"`{before}` -> `{after}`"


OPERATORS: dict[str, Operator] = {}


def operator(name: str, doc: str, performance: bool = False):
    def register(fn):
        OPERATORS[name] = Operator(name, doc, fn, performance)
        return fn
    return register


FAMILIES = ("boundary", "loop", "sync", "fence", "wait", "index", "layout", "precision", "epilogue",
            "fragment", "align", "guard", "performance")


def resolve_operators(spec: str | None) -> list[Operator]:
    """Operators named by a comma-separated list of family and operator names (None: all)."""
    if not spec:
        return list(OPERATORS.values())
    chosen = []
    for word in (w.strip() for w in spec.split(",")):
        if not word:
            continue
        if word in FAMILIES:
            chosen += [op for op in OPERATORS.values() if op.family == word]
        elif word in OPERATORS:
            chosen.append(OPERATORS[word])
        else:
            raise ValueError(f"--operators: unknown operator or family {word!r}; families: {', '.join(FAMILIES)}; "
                             f"operators: {', '.join(OPERATORS)}")
    seen, out = set(), []
    for op in chosen:
        if op.name not in seen:
            seen.add(op.name)
            out.append(op)
    return out


def mutants_of(source: Source, operators: Iterable[Operator] | None = None,
               kernels: tuple = ()) -> list[Mutant]:
    """Every mutant of `source` under `operators` (default: all), in file order."""
    out, seen = [], set()
    for op in operators if operators is not None else OPERATORS.values():
        for start, end, replacement in op.find(source):
            original = source.text[start:end]
            if replacement == original:
                continue
            # Keep the line count, so the lines below (and compiler messages) keep their numbers.
            replacement += "\n" * max(0, original.count("\n") - replacement.count("\n"))
            line, col = source.line_col(start)
            mutant = Mutant(source.path, line, col, op.name, start, end, replacement, original,
                            source.line_text(line).strip(), op.performance, kernels)
            if mutant.site_id in seen:   # one edit per site and operator: keep the first
                continue
            seen.add(mutant.site_id)
            out.append(mutant)
    out.sort(key=lambda m: (m.line, m.col, m.operator))
    return out


_CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")
_ON_DEVICE = re.compile(r"^(?:defined\s*\(\s*__CUDA_ARCH__\s*\)|defined\s+__CUDA_ARCH__|__CUDA_ARCH__)$")


def device_only_lines(text: str) -> set[int]:
    """The lines (1-based) inside a branch only a device compilation takes: `#ifdef __CUDA_ARCH__`
    (or `#if defined(__CUDA_ARCH__)`, `#if __CUDA_ARCH__`) up to its `#else`/`#elif`/`#endif`, and
    every later branch (`#elif`, `#else`) of an `#ifndef __CUDA_ARCH__`. A host build of the file (the CPU tier's) never
    compiles them. Any other condition leaves the branch's device-only state as it was."""
    def taken(kind: str, rest: str) -> tuple[bool, bool]:
        first = (kind == "ifdef" and rest == "__CUDA_ARCH__") or (kind == "if" and bool(_ON_DEVICE.match(rest)))
        return first, kind == "ifndef" and rest == "__CUDA_ARCH__"   # later branches: the device's
    return _branch_lines(text, taken)


# The stress tier's defines (kernels/include/deepgemm/stress.cuh): pauses and pipeline checks that
# only its builds compile. No benchmark times those builds.
CHECK_DEFINES = ("DG_PIPE_CHECK", "DG_STRESS")


def check_build_lines(text: str) -> set[int]:
    """The lines (1-based) inside a branch only the stress tier's builds compile: `#if` on one of
    CHECK_DEFINES, alone or as a term of an `&&` (`#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)`),
    up to its `#else`/`#elif`/`#endif`. Their default is 0, so the normal builds skip them."""
    def taken(kind: str, rest: str) -> tuple[bool, bool]:
        terms = [t.strip() for t in rest.split("&&")]
        return kind == "if" and "||" not in rest and any(t in CHECK_DEFINES for t in terms), False
    return _branch_lines(text, taken)


def _branch_lines(text: str, taken) -> set[int]:
    """The lines inside the preprocessor branches that `taken(kind, condition)` marks: it returns
    (the #if's first branch is marked, its #elif/#else branches are); a marked branch's nested
    branches are marked whatever their conditions."""
    out, stack = set(), []   # per open #if: (marked before it, marked for its later branches)
    marked = False
    for number, line in enumerate(text.splitlines(), start=1):
        found = _CONDITIONAL.match(line)
        if found is None:
            if marked:
                out.add(number)
            continue
        kind, rest = found.group(1), found.group(2).split("//")[0].strip()
        if kind in ("if", "ifdef", "ifndef"):
            first, later = taken(kind, rest)
            stack.append((marked, later))
            marked = marked or first
        elif kind in ("elif", "else") and stack:
            outer, later = stack[-1]
            marked = outer or later
        elif kind == "endif" and stack:
            marked = stack.pop()[0]
    return out


# ---------------------------------------------------------------------------------------------
# Helpers shared by the operators

_REMOVED = "(void)0;"   # what a removed statement becomes: still a statement (`if (x) f();` stays valid)


def _call_statements(src: Source, names: str) -> Iterator[tuple[int, int]]:
    """Spans of whole statements `[dg::]name[<...>](...);` for the names in the alternation `names`."""
    for m in re.finditer(rf"(?<![\w.>:])(?:dg::)?(?:{names})\s*(?:<[^;{{}}()]*>)?\s*\(", src.code):
        close = match_paren(src.code, m.end() - 1)
        if close < 0:
            continue
        rest = src.code[close + 1:]
        stripped = rest.lstrip()
        if not stripped.startswith(";"):
            continue   # a definition (`{` follows) or part of an expression
        yield m.start(), close + 1 + (len(rest) - len(stripped)) + 1


def _code_matches(src: Source, pattern: str, directives: bool = False) -> Iterator[re.Match]:
    for m in re.finditer(pattern, src.code):
        if directives or not src.is_directive(m.start()):
            yield m


_DECLARATION = re.compile(r"^\s*(?:(?:const|constexpr|static|__shared__|volatile|extern)\s+)*"
                          r"(?:unsigned|signed|int|float|double|bool|short|long|char|auto|uint4|float4|float2|"
                          r"uint2|__half2?|__nv_bfloat162?|dg::\w+|[A-Za-z_]\w*_t)\b[\w\s:*&<>]*?\b\w+\s*\[")


# ---------------------------------------------------------------------------------------------
# boundary

_BOUNDARY = {"<": ("boundary.lt-to-le", "<="), "<=": ("boundary.le-to-lt", "<"),
             ">": ("boundary.gt-to-ge", ">="), ">=": ("boundary.ge-to-gt", ">")}


def _constant_loop_conditions(src: Source) -> list[tuple[int, int]]:
    """For-loop conditions whose bound is a compile-time constant (no lower-case name in it: the
    sources spell constants in capitals, runtime values such as p.k or ktiles in lower case).
    Those loops are unrolled over register arrays; `i <= TM` only indexes past the array (the
    compiler, not a test, catches it), and loop.bound-minus-one already covers the bound."""
    out = []
    for start, end in _for_conditions(src):
        m = re.fullmatch(r"[\w.\[\]]+\s*<=?\s*(.+)", src.code[start:end], re.S)
        if m and not re.search(r"\b[a-z_]\w*", m.group(1)):
            out.append((start, end))
    return out


def _boundary(which: str):
    def find(src: Source) -> Iterator[Edit]:
        # Comparisons are written with spaces around the operator in these sources; template
        # brackets (`static_cast<T>`, `wait<N>`) and shifts never are, and `>>`/`<<` never match.
        skip = _constant_loop_conditions(src)
        for m in _code_matches(src, r"(?<=\s)(<=|>=|<|>)(?=\s)", directives=True):
            if m.group(1) == which and not any(a <= m.start() < b for a, b in skip):
                yield m.start(1), m.end(1), _BOUNDARY[which][1]
    return find


for _op, (_name, _to) in _BOUNDARY.items():
    operator(_name, f"`{_op}` -> `{_to}` in a comparison (edge guards, tails, loop conditions)")(_boundary(_op))


# ---------------------------------------------------------------------------------------------
# loop

def _for_conditions(src: Source) -> Iterator[tuple[int, int]]:
    """Spans of the condition clause of every `for (init; cond; step)` header."""
    for m in re.finditer(r"\bfor\s*\(", src.code):
        close = match_paren(src.code, m.end() - 1)
        if close < 0:
            continue
        parts = split_top_level(src.code, m.end(), close, (";",))
        if len(parts) == 3:
            yield parts[1]


@operator("loop.bound-minus-one", "`i < N` -> `i < (N) - 1` in a for-loop condition: the last iteration skipped")
def _loop_bound(src: Source) -> Iterator[Edit]:
    for start, end in _for_conditions(src):
        m = re.fullmatch(r"([\w.\[\]]+)\s*(<=?)\s*(.+)", src.code[start:end], re.S)
        if m:
            bound_start = start + m.start(3)
            bound = src.text[bound_start:end]
            yield bound_start, end, f"({bound}) - 1" if re.search(r"\W", bound) else f"{bound} - 1"


@operator("loop.ceil-to-floor", "`(x + d - 1) / d` -> `x / d`: the partial last tile or step dropped")
def _ceil_to_floor(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"\(([^()]*?)\s*\+\s*(\w+)\s*-\s*1\s*\)\s*/\s*(\w+)\b"):
        if m.group(2) == m.group(3):
            yield m.start(), m.end(), f"({m.group(1)}) / {m.group(3)}"
    for m in _code_matches(src, r"\(([^()]*?)\s*\+\s*(\d+)\s*\)\s*/\s*(\d+)\b"):
        if int(m.group(2)) == int(m.group(3)) - 1:
            yield m.start(), m.end(), f"({m.group(1)}) / {m.group(3)}"


@operator("loop.remainder-dropped", "`x / d + (x % d != 0)` -> `x / d`: the remainder tile dropped")
def _remainder_dropped(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"(\b[\w.]+)\s*/\s*(\w+)(\s*\+\s*\(\s*\1\s*%\s*\2\s*!=\s*0\s*\))"):
        yield m.start(3), m.end(3), ""


# ---------------------------------------------------------------------------------------------
# sync, fence, wait: statements removed, depths changed

def _removal(names: str):
    def find(src: Source) -> Iterator[Edit]:
        for start, end in _call_statements(src, names):
            yield start, end, _REMOVED
    return find


operator("sync.barrier-removed", "a `__syncthreads()` / `__syncwarp()` / named or cluster barrier (or a "
         "named barrier's arrive) removed")(
    _removal(r"__syncthreads|__syncwarp|named_barrier_arrive|named_barrier|cluster_sync"))
operator("fence.removed", "a fence removed: `__threadfence*`, `fence.proxy.async` (fence_async_shared), the "
         "mbarrier-init fence, `wgmma.fence`, the accumulator register fence")(
    _removal(r"__threadfence|__threadfence_block|__threadfence_system|fence_async_shared|mbar_fence_init|"
             r"wgmma_fence|fence_regs"))
operator("wait.mbarrier-removed", "an mbarrier wait removed (consumers read a stage before TMA filled it, or the "
         "producer overwrites one still being read)")(_removal(r"mbar_wait"))
operator("wait.commit-removed", "a `cp.async` / `wgmma` / bulk-store commit removed (later waits no longer "
         "cover those operations)")(_removal(r"cp_async_commit|wgmma_commit|bulk_commit"))


@operator("sync.arrivals-one-fewer", "an mbarrier initialised to expect one arrival fewer (where it expects more "
          "than one): a phase completes before the last arriving thread is done with what it releases")
def _arrivals_one_fewer(src: Source) -> Iterator[Edit]:
    for start, _ in _call_statements(src, r"mbar_init"):
        open_ = src.code.index("(", start)
        args = split_top_level(src.code, open_ + 1, match_paren(src.code, open_))
        if len(args) != 2:
            continue
        first, last = args[1]   # the count
        arg = src.code[first:last]
        if arg.isdigit():
            if int(arg) <= 1:
                continue   # a count of 0 is no barrier at all
            replacement = str(int(arg) - 1)
        else:   # a count that depends on the build: one fewer in the builds where it is above 1
            replacement = f"(({arg}) > 1 ? ({arg}) - 1 : ({arg}))"
        yield first, last, replacement


@operator("wait.depth-plus-one", "`cp.async.wait_group N` / `wgmma.wait_group N` / bulk `wait_group.read N` -> "
          "N + 1: one more group left in flight")
def _wait_depth(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"(?<![\w.])(?:dg::)?(?:cp_async_wait|wgmma_wait|bulk_wait_read)\s*<([^<>;]+)>\s*\("):
        arg = m.group(1).strip()
        start = m.start(1) + (len(m.group(1)) - len(m.group(1).lstrip()))
        replacement = f"{int(arg) + 1}" if arg.isdigit() else f"({arg}) + 1"
        yield start, start + len(arg), replacement


# ---------------------------------------------------------------------------------------------
# index

@operator("index.ld-swap", "`lda` <-> `ldb`, `ldc` <-> `ldd`: an operand addressed with the other's leading dimension")
def _ld_swap(src: Source) -> Iterator[Edit]:
    other = {"lda": "ldb", "ldb": "lda", "ldc": "ldd", "ldd": "ldc"}
    for m in _code_matches(src, r"\b(lda|ldb|ldc|ldd)\b"):
        before = src.code[:m.start()].rstrip()
        if re.search(r"\b(?:long|int|unsigned|auto)$", before) or \
                re.match(r"\s*(?:const\s+)?(?:long\s+long|long|int|unsigned)\s+[\w\s,]*;\s*$", src.code_line(m.start())):
            continue   # a parameter, variable or field declaration: renaming it only breaks the build
        # A bare name needs the other in scope, i.e. used in the same top-level definition
        # (between braces at column 0): a_index(m, k, lda) has no ldb to swap in, only a build
        # error. A member (p.lda) always has its siblings (GemmParams holds all four).
        start = src.code.rfind("\n}", 0, m.start()) + 1
        end = src.code.find("\n}", m.end())
        if not re.search(r"(?:\.|->)\s*$", before[-3:]) and \
                not re.search(rf"\b{other[m.group(1)]}\b", src.code[start:end if end >= 0 else len(src.code)]):
            continue
        yield m.start(), m.end(), other[m.group(1)]


# Addressing calls and the argument positions of their (row, column) / (outer, inner) pair.
COORDINATE_ARGS = {"a_index": (0, 1), "b_index": (0, 1), "op_index": (0, 1), "load_a": (1, 2), "load_b": (1, 2),
                   "load_c": (1, 2), "store_d": (1, 2), "epilogue": (1, 2), "epilogue_pair_interior": (1, 2),
                   "store_pair_interior": (1, 2), "tile_off": (0, 1), "d_stage_addr": (1, 2),
                   "tma_load_2d": (2, 3), "tma_store_2d": (2, 3), "a_lane_offset": (1, 2),
                   "b_lane_offset": (1, 2), "block_coords": (1, 2), "tile_coords": (1, 2)}


@operator("index.coordinate-swap", "the row/column (outer/inner) arguments of an addressing call swapped: "
          "`store_d(p, row, col, v)` -> `store_d(p, col, row, v)`, `a_index(m, k, ld)` -> `a_index(k, m, ld)`, ...")
def _coordinate_swap(src: Source) -> Iterator[Edit]:
    names = "|".join(COORDINATE_ARGS)
    for m in _code_matches(src, rf"(?<![\w.])(?:\w+::)*({names})\s*(?:<[^;{{}}()]*>)?\s*\("):
        close = match_paren(src.code, m.end() - 1)
        if close < 0 or src.code[close + 1:].lstrip().startswith(("{", "const")):
            continue   # a definition
        args = split_top_level(src.code, m.end(), close)
        i, j = COORDINATE_ARGS[m.group(1)]
        if len(args) <= j:
            continue
        (a0, a1), (b0, b1) = args[i], args[j]
        first, second = src.text[a0:a1], src.text[b0:b1]
        if first == second or re.match(r"(?:const\s+)?(?:int|long|unsigned|float|bool)\b", first):
            continue   # the same expression twice, or a parameter list
        yield a0, b1, second + src.text[a1:b0] + first


@operator("index.grid-axis-swap", "`blockIdx.x` <-> `blockIdx.y`, `gridDim.x` <-> `gridDim.y`")
def _grid_axis_swap(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"\b(blockIdx|gridDim)\.([xy])\b"):
        yield m.start(2), m.end(2), "y" if m.group(2) == "x" else "x"


# ---------------------------------------------------------------------------------------------
# layout

_LAYOUT_NAMES = r"DG_A_ROW|DG_B_ROW|A_KMAJ|B_KMAJ|KCONTIG|B_KCONTIG|kAKContig|kBKContig|A_TRANS|B_TRANS"


@operator("layout.negated", "a layout condition negated: `DG_A_ROW ? ... : ...` -> `!DG_A_ROW ? ...`, "
          "`if constexpr (A_KMAJ)` -> `(!A_KMAJ)`, `KCONTIG` -> `!KCONTIG`")
def _layout_negated(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, rf"(?<![\w.!])((?:\w+::)*)({_LAYOUT_NAMES})\b", directives=True):
        before = src.code[:m.start()].rstrip()
        after = src.code[m.end():].lstrip()
        if re.search(r"\b(?:bool|int|define|ifndef|ifdef)$", before) or after.startswith(("=", "(")) and \
                not after.startswith("=="):
            continue   # a declaration or definition, not a use
        if src.is_directive(m.start()) and not re.match(r"\s*#\s*(?:el)?if\b", src.code_line(m.start())):
            continue
        if re.search(r"\bA_TRANS|\bB_TRANS", m.group(2)) and not after.startswith(("==", "?", ")")):
            continue
        yield m.start(), m.end(), "!" + src.text[m.start():m.end()]


# ---------------------------------------------------------------------------------------------
# precision

_HALF_ROUND = "__half2float(__float2half_rn({}))"
_ACCUMULATOR = r"(?:acc\w*|v)(?:\[[^\]]*\])*"


@operator("precision.accumulate-fp16", "an FP32 accumulation rounded through fp16: `acc += x` -> "
          "`acc = __half2float(__float2half_rn(acc + (x)))`, `acc = fmaf(a, b, acc)` likewise")
def _accumulate_fp16(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, rf"(?<![\w.])({_ACCUMULATOR})\s*\+=\s*"):
        end = src.code.find(";", m.end())
        if end < 0 or "\n\n" in src.code[m.end():end]:
            continue
        lhs, rhs = src.text[m.start(1):m.end(1)], src.text[m.end():end].strip()
        yield m.start(), end, f"{lhs} = {_HALF_ROUND.format(f'{lhs} + ({rhs})')}"
    for m in _code_matches(src, rf"(?<![\w.])({_ACCUMULATOR})\s*=\s*(fmaf|__fmaf_rn)\s*\("):
        close = match_paren(src.code, m.end() - 1)
        if close < 0:
            continue
        call = src.text[m.start(2):close + 1]
        yield m.start(2), close + 1, _HALF_ROUND.format(call)


@operator("precision.epilogue-input-fp16", "the FP32 value handed to `store_d` rounded through fp16 first")
def _epilogue_input_fp16(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"(?<![\w.])(?:dg::)?store_d\s*\("):
        close = match_paren(src.code, m.end() - 1)
        if close < 0 or src.code[close + 1:].lstrip().startswith("{"):
            continue
        args = split_top_level(src.code, m.end(), close)
        if len(args) == 4:
            a, b = args[3]
            yield a, b, _HALF_ROUND.format(src.text[a:b])


# ---------------------------------------------------------------------------------------------
# epilogue

def _block_swap(first_pattern: str, second_pattern: str):
    """Swap two adjacent runs of whole lines matched by first_pattern then second_pattern."""
    def find(src: Source) -> Iterator[Edit]:
        for m in re.finditer(rf"(?m)^({first_pattern})({second_pattern})", src.text):
            yield m.start(), m.end(), m.group(2) + m.group(1)
    return find


_ACTIVATE_LINE = r"[ \t]*v = activate\(v\);[^\n]*\n"
_BIAS_BLOCK = r"[ \t]*#if DG_BIAS[^\n]*\n(?:(?![ \t]*#endif)[^\n]*\n)*?[ \t]*#endif[^\n]*\n"
_SCALE_BLOCK = r"[ \t]*#if DG_SCALE_MODE[^\n]*\n(?:(?![ \t]*#endif)[^\n]*\n)*?[ \t]*#endif[^\n]*\n"
operator("epilogue.bias-after-activation", "the bias added after the activation instead of before it")(
    _block_swap(_BIAS_BLOCK, _ACTIVATE_LINE))
operator("epilogue.scale-before-activation", "the scale applied before the activation instead of after it")(
    _block_swap(_ACTIVATE_LINE, _SCALE_BLOCK))


@operator("epilogue.alpha-beta-swap", "`p.alpha` <-> `p.beta`: the accumulator scaled by beta, or C by alpha")
def _alpha_beta(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"\bp\.(alpha|beta)\b"):
        yield m.start(1), m.end(1), "beta" if m.group(1) == "alpha" else "alpha"


@operator("epilogue.step-removed", "one step of the epilogue chain removed (alpha, bias, activation, scale, beta*C)")
def _epilogue_step(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"(?<![\w.])v\s*(?:\+=|\*=|=\s*activate\s*\()"):
        end = src.code.find(";", m.end())
        if end < 0:
            continue
        statement = src.code[m.start():end]
        if re.search(r"alpha|beta|bias|scale|activate", statement):
            yield m.start(), end + 1, _REMOVED


# ---------------------------------------------------------------------------------------------
# fragment

def _first_in_asm(src: Source, offset: int, key: str, seen: set) -> bool:
    """Inside an asm operand list, only the first operand of each array/vector is swapped: the
    wgmma wrappers list up to 128 accumulators, and one swap per statement already tells whether
    the mapping is checked (the rest would be near-copies of the same mutant)."""
    span = src.asm_statement(offset)
    if span is None:
        return True
    if (span, key) in seen:
        return False
    seen.add((span, key))
    return True


@operator("fragment.register-swap", "a fragment register index swapped: `r[0]` <-> `r[1]`, `r[2]` <-> `r[3]` "
          "(literal subscripts outside declarations; in an asm operand list only the first of each array)")
def _register_swap(src: Source) -> Iterator[Edit]:
    seen: set = set()
    for m in _code_matches(src, r"(?<=[\w\]])\s*\[\s*([0-3])\s*\]"):
        array = re.search(r"(\w+)\s*(?:\[[^\[\]]*\]\s*)*$", src.code[max(0, m.start() - 200):m.start()])
        name = array.group(1) if array else ""
        if _DECLARATION.match(src.code_line(m.start())) or not _first_in_asm(src, m.start(), name, seen):
            continue
        yield m.start(1), m.end(1), str(int(m.group(1)) ^ 1)


@operator("fragment.component-swap", "a vector component swapped: `.x` <-> `.y`, `.z` <-> `.w` (uint4/float4 "
          "fragments; not threadIdx/blockIdx/blockDim/gridDim)")
def _component_swap(src: Source) -> Iterator[Edit]:
    partner = {"x": "y", "y": "x", "z": "w", "w": "z"}
    seen: set = set()
    for m in _code_matches(src, r"(?<=[\w\]\)])\.([xyzw])\b"):
        owner = re.search(r"(\w+)\s*$", src.code[:m.start()])
        if owner and owner.group(1) in ("threadIdx", "blockIdx", "blockDim", "gridDim"):
            continue
        if not _first_in_asm(src, m.start(), owner.group(1) if owner else "", seen):
            continue
        yield m.start(1), m.end(1), partner[m.group(1)]


# ---------------------------------------------------------------------------------------------
# align

_ALIGN_NAME = re.compile(r"vec|align|pairs|tma_store|^in_[ab]$|^full$|^interior$|^kin$")
_ALIGN_FUNCTION = re.compile(r"align|pairs|by_tma")


@operator("align.forced-true", "an alignment / in-bounds predicate forced true: `const bool a_vec = ...` -> "
          "`= true` (vector or interior path taken unconditionally)")
def _align_forced(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"\bbool\s+"):
        end = src.code.find(";", m.end())
        if end < 0 or "(" in src.code[m.end():m.end() + 40].split("=")[0]:
            continue   # a function, not a variable
        for a, b in split_top_level(src.code, m.end(), end):
            decl = re.match(r"(\w+)\s*=\s*", src.code[a:b])
            if decl and _ALIGN_NAME.search(decl.group(1)) and src.text[a + decl.end():b].strip() != "true":
                yield a + decl.end(), b, "true"


@operator("align.predicate-true", "an alignment test function returns true: `return ptr % 16 == 0;` -> "
          "`return true;` (aligned16, pairs_aligned, epilogue_pairs_ok, d_by_tma)")
def _align_predicate(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"\bbool\s+(\w+)\s*\("):
        if not _ALIGN_FUNCTION.search(m.group(1)):
            continue
        close = match_paren(src.code, m.end() - 1)
        body = src.code.find("{", close)
        if close < 0 or body < 0 or src.code[close + 1:body].strip():
            continue
        body_end = match_paren(src.code, body)
        for r in re.finditer(r"\breturn\s+([^;]+);", src.code[body:body_end]):
            if r.group(1).strip() not in ("true", "false"):
                yield body + r.start(1), body + r.end(1), "true"


# ---------------------------------------------------------------------------------------------
# guard

def _conditions(src: Source) -> Iterator[tuple[int, int]]:
    """Spans inside the parentheses of `if (...)` / `if constexpr (...)` and of `(...) ?` ternaries."""
    for m in _code_matches(src, r"\bif\s*(?:constexpr\s*)?\("):
        close = match_paren(src.code, m.end() - 1)
        if close > 0:
            yield m.end(), close
    for m in _code_matches(src, r"\)\s*\?"):
        close = m.start()
        depth, i = 0, close
        while i >= 0:
            if src.code[i] == ")":
                depth += 1
            elif src.code[i] == "(":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        if i >= 0:
            yield i + 1, close


@operator("guard.term-dropped", "one term of a `&&` / `||` condition dropped: "
          "`if (row < p.m && col < p.n)` -> `if (row < p.m)`")
def _term_dropped(src: Source) -> Iterator[Edit]:
    for start, end in _conditions(src):
        for sep in ("&&", "||"):
            terms = split_top_level(src.code, start, end, (sep,))
            if len(terms) < 2 or any("&&" in src.code[a:b] and sep == "||" for a, b in terms):
                continue
            for i, (a, b) in enumerate(terms):
                if i + 1 < len(terms):       # the term and the operator after it
                    yield a, terms[i + 1][0], ""
                else:                        # the last term and the operator before it
                    yield terms[i - 1][1], b, ""


# ---------------------------------------------------------------------------------------------
# performance (listed for the regression gate; the test tier does not run them)

@operator("performance.no-unroll", "`#pragma unroll` -> `#pragma unroll 1`", performance=True)
def _no_unroll(src: Source) -> Iterator[Edit]:
    for m in re.finditer(r"(?m)^[ \t]*#pragma unroll\b([^\n]*)", src.nocomment):
        if m.group(1).strip() != "1":
            yield m.start(), m.end(), m.group(0).split("#")[0] + "#pragma unroll 1"


@operator("performance.fewer-stages", "pipeline stages one fewer (at least 2): `= DG_STAGES` -> "
          "`= (DG_STAGES > 2 ? DG_STAGES - 1 : DG_STAGES)`", performance=True)
def _fewer_stages(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"=\s*(DG_STAGES)\s*[;,]"):
        yield m.start(1), m.end(1), "(DG_STAGES > 2 ? DG_STAGES - 1 : DG_STAGES)"


@operator("performance.no-padding", "shared-memory row padding removed (bank conflicts): `PAD = ...` -> `PAD = 0`, "
          "`#define DG_PAD n` -> `0`", performance=True)
def _no_padding(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, r"\bPAD\s*=\s*([^;,]+)"):
        yield m.start(1), m.end(1), "0"
    for m in re.finditer(r"(?m)^[ \t]*#define DG_PAD (\d+)", src.nocomment):
        if m.group(1) != "0":
            yield m.start(1), m.end(1), "0"


@operator("performance.no-raster", "grouped block raster off: DG_GROUP_M forced to 1 (overrides the -D value)",
          performance=True)
def _no_raster(src: Source) -> Iterator[Edit]:
    for m in re.finditer(r"(?m)^#ifndef DG_GROUP_M\n#define DG_GROUP_M [^\n]*\n#endif", src.nocomment):
        yield m.start(), m.end(), "#undef DG_GROUP_M\n#define DG_GROUP_M 1\n"


# Half the blocks do the whole walk and the rest none: the same tiles or rows, each once (correct),
# on half the SMs. Two forms: a grid-stride loop, and V5's persistent walk, whose first tile and
# step are declared together (an idle block starts at tile 2^29, past any walk's end; a split-K
# build keeps one tile per cluster: its walk is left alone).
_GRID_STRIDE = r"for \(int (\w+) = blockIdx\.([xyz]); \1 < ([^;]+); \1 \+= gridDim\.\2\)"
_PERSISTENT_WALK = (r"const int (\w+) = (blockIdx\.x / \(SPLIT \* CLUSTER_M\)), "
                    r"(\w+) = SPLIT > 1 \? walk\.end : (gridDim\.x / CLUSTER_M);")


@operator("performance.half-grid", "half the blocks of a grid-stride loop or of V5's persistent walk do all its "
          "work, the others none", performance=True)
def _half_grid(src: Source) -> Iterator[Edit]:
    for m in _code_matches(src, _GRID_STRIDE):
        var, axis, bound = m.group(1), m.group(2), m.group(3)
        half = f"(gridDim.{axis} + 1) / 2"
        yield m.start(), m.end(), (f"for (int {var} = blockIdx.{axis} < {half} ? (int)blockIdx.{axis} : ({bound}); "
                                   f"{var} < {bound}; {var} += {half})")
    for m in _code_matches(src, _PERSISTENT_WALK):
        first, start, step, grid = m.groups()
        half = f"({grid} + 1) / 2"
        yield m.start(), m.end(), (f"const int {first} = SPLIT > 1 || {start} < {half} ? {start} : (1 << 29), "
                                   f"{step} = SPLIT > 1 ? walk.end : {half};")


@operator("performance.no-cache-hint", "an L1/L2 cache hint removed from a load (`.L2::128B`, `.L2::256B`, "
          "`.L1::no_allocate`)", performance=True)
def _no_cache_hint(src: Source) -> Iterator[Edit]:
    for m in re.finditer(r"\.(?:L2::(?:64|128|256)B|L1::no_allocate)", src.nocomment):
        yield m.start(), m.end(), ""
