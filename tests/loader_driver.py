"""Run command lines one after another in this one process, as their console scripts would.

    python tests/loader_driver.py COMMANDS.json RESULTS.json

COMMANDS.json: ``{name: {"argv": [...], "env": {...}}}``; ``argv[0]`` is a fairseq
console script (``fairseq-generate`` runs ``fairseq_cli.generate.cli_main``,
exactly what the installed script runs) or a Python script path. RESULTS.json:
``{name: {"status", "output", "stdout", "plugin_imported_before"}}`` where status
is what the process would exit with (1 for an uncaught exception, as Python
does) and output its stderr plus the traceback. One process pays fairseq's start-up once
(tests/test_safe_loading.py); commands run in the file's order.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import runpy
import sys
import traceback
from typing import Any, Dict, List


def run(argv: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    saved_env = dict(os.environ)
    os.environ.update(env)
    sys.argv = list(argv)
    plugin_imported_before = "fairseq_rope" in sys.modules
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            if argv[0].endswith(".py"):
                runpy.run_path(argv[0], run_name="__main__")
            else:
                module = importlib.import_module("fairseq_cli." + argv[0].removeprefix("fairseq-"))
                sys.exit(module.cli_main())
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:  # an uncaught exception: Python prints it and exits 1
        status = 1
        stderr.write(traceback.format_exc())
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    return {"status": status, "output": stderr.getvalue(), "stdout": stdout.getvalue(),
            "plugin_imported_before": plugin_imported_before}


def main(commands_file: str, results_file: str) -> None:
    with open(commands_file) as f:
        commands = json.load(f)
    results = {name: run(spec["argv"], spec.get("env", {})) for name, spec in commands.items()}
    with open(results_file, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
