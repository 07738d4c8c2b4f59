"""gdb batch script: exact block occurrences for ONE invocation of a function.

Run by cpumap.evaluate.counting as

    gdb -batch -nx -x harness/gdb_count.py BINARY

with the environment variable CPUMAP_GDB_SPEC naming a JSON file:

    {"function": str, "entry": int (ELF address of the function), "args": [str, ...],
     "addresses": [int, ...] (ELF addresses of the blocks to count), "out": path,
     "loops": [{"block", "pred_last", "exit": int (ELF addresses), "reg": str, "step": int,
                "width": 32|64}, ...],
     "reps": [{"address", "next": int (ELF addresses), "width": 32|64,
               "cond": "rep"|"repe"|"repne"}, ...]}

Loops (cpumap.evaluate.flow.TripLoop): the register is read at the last instruction of the loop's
predecessor and again at its exit block; (difference / step) is the number of executions of
the loop block for that entry, summed into ``loop_counts``.

Repeated string instructions (cpumap.evaluate.blocks.RepString): the count register is read
at the instruction and again at the next address, where it always goes when done; the
difference is its iterations.  ``rep_counts`` gives per instruction: executions, iterations,
and ``executed`` as Callgrind counts a repeated instruction (one per iteration, plus one for the
final check that finds the count register at 0, which a repe/repne stopped by its comparison
does not make).

Program arguments: gdb 13 without a startup shell splits its argument string at whitespace
and does no quoting, so arguments without whitespace are passed that way (no shell at all);
when one holds whitespace or is empty, gdb starts the program through /bin/sh (SHELL is set by
cpumap.evaluate.counting) with every argument quoted by shlex.quote, which sh takes literally.  A
newline cannot be passed (gdb commands are one line) and is refused.

The program runs at full speed until the function's first instruction (a breakpoint there is
the first measurement point).  There the counting breakpoints are set, each with an ignore
count so large that gdb never stops on it but still increments its hit count (no Python call
per hit), plus a breakpoint on the return address that stops only once the frame is gone
($rsp above the entry $rsp: recursion-safe) -- the second measurement point.  The hit counts
are written to ``out`` as JSON and the program is killed: later invocations are not counted.

Addresses are ELF (link-time) addresses; the load bias of a position-independent executable is
measured at the entry stop (run-time address of the symbol minus its ELF address).
"""

import json
import os
import shlex
import time

import gdb  # noqa: F401  (provided by gdb's embedded Python)

IGNORE = 2**31 - 1


def _write(out, obj):
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(obj, handle)
    os.replace(tmp, out)


class _Stops:
    """The last stop event: a breakpoint, a signal, or the program's exit."""

    def __init__(self):
        self.signal = None
        self.exit_code = None
        gdb.events.stop.connect(self._on_stop)
        gdb.events.exited.connect(self._on_exit)

    def _on_stop(self, event):
        if isinstance(event, gdb.SignalEvent):
            self.signal = event.stop_signal

    def _on_exit(self, event):
        self.exit_code = getattr(event, "exit_code", None)


class _Return(gdb.Breakpoint):
    """Stops at the return address once the counted invocation's frame is popped."""

    def __init__(self, spec, entry_sp):
        super().__init__(spec, internal=True)
        self.entry_sp = entry_sp
        self.done = False

    def stop(self):
        if int(gdb.parse_and_eval("(unsigned long)$rsp")) > self.entry_sp:
            self.done = True
            return True
        return False


class _Watch(gdb.Breakpoint):
    """A breakpoint that never stops the program: at each hit (counted in ``hits``) ``see``
    reads the registers into ``state``, the dict it shares with its partner breakpoint."""

    def __init__(self, spec, state, errors=None):
        super().__init__(spec, internal=True)
        self.state, self.errors, self.hits = state, errors, 0

    def stop(self):
        self.hits += 1
        self.see(self.state)
        return False


class _LoopEntry(_Watch):
    """At the last instruction of P: remember the induction register."""

    def see(self, lp):
        if lp["start"] is not None:
            self.errors.append(f"loop at {lp['block']:#x} entered twice without exit")
        lp["start"] = _reg(lp["reg"])


class _LoopExit(_Watch):
    """At the first instruction of X: the loop block ran (R - start) / step times."""

    def see(self, lp):
        if lp["start"] is None:  # X reached by another path: not a loop exit
            return
        step = lp["step"]
        d = ((_reg(lp["reg"]) - lp["start"]) if step > 0 else (lp["start"] - _reg(lp["reg"])))
        d &= _mask(lp["width"])
        trips, rest = divmod(d, abs(step))
        if rest or trips < 1:
            self.errors.append(f"loop at {lp['block']:#x}: {lp['reg']} moved by {d}, not a "
                               f"positive multiple of {abs(step)}")
        lp["total"] += trips
        lp["start"] = None


class _RepAt(_Watch):
    """At a repeated string instruction: remember the count register.

    gdb steps over a breakpoint one iteration at a time (the trap flag stops a repeated
    instruction after each), so the breakpoint would be hit again at every iteration: it is
    disabled until _RepNext has seen the instruction finish."""

    def see(self, rep):
        rep["before"] = _reg("rcx") & _mask(rep["width"])
        self.enabled = False


