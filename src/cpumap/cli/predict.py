"""``cpumap predict``: a resource model's throughput for one kernel, or for a file of kernels.

    cpumap predict --model M.json "addq %rax, %rbx*2" IMUL_R64_R64     # one kernel
    cpumap predict --model M.json --file kernels.txt                   # one JSON line each
    some-tool | cpumap predict --model M.json --file -                 # standard input

A kernel line holds the same terms as the arguments, separated by ``;`` (AT&T text has spaces
and commas of its own); a term may also be a run of form names separated by spaces, so the
canonical text printed by every cpumap tool (``ADD_R64_R64*2 IMUL_R64_R64``) reads back as
it is. Blank lines and lines starting with ``#`` are skipped.

Why it is built the way it is: bulk users (analyzer comparisons, basic-block corpora) send
hundreds of thousands of kernels, so each distinct instruction text is resolved once (AT&T text
through the catalogue, which runs the assembler), the model's uses are kept sparse
(``resmodel.Predictor``), and nothing heavy is imported unless a line needs the catalogue:
the command starts in a fraction of a second. A bad line is answered with an ``error`` object
and the run goes on; the exit status is then 2 (bad input), after every line is answered.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from cpumap.cli.context import Context, UsageError, say

#: Lines predicted between two progress lines on standard error (and the output flushes).
CHUNK = 5000
#: Seconds between progress lines.
PROGRESS_S = 5.0
_NAME_TERM = re.compile(r"^[A-Za-z0-9_]+(\*\d+)?$")


class Resolver:
    """Instruction text -> model form name, each distinct text resolved once; the answer for
    a resolved kernel."""

    def __init__(self, forms: Iterable[str], ctx: Context, model_path: Path):
        # loaded already with the model (resmodel imports it): taken once, not per line
        from cpumap.measure import asmgen

        self._asmgen = asmgen
        self.known = set(forms)
        self.upper = {f.upper(): f for f in self.known}
        self.ctx = ctx
        self.model_path = model_path
        self.names: dict[str, str] = {}
        #: text -> why it cannot be predicted (a fresh UsageError each time it is seen again)
        self.errors: dict[str, str] = {}
        self._cat: Any = None

    def name(self, text: str) -> str:
        """The model's form for ``text``; UsageError names what is wrong with it."""
        name = self.names.get(text)
        if name is None:
            if text not in self.errors:
                try:
                    self.names[text] = name = self._resolve(text)
                except UsageError as exc:
                    self.errors[text] = str(exc)
            if name is None:
                raise UsageError(self.errors[text])
        return name

    def _resolve(self, text: str) -> str:
        name = self.upper.get(text.upper())
        if name is None:
            # AT&T text (or a name outside the model): this host's catalogue says which form
            from cpumap.isa import catalogue

            if self._cat is None:
                self._cat = self.ctx.catalogue()
            try:
                name = self._cat.resolve(text)
            except catalogue.UnknownInstruction as exc:
                raise UsageError(str(exc)) from None
        if name not in self.known:
            raise UsageError(f"{text!r} ({name}) is not in the model {self.model_path}")
        return name

    def kernel(self, terms: list[str]) -> dict[str, int]:
        try:
            parsed = self._asmgen.parse_kernel_terms(terms)
        except self._asmgen.KernelError as exc:
            raise UsageError(str(exc)) from exc
        kernel: dict[str, int] = {}
        for text, n in parsed:
            name = self.name(text)
            kernel[name] = kernel.get(name, 0) + n
        return kernel

    def answer(self, predictor: Any, kernel: dict[str, int]) -> dict[str, Any]:
        bound, bottleneck = predictor.predict(kernel)
        # on a host that pays for switching between legacy SSE and 256-bit AVX (measured by
        # the catalogue stage, carried by the model), the switches of the generator's layout
        # of the kernel, at their measured cost, on top of the resource bound
        switches, extra = predictor.switching(kernel)
        cycles = bound + extra
        n = sum(kernel.values())
        return {"kernel": self._asmgen.canonical(kernel), "n_insns": n, "cycles": cycles,
                "throughput_bound": bound, "sse_avx_transition": switches > 0,
                "sse_avx_switches": switches, "sse_avx_cycles": extra,
                "ipc": n / cycles if cycles > 0 else None, "bottleneck": bottleneck,
                "bottleneck_label": predictor.labels.get(bottleneck) if bottleneck else None,
                "interacting": predictor.interacting(kernel),
                "approximate": predictor.approximate(kernel),
                # the forms' uses in a mode of the host (model.wide, where it has one: beside
                # a 512-bit form, or legacy SSE beside AVX)
                "wide_mode": predictor.wide_mode(kernel)}


