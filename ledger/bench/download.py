"""The collection's baseline: a bare streamed download of a results file with httpx, written to
/dev/null, counting its lines. Run in a process of its own, like the figures:
`python -m ledger.bench.download URL`."""

import sys

import httpx


def download(url: str) -> int:
    lines = 0
    with (
        open("/dev/null", "wb") as sink,
        httpx.stream("GET", url, headers={"Authorization": "Bearer bench"}, timeout=60) as response,
    ):
        response.raise_for_status()
        for chunk in response.iter_bytes():
            sink.write(chunk)
            lines += chunk.count(b"\n")
    return lines


if __name__ == "__main__":
    print(download(sys.argv[1]))
