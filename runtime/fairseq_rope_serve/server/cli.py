"""``fairseq-rope-serve MODEL_DIR``: an exported model behind LibreTranslate's HTTP API.

Starlette (the application) under uvicorn (the server). It listens on 127.0.0.1 unless
``--host`` says otherwise. The API key, if any, comes from ``--api-key-file`` or the
:data:`KEY_VARIABLE` environment variable, never from the command line (which other users of
the machine can read). On SIGTERM (or Ctrl-C) it stops accepting connections, answers the
requests in flight, then exits.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Optional, Sequence

from fairseq_rope_serve.common import FairseqRopeError, report_error
from fairseq_rope_serve.server.app import Limits, create_app
from fairseq_rope_serve.translate import add_model_arguments
from fairseq_rope_serve.translator import TextTranslator

KEY_VARIABLE = "FAIRSEQ_ROPE_SERVE_API_KEY"


class ServeError(FairseqRopeError):
    """The server cannot start as asked."""


def read_api_key(key_file: Optional[Path]) -> Optional[str]:
    """The key from ``key_file`` (its first line) or :data:`KEY_VARIABLE`; None for no key."""
    from_env = os.environ.get(KEY_VARIABLE)
    if key_file is not None and from_env is not None:
        raise ServeError(f"both --api-key-file and {KEY_VARIABLE} are set: give the key one way")
    if key_file is not None:
        lines = key_file.read_text(encoding="utf-8").splitlines()
        key = lines[0].strip() if lines else ""
    elif from_env is not None:
        key = from_env.strip()
    else:
        return None
    if not key:
        raise ServeError(f"the API key ({key_file or KEY_VARIABLE}) is empty")
    return key


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fairseq-rope-serve", allow_abbrev=False,  # no --api-key standing for --api-key-file
        description="Serve a model directory written by fairseq-rope-export-ct2 over HTTP, with "
        "LibreTranslate's API: POST /translate, GET /languages, GET /health.")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, "
                        "this machine only; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=5000, help="default: 5000 (LibreTranslate's); 0: any free one")
    parser.add_argument("--api-key-file", type=Path,
                        help=f"file whose first line is the API key clients must send (or set {KEY_VARIABLE}); "
                        "default: no key")
    parser.add_argument("--inter-threads", type=int, default=1, help="batches translated at once (default: 1)")
    parser.add_argument("--intra-threads", type=int, default=0,
                        help="CPU threads of each batch (default 0: CTranslate2's choice)")
    add_model_arguments(parser)
    defaults = Limits()
    parser.add_argument("--max-chars", type=int, default=defaults.max_chars, help="characters per request")
    parser.add_argument("--max-sentences", type=int, default=defaults.max_sentences,
                        help="lines (sentences) per request")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes, help="bytes per request body")
    parser.add_argument("--max-batch-sentences", type=int, default=defaults.max_batch_sentences,
                        help="sentences of waiting requests translated together")
    parser.add_argument("--max-queued-sentences", type=int, default=defaults.max_queued_sentences,
                        help="sentences waiting, beyond which requests get 503")
    parser.add_argument("--graceful-timeout", type=int, default=60,
                        help="seconds the requests in flight get to finish on SIGTERM (default: 60)")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import uvicorn

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        key = read_api_key(args.api_key_file)
        limits = Limits(args.max_body_bytes, args.max_chars, args.max_sentences, args.max_batch_sentences,
                        args.max_queued_sentences)
        model = TextTranslator(args.model_dir, args.intra_threads, args.device, args.compute_type, args.beam,
                               args.lenpen, inter_threads=args.inter_threads)
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(2048)  # from now on, connections wait in its backlog until uvicorn takes them
    except (FairseqRopeError, OSError) as e:
        return report_error(e)
    app = create_app(model, limits, key, args.inter_threads, close_timeout=args.graceful_timeout)
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=args.graceful_timeout,
                            server_header=False)
    host, port = sock.getsockname()[:2]
    settings = model.settings
    print(f"fairseq-rope-serve: {args.model_dir} ({settings.source_lang}->{settings.target_lang}) on "
          f"http://{host}:{port}{' (API key required)' if key else ''}", file=sys.stderr, flush=True)
    # uvicorn handles SIGTERM (answers what is in flight), then raises it again for the handler it
    # found: this one makes that a clean exit, status 0.
    signal.signal(signal.SIGTERM, _exit)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _exit(signum: int, frame) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
