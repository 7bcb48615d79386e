#!/usr/bin/env python3
"""Where a contraction's time goes: a `perf` profile of one `bench-matmul` shape.

    python3 bench/profile.py --anyshape target/release/anyshape -- --m 512 --n 1024 --k 4096

This machine (a VM) exposes no hardware counters, so the profile samples the CPU
clock (`perf record -e cpu-clock`). The generated code has no symbol table;
`ANYSHAPE_PERF_MAP=1` makes anyshape append every compiled function to
`/tmp/perf-<pid>.map`, so perf names the micro-kernels and packing routines.
Only the steady stretch is sampled: `bench-matmul --hold S` keeps running the
chosen schedule after its measurement, and perf starts after the compilation
(`--delay`, measured by a first run).

The report groups the samples (micro-kernels, packing, the driver's loops, the
thread pool's waiting, the rest) and, for each hot micro-kernel, splits its own
samples into its K loop (broadcasts and FMAs) and the rest (C's load and store,
the epilogue, entry and exit): the K loop is the only part that runs at the FMA
rate. The split disassembles `--dump-llvm`'s assembly with `llvm-mc-19` and
`objdump`, the same code generation as the JIT's.
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import time


def categorize(sym):
    if sym.startswith("anyshape::ukernel_") or sym.startswith("anyshape::direct_"):
        return "micro-kernels"
    if sym.startswith("anyshape::pack_") or sym.startswith("anyshape_kernels::pack::"):
        return "packing"
    if sym.startswith("anyshape_kernels::gemm::") or sym.startswith("anyshape_kernels::direct::"):
        return "driver loops"
    # A pool worker's loop may be inlined into its thread's entry (the only threads
    # anyshape spawns are the pool's).
    if (sym.startswith("anyshape_kernels::pool::") or "sched" in sym or "futex" in sym
            or sym.startswith("std::sys::backtrace::__rust_begin_short_backtrace")):
        return "thread pool (waiting)"
    return "other"


def k_loop_ranges(dump_dir, work):
    """{function: [(start, end)]} of each dumped kernel's K loops: of the spans of
    its backward conditional jumps (its loops), the innermost ones that hold
    multiplies (FMAs, or bf16 pair dot products). A kernel may have several (a
    direct kernel's masked and unmasked columns); the loop over row tiles around
    them is not one."""
    ranges = {}
    for s in glob.glob(os.path.join(dump_dir, "*.s")):
        if os.path.basename(s).startswith("packers"):
            continue
        obj = os.path.join(work, os.path.basename(s) + ".o")
        subprocess.run(["llvm-mc-19", "-filetype=obj", "-triple=x86_64", s, "-o", obj], check=True)
        dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True,
                             check=True).stdout
        func, muls, loops = None, {}, {}
        for line in dis.splitlines():
            m = re.match(r"^[0-9a-f]+ <([^>]+)>:", line)
            if m:
                func = m.group(1)
                muls[func], loops[func] = [], []
                continue
            m = re.match(r"\s*([0-9a-f]+):\s+(\S+)(?:\s+([0-9a-f]+))?", line)
            if not m or not func:
                continue
            at, op = int(m.group(1), 16), m.group(2)
            if op.startswith("vfmadd") or op.startswith("vdpbf16ps"):
                muls[func].append(at)
            if op.startswith("j") and op != "jmp" and m.group(3) and int(m.group(3), 16) < at:
                loops[func].append((int(m.group(3), 16), at))
        for func, spans in loops.items():
            with_muls = [sp for sp in spans if any(sp[0] <= x <= sp[1] for x in muls[func])]
            inner = [a for a in with_muls if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in with_muls)]
            if inner:
                ranges[func] = inner
    return ranges


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anyshape", default="target/release/anyshape")
    ap.add_argument("--hold", type=float, default=6.0, help="seconds of steady running to sample")
    ap.add_argument("--freq", type=int, default=4999, help="samples per second per CPU")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then bench-matmul's arguments")
    args = ap.parse_args()
    bench = [a for a in args.bench_args if a != "--"]
    if not bench:
        sys.exit("give bench-matmul's arguments after --, e.g. -- --m 512 --n 1024 --k 4096")
    cmd = [args.anyshape, "bench-matmul"] + bench
    # A first run fills the tuning cache and times the start-up (compile, calibration
    # lookup, the measurement itself) that perf must skip.
    t0 = time.time()
    first = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    startup_ms = int((time.time() - t0) * 1000)
    print(first.strip())
    with tempfile.TemporaryDirectory() as work:
        data, dump = os.path.join(work, "perf.data"), os.path.join(work, "llvm")
        env = dict(os.environ, ANYSHAPE_PERF_MAP="1")
        rec = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(args.freq), "-D", str(startup_ms + 500),
               "-o", data, "--"] + cmd + ["--hold", str(args.hold), "--dump-llvm", dump]
        subprocess.run(rec, env=env, check=True, stdout=subprocess.DEVNULL)
        script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,symoff"], capture_output=True,
                                text=True, check=True).stdout
        samples = []
        for line in script.splitlines():
            # "ADDRESS SYMBOL+0xOFFSET", or the address alone where perf has no symbol.
            m = re.match(r"\s*[0-9a-f]+\s+(.+?)\+0x([0-9a-f]+)\s*$", line)
            samples.append((m.group(1), int(m.group(2), 16)) if m else ("[unknown]", None))
        total = len(samples)
        if total == 0:
            sys.exit("perf recorded no samples in the steady stretch (raise --hold)")
        by_sym = collections.Counter(s for s, _ in samples)
        by_cat = collections.Counter()
        for s, c in by_sym.items():
            by_cat[categorize(s)] += c
        print(f"\n{total} samples over {args.hold:.0f} s of `{' '.join(bench)}`")
        for cat, c in by_cat.most_common():
            print(f"  {100 * c / total:5.1f}%  {cat}")
        print("\nhottest functions:")
        for s, c in by_sym.most_common(8):
            print(f"  {100 * c / total:5.1f}%  {s}")
        loops = k_loop_ranges(dump, work)
        print("\nmicro-kernels: share of their own samples in the K loop")
        for s, c in by_sym.most_common():
            name = s.removeprefix("anyshape::")
            if categorize(s) != "micro-kernels" or c < 0.02 * total or name not in loops:
                continue
            # The jump itself is inside the loop; a sample's address may be the
            # instruction after a stalled one, so the span ends past the jump.
            inside = sum(1 for t, off in samples
                         if t == s and off is not None and any(lo <= off <= hi + 6 for lo, hi in loops[name]))
            print(f"  {name}: {100 * inside / c:5.1f}% in the K loop, {100 - 100 * inside / c:5.1f}% outside "
                  f"({100 * (c - inside) / total:.1f}% of all samples)")


if __name__ == "__main__":
    main()
