"""The canary: a small CUDA process of the broker's own, holding a known pattern in GPU
memory, that says whether the pattern is intact.

    python -m jupyter_gpubroker.suspend.canary_process MIB

It uses the one GPU ``CUDA_VISIBLE_DEVICES`` names (as a kernel does), fills ``MIB`` MiB
with the pattern, prints ``ready``, then answers each line it reads with ``ok`` or
``bad: <why>`` once it has read the pattern back. The broker suspends and restores it
between two questions (``suspend.canary``); ``benchmarks/device_suspend.py`` times it.
It needs ``cuda-bindings`` (or CuPy) and a GPU: elsewhere it prints ``error: <why>``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

WORD = 0xA5A5A5A5
"""What every 4 bytes hold but the head."""
HEAD = 1 << 20
"""The head's bytes: a sequence no stuck memory or zeroed page reproduces."""


def head() -> bytes:
    return bytes((i * 131 + 7) % 256 for i in range(HEAD))


def _with_cuda_bindings(n: int) -> Callable[[], str | None]:
    from cuda.bindings import driver as cu

    def ok(result: tuple[object, ...]) -> object:
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {result[0]}")
        return result[1] if len(result) > 1 else None

    ok(cu.cuInit(0))
    device = ok(cu.cuDeviceGet(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
    ptr = ok(cu.cuMemAlloc(n))
    ok(cu.cuMemsetD32(ptr, WORD, n // 4))
    want = head()
    ok(cu.cuMemcpyHtoD(ptr, want, len(want)))
    ok(cu.cuCtxSynchronize())

    def check() -> str | None:
        back, tail = bytearray(len(want)), bytearray(HEAD)
        ok(cu.cuMemcpyDtoH(back, ptr, len(back)))
        ok(cu.cuMemcpyDtoH(tail, int(ptr) + n - HEAD, HEAD))  # type: ignore[call-overload]
        if bytes(back) != want:
            return "the first MiB differs"
        return None if tail == WORD.to_bytes(4, "little") * (HEAD // 4) else "the last MiB differs"

    return check


def main(argv: list[str]) -> int:
    n = max(int(argv[1]), 2) * 2**20
    try:
        check = _with_cuda_bindings(n)
    except Exception as e:  # no cuda-bindings, no GPU, no memory: said, not raised
        print(f"error: {e}", flush=True)
        return 1
    print("ready", flush=True)
    for _ in sys.stdin:
        try:
            bad = check()
        except Exception as e:
            bad = str(e)
        print("ok" if bad is None else f"bad: {bad}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