class _RepNext(_Watch):
    """After it: iterations = the count register's decrease; the _RepAt (``rep["at"]``)
    armed again."""

    def see(self, rep):
        if rep["before"] is None:  # reached by another path
            return
        k = (rep["before"] - _reg("rcx")) & _mask(rep["width"])
        zf = (_reg("eflags") >> 6) & 1
        stopped_by_compare = k > 0 and ((rep["cond"] == "repe" and zf == 0)
                                        or (rep["cond"] == "repne" and zf == 1))
        rep["executions"] += 1
        rep["iterations"] += k
        rep["executed"] += k + (0 if stopped_by_compare else 1)
        rep["before"] = None
        rep["at"].enabled = True


def _mask(width):
    return (1 << width) - 1


def _reg(name):
    return int(gdb.selected_frame().read_register(name)) & ((1 << 64) - 1)


def _alive():
    inf = gdb.selected_inferior()
    return inf is not None and inf.pid != 0


def main():
    spec_path = os.environ["CPUMAP_GDB_SPEC"]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    out = spec["out"]
    for cmd in ("set pagination off", "set confirm off", "set print thread-events off",
                "set print inferior-events off", "set disable-randomization on"):
        gdb.execute(cmd, to_string=True)
    args = [str(a) for a in spec.get("args", [])]
    if any("\n" in a or "\r" in a for a in args):
        _write(out, {"error": "a program argument contains a newline, which gdb cannot pass"})
        return
    if any(not a or any(ch.isspace() for ch in a) for a in args):
        gdb.execute("set startup-with-shell on", to_string=True)
        gdb.execute("set args " + " ".join(shlex.quote(a) for a in args), to_string=True)
    else:
        gdb.execute("set startup-with-shell off", to_string=True)
        gdb.execute("set args " + " ".join(args), to_string=True)
    stops = _Stops()
    t_start = time.perf_counter()
    gdb.execute("starti", to_string=True)
    func = spec["function"]
    runtime = int(gdb.parse_and_eval(f"(unsigned long)&'{func}'"))
    bias = runtime - int(spec["entry"])
    entry_bp = gdb.Breakpoint(f"*{runtime:#x}", internal=True)
    gdb.execute("continue", to_string=True)
    pc = int(gdb.parse_and_eval("(unsigned long)$pc")) if _alive() else None
    if pc != runtime:
        why = (f"signal {stops.signal}" if stops.signal else
               f"the program exited (code {stops.exit_code})")
        _write(out, {"error": f"{func} was never called: {why}"})
        return
    t0 = time.perf_counter()
    sp = int(gdb.parse_and_eval("(unsigned long)$rsp"))
    ret = int.from_bytes(bytes(gdb.selected_inferior().read_memory(sp, 8)), "little")
    counters = {}
    for addr in spec["addresses"]:
        a = int(addr)
        bp = entry_bp if a == int(spec["entry"]) else gdb.Breakpoint(f"*{a + bias:#x}",
                                                                     internal=True)
        bp.ignore_count = IGNORE
        counters[a] = bp
    if int(spec["entry"]) not in counters:
        entry_bp.delete()
    errors = []
    loop_bps = []
    loops = []
    for lp in spec.get("loops", []):
        state = dict(lp, start=None, total=0)
        loops.append(state)
        loop_bps.append(_LoopEntry(f"*{int(lp['pred_last']) + bias:#x}", state, errors))
        loop_bps.append(_LoopExit(f"*{int(lp['exit']) + bias:#x}", state, errors))
    reps = []
    for rp in spec.get("reps", []):
        state = dict(rp, before=None, executions=0, iterations=0, executed=0)
        reps.append(state)
        state["at"] = _RepAt(f"*{int(rp['address']) + bias:#x}", state)
        loop_bps += [state["at"], _RepNext(f"*{int(rp['next']) + bias:#x}", state)]
    ret_bp = _Return(f"*{ret:#x}", sp)
    gdb.execute("continue", to_string=True)
    t1 = time.perf_counter()
    if not (ret_bp.done and _alive()):
        why = (f"signal {stops.signal}" if stops.signal else
               f"the program exited (code {stops.exit_code})")
        _write(out, {"error": f"{func} did not return: {why}"})
        return
    if errors:
        _write(out, {"error": "trip-count loops: " + "; ".join(errors[:5])})
        return
    counts = {str(a): int(bp.hit_count) for a, bp in counters.items()}
    loop_counts = {str(int(lp["block"])): lp["total"] for lp in loops}
    hits = sum(counts.values()) + sum(bp.hits for bp in loop_bps)
    rep_counts = {str(int(r["address"])): {k: r[k] for k in ("executions", "iterations",
                                                              "executed")} for r in reps}
    _write(out, {"counts": counts, "loop_counts": loop_counts, "rep_counts": rep_counts,
                 "bias": bias,
                 "region_seconds": t1 - t0, "startup_seconds": t0 - t_start, "hits": hits})
    gdb.execute("kill", to_string=True)


try:
    main()
except Exception as exc:  # report every failure through the result file, never silently
    out = None
    try:
        with open(os.environ["CPUMAP_GDB_SPEC"], encoding="utf-8") as handle:
            out = json.load(handle)["out"]
    except Exception:
        pass
    if out:
        _write(out, {"error": f"gdb script failed: {type(exc).__name__}: {exc}"})
    raise
