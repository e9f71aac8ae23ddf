"""What authentication costs per request: MUNGE (controller RPC) and HMAC (data plane).

Prints, per call: raw munge encode and decode through ctypes, a full signed RPC request
(`sign_request` + `verify_request`), forking `munge -n | unmunge` for comparison, and
the data-plane HMAC sign + verify; then the process RSS before and after many
encode/decode pairs, to show libmunge's allocations are freed.

Needs munged running (`slurmrl dev-cluster up`). Usage:
    python benchmarks/munge_cost.py [--n 2000]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import time
from collections.abc import Callable

from slurmrl.auth import munge, tokens
from slurmrl.auth.requests import sign_request, verify_request


def per_call_ms(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e3


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per measurement")
    n = parser.parse_args().n
    body = b'{"job": 42, "phase": "rollout", "gpus": [0, 1, 2, 3]}'

    creds = [munge.encode(body) for _ in range(n)]
    enc = per_call_ms(lambda: munge.encode(body), n)
    it = iter(creds)
    dec = per_call_ms(lambda: munge.decode(next(it)), n)
    print(f"munge_encode (ctypes)            {enc:8.3f} ms/call")
    print(f"munge_decode (ctypes)            {dec:8.3f} ms/call")

    def signed_round_trip() -> None:
        header = sign_request("POST", "/v1/leases", body)
        verify_request(header, "POST", "/v1/leases", body)

    print(f"sign_request + verify_request    {per_call_ms(signed_round_trip, n):8.3f} ms/request")

    if shutil.which("munge") and shutil.which("unmunge"):

        def fork() -> None:
            cred = subprocess.run(["munge", "-n"], capture_output=True, check=True).stdout
            subprocess.run(["unmunge"], input=cred, capture_output=True, check=True)

        print(f"fork munge -n | unmunge          {per_call_ms(fork, min(n, 200)):8.3f} ms/call")

    secret = tokens.mint_secret()
    verifier = tokens.Verifier(secret)

    def hmac_round_trip() -> None:
        verifier.verify(tokens.sign(secret, "POST", "/v1/generate", body), "POST",
                        "/v1/generate", body)  # fmt: skip

    print(f"data plane HMAC sign + verify    {per_call_ms(hmac_round_trip, n):8.3f} ms/call")

    before = rss_mib()
    big = b"x" * 65536  # large payloads make a leak of decode's buffer obvious
    for _ in range(n):
        munge.decode(munge.encode(big))
    print(f"RSS before/after {n} 64 KiB encode+decode: {before:.1f} / {rss_mib():.1f} MiB")


if __name__ == "__main__":
    main()
