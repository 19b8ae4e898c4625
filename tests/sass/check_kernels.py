#!/usr/bin/env python3
"""Checks the compiled CUDA kernels for two silent performance failures that ptxas only
reports as warnings in a build log nobody reads:

- a stack frame or local memory (register spills, or arrays ptxas could not keep in
  registers): every kernel must have STACK 0 and LOCAL 0 unless ALLOWED_FRAMES names it;
- serialised warpgroup MMAs (ptxas C7514 / C7515 / C7520: a non-wgmma instruction touches an
  accumulator while its group may be in flight, so ptxas waits after every wgmma): in SASS
  every HGMMA then closes its own group (carries `gsb0`), where a pipelined kernel closes one
  group per several HGMMAs. A kernel fails when more than half of its HGMMAs close a group.

Usage: check_kernels.py [--cuobjdump PATH] [--expect NAME=KIND ...] FILE...
FILE: objects or static libraries with sm_90a code. With --expect (the checker's own test,
on tests/sass/probe_kernels.cu) exactly the listed (kernel substring, kind) violations must
be found, kind "stack" or "serialized".
Prints one line per kernel (registers, stack, static shared bytes, HGMMAs, groups)."""
import argparse
import re
import shutil
import subprocess
import sys

# Kernels allowed a stack frame, with the reason. An entry that matches no kernel fails the
# check too, so the list cannot go stale.
ALLOWED_FRAMES = {
    "norm_rope_kernel(": "the reference norm / RoPE kernel (tests, odd widths): the correctly "
                         "rounded double sin / cos keeps a local array for huge arguments",
    "rope_table_kernel(": "the RoPE table, once per run: the same double sin / cos",
}

RESOURCE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"check_kernels: {' '.join(cmd)} failed:\n{done.stderr}")
    return done.stdout


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt:  # mangled names would match no allowlist entry: a confusing failure
        sys.exit("check_kernels: c++filt (binutils) is needed to read the kernel names")
    if not names:
        return {}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def kernels(cuobjdump, path):
    """{(archive member, mangled name): dict(reg, stack, shared, local, hgmma, groups)} of one
    file (an object, or an archive whose members cuobjdump announces as `member ...:`)."""
    found = {}
    member, name = path, None
    for line in run([cuobjdump, "--dump-resource-usage", path]).splitlines():
        line = line.strip()
        if line.startswith("member "):
            member = line[len("member "):].rstrip(":")
        elif line.startswith("Function "):
            name = line[len("Function "):].rstrip(":")
        elif name and (m := RESOURCE.search(line)):
            reg, stack, shared, local = map(int, m.groups())
            found[(member, name)] = dict(reg=reg, stack=stack, shared=shared, local=local, hgmma=0,
                                         groups=0)
            name = None
    member, key = path, None
    for line in run([cuobjdump, "-sass", path]).splitlines():
        if line.startswith("member "):
            member = line[len("member "):].strip().rstrip(":")
        elif "Function :" in line:
            key = (member, line.split("Function :", 1)[1].strip())
        elif key in found and "HGMMA" in line:
            found[key]["hgmma"] += 1
            if "gsb0" in line:
                found[key]["groups"] += 1
    return found


def short(name):
    """The kernel's name and template arguments, without namespaces and parameters."""
    name = name.removeprefix("void ")
    name = re.sub(r"(csattn::cuda::)?\(anonymous namespace\)::|csattn::cuda::", "", name)
    depth = 0
    for i, c in enumerate(name):  # cut at the parameter list: the first '(' outside <...>
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0 and i > 0:
            return name[:i]
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--expect", action="append", default=[], metavar="NAME=KIND")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    table = {}
    for path in args.files:
        table.update(kernels(args.cuobjdump, path))
    if not table:
        sys.exit("check_kernels: no kernels found (no sm_90a code in " + " ".join(args.files) + ")")
    names = demangle(sorted({name for _, name in table}))

    violations = []  # (demangled name, kind, detail)
    used = set()
    print(f"{'reg':>4} {'stack':>5} {'shared':>6} {'hgmma':>5} {'groups':>6}  kernel")
    for key in sorted(table, key=lambda k: (short(names[k[1]]), k[0])):
        k, name = table[key], names[key[1]]
        print(f"{k['reg']:>4} {k['stack']:>5} {k['shared']:>6} {k['hgmma']:>5} {k['groups']:>6}  "
              f"{short(name)}")
        if k["stack"] or k["local"]:
            allowed = [p for p in ALLOWED_FRAMES if p in name] if not args.expect else []
            used.update(allowed)
            if not allowed:
                violations.append((name, "stack", f"STACK {k['stack']} LOCAL {k['local']} bytes"))
        if k["hgmma"] >= 2 and 2 * k["groups"] > k["hgmma"]:
            violations.append((name, "serialized",
                               f"{k['groups']} of {k['hgmma']} HGMMAs close a group (ptxas "
                               "serialised the warpgroup MMAs: see its C75xx info lines)"))
    if not args.expect:
        for pattern in sorted(set(ALLOWED_FRAMES) - used):
            violations.append((pattern, "stale", "ALLOWED_FRAMES names a kernel without a stack "
                               "frame (or none at all): remove the entry"))

    for name, kind, detail in violations:
        print(f"\n{kind}: {short(name)}\n  {detail}")
    if args.expect:
        want = [tuple(e.split("=", 1)) for e in args.expect]
        got = [(n, kind) for n, kind, _ in violations]
        missing = [w for w in want if not any(w[0] in n and w[1] == kind for n, kind in got)]
        extra = [g for g in got if not any(w[0] in g[0] and w[1] == g[1] for w in want)]
        for w in missing:
            print(f"\nnot detected: {w[1]} in a kernel named like {w[0]}")
        for g in extra:
            print(f"\nunexpected: {g[1]} in {short(g[0])}")
        ok = not missing and not extra
    else:
        ok = not violations
    print(f"\n{len(table)} kernels: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
