"""Checks what `keyway bench package --json` found in the test command's builds: every function of
template.yaml built by `sam build` for arm64 (target/sam-build) and by `cargo lambda build
--release --x86-64` (target/lambda), without the embedded runtime, and each build of this
machine's architecture started and answered cleanly on the embedded runtime (bench package fails
otherwise). The sizes and cold starts are printed with their targets (4 MiB zipped, 50 ms),
figures to report, not conditions of a passing run. The keyed counter's peak memory for the
largest batch Lambda hands it (10,000 records in 6 MB) is a condition: within 128 MiB, Lambda's
smallest memory setting.

    python3 scripts/check_packages.py target/bench-package.json
"""

import json
import platform
import sys

EXPECTED = {"target/sam-build": "arm64", "target/lambda": "x86_64"}
# The architecture whose builds this machine starts.
HOST = {"x86_64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())


def main(path):
    with open(path) as f:
        bench = json.load(f)
    problems = []
    by_build = {}
    for p in bench["packages"]:
        build = p["build"].rstrip("/")
        by_build.setdefault(build, []).append(p)
        expected = EXPECTED.get(build)
        if expected is None:
            problems.append(f"{p['bootstrap']}: not from a build this check knows")
            continue
        if p["architecture"] != expected:
            problems.append(f"{p['bootstrap']}: built for {p['architecture']}, expected {expected}")
        if not p["embedded_runtime_left_out"]:
            problems.append(f"{p['function']}: its crate builds keyway with the embedded runtime")
        if p["architecture"] == HOST and p["cold_start_ms"] is None:
            problems.append(f"{p['bootstrap']}: no cold start measured")
        cold = "-" if p["cold_start_ms"] is None else f"{p['cold_start_ms']:.1f} ms"
        warm = "-" if p["warm_response_ms"] is None else f"{p['warm_response_ms']:.1f} ms"
        print(f"  {p['function']:<26} {p['architecture']:<7} zip {p['zip_bytes'] / 2**20:5.2f} MiB"
              f"  cold start {cold:>9}  warm {warm:>9}")
    for build, expected in EXPECTED.items():
        functions = {p["function"] for p in by_build.get(build, [])}
        if len(functions) != 8:
            problems.append(f"{build}: {len(functions)} functions packaged, expected template.yaml's 8")
    peak = bench.get("largest_batch_peak_bytes")
    if peak is None:
        problems.append("the keyed counter's peak memory for the largest batch was not measured")
    elif peak > bench["target_peak_memory_bytes"]:
        problems.append(f"the keyed counter took {peak / 2**20:.1f} MiB for the largest batch, past "
                        f"{bench['target_peak_memory_bytes'] / 2**20:.0f} MiB")
    else:
        print(f"the keyed counter ran 10,000 records in 6 MB within {peak / 2**20:.1f} MiB "
              f"(target: {bench['target_peak_memory_bytes'] / 2**20:.0f} MiB)")
    print(f"largest zip {bench['largest_zip_bytes'] / 2**20:.2f} MiB, slowest cold start "
          f"{bench['slowest_cold_start_ms']} ms (targets: {bench['target_zip_bytes'] / 2**20:.0f} MiB,"
          f" {bench['target_cold_start_ms']:.0f} ms): {'met' if bench['targets_met'] else 'missed'}")
    if problems:
        sys.exit("packages:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main(sys.argv[1])