def line_terms(line: str) -> list[str]:
    """The terms of one kernel line (see the module docstring)."""
    terms = []
    for piece in line.split(";"):
        piece = piece.strip()
        if not piece:
            continue
        words = piece.split()
        if len(words) > 1 and all(_NAME_TERM.match(w) for w in words):
            terms.extend(words)  # canonical text: form names separated by spaces
        else:
            terms.append(piece)
    if not terms:
        raise UsageError("no instruction on the line")
    return terms


def _lines(source: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(source, 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield number, line


def predict_lines(predictor: Any, resolver: Resolver, lines: Iterable[tuple[int, str]],
                  out: TextIO, total: int | None = None) -> tuple[int, int, str | None]:
    """Answer every line (one JSON object each); returns (lines, failed, first error)."""
    done = failed = 0
    first_error = None
    t0 = last = time.monotonic()
    buf: list[str] = []
    dumps = json.dumps
    for number, line in lines:
        try:
            obj = {"line": number, **resolver.answer(predictor, resolver.kernel(line_terms(line)))}
        except UsageError as exc:
            failed += 1
            first_error = first_error or f"line {number}: {exc}"
            obj = {"line": number, "input": line, "error": str(exc)}
        buf.append(dumps(obj))
        done += 1
        if len(buf) >= CHUNK:
            out.write("\n".join(buf) + "\n")
            out.flush()
            buf.clear()
            now = time.monotonic()
            if now - last >= PROGRESS_S:
                last = now
                left = f", {total - done} left" if total is not None else ""
                say(f"predict: {done} kernels{left}, {done / (now - t0):.0f} per second")
    if buf:
        out.write("\n".join(buf) + "\n")
    out.flush()
    return done, failed, first_error


def cmd_predict(args: argparse.Namespace, ctx: Context) -> int:
    from cpumap.model import resmodel

    if bool(args.instr) == (args.file is not None):
        raise UsageError("give either instructions or --file (one kernel per line), not both"
                         if args.instr else "nothing to predict: give instructions or --file")
    try:
        model = resmodel.load(args.model)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load model {args.model}: {exc}") from exc
    predictor = resmodel.Predictor(model)
    resolver = Resolver(model.rho, ctx, args.model)
    if args.file is not None:
        if str(args.file) == "-":
            done, failed, first = predict_lines(predictor, resolver, _lines(sys.stdin),
                                                sys.stdout)
        else:
            try:
                text = Path(args.file).read_text()
            except OSError as exc:
                raise UsageError(f"cannot read {args.file}: {exc}") from exc
            lines = list(_lines(text.splitlines()))
            done, failed, first = predict_lines(predictor, resolver, lines, sys.stdout,
                                                total=len(lines))
        if failed:
            say(f"predict: {failed} of {done} kernels could not be predicted (first: {first})")
            return 2
        return 0
    kernel = resolver.kernel([t for arg in args.instr for t in line_terms(arg)])
    out = {**resolver.answer(predictor, kernel), "forms": sorted(kernel),
           "model": str(args.model)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        label = f" ({out['bottleneck_label']})" if out["bottleneck_label"] else ""
        ipc = f"{out['ipc']:.3f}" if out["ipc"] is not None else "n/a"
        print(f"{out['kernel']}: {out['cycles']:.4f} cycles per instance, IPC {ipc}, "
              f"bottleneck {out['bottleneck']}{label}")
        if out["sse_avx_transition"]:
            print(f"  of which {out['sse_avx_cycles']:.1f} cycles: {out['sse_avx_switches']} "
                  "switches between legacy SSE and 256-bit AVX per instance, at the cost "
                  "measured on this host (resource bound "
                  f"{out['throughput_bound']:.4f})")
        if out["wide_mode"]:
            print("  with the forms' uses in a mode of this host (model.json wide: narrow "
                  "vector forms beside 512-bit ones, or legacy SSE beside AVX, run "
                  "differently here)")
    if out["interacting"]:
        # a prediction the model cannot vouch for: said on stderr so that --json stays JSON
        print("warning: the kernel holds a pair of forms that ran slower together than one "
              "after the other when the model was built (provenance.interacting): no "
              "resource model predicts it", file=sys.stderr)
    for form in out["approximate"]:
        print(f"warning: {form} is modelled approximately (provenance.approximate): "
              f"{model.approximate[form]}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser("predict", help="predict the throughput of kernels with a model",
                        description="Predict with a resource model (model.json): one kernel "
                        "from the arguments, or one kernel per line of --file (- for standard "
                        "input; terms separated by ';'), one JSON object per line.")
    pr.add_argument("instr", nargs="*", help="form name or AT&T instruction, optionally *N")
    pr.add_argument("--model", required=True, type=Path, help="model.json")
    pr.add_argument("--file", help="kernels, one per line (- for standard input)")
    pr.add_argument("--json", action="store_true", help="JSON output (one kernel)")
    pr.set_defaults(fn=cmd_predict)
