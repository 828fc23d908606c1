"""`python -m trl_multiagent.view RUN_DIR [--out FILE] [--steps 3 8] [--serve [--port N]]` (docs/viewer.md)."""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys

from .page import ViewError, write_page


LARGE_PAGE_MB = 100


def serve(path: str, port: int) -> None:
    """Serve the page's folder on 127.0.0.1 only (nothing else on the network can reach it) until Ctrl-C."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=os.path.dirname(os.path.abspath(path)))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/{os.path.basename(path)}"
        print(f"Serving {url} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trl_multiagent.view",
        description="Write the rollout trees a run recorded (MAGRPOConfig(log_rollout_trees=True)) as one HTML page.",
    )
    parser.add_argument("run_dir", help="the run's output_dir (it holds rollout_trees/step_*.json.gz)")
    parser.add_argument("--out", help="the page to write (default: RUN_DIR/rollout_trees.html)")
    parser.add_argument("--steps", type=int, nargs="+", help="only these recorded steps (default: every one)")
    parser.add_argument("--serve", action="store_true", help="then serve the page on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="the port for --serve (0: any free port)")
    args = parser.parse_args(argv)
    try:
        path = write_page(args.run_dir, args.out, args.steps)
    except ViewError as error:
        print(f"trl_multiagent.view: {error}", file=sys.stderr)
        return 2
    megabytes = os.path.getsize(path) / 1e6
    print(f"Wrote {path} ({megabytes:.2f} MB); open it in a browser.")
    if megabytes > LARGE_PAGE_MB:  # measured: opening takes about 1 s per 80 MB, a step switch parses its step
        print("The page is large: pick fewer steps with --steps (docs/viewer.md, 'How large a tree it handles').")
    if args.serve:
        serve(path, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
