"""dataref run_python runner: loads the inputs, runs the model's code, writes the outputs.

Invoked as `python -I -B <job>/in/runner.py <job>` by the runtime's interpreter, inside the
sandbox. Started ahead for the warm pool, it imports pandas and pyarrow, then waits on its
stdin (a Unix socket) for the job; see `_wait_for_job`. The contract with the Rust side (crates/dataref-sandbox/src/runtime/exchange.rs):

  <job>/in/request.json        {"inputs": [names], "result_cap": N, "max_outputs": N}
  <job>/in/inputs/<name>.arrow Arrow IPC file format, uncompressed (a store artifact)
  <job>/in/code.py             the model's code
  <job>/in/files/...           workspace files the code may read
  <job>/out/outputs/<name>.arrow
  <job>/out/files/...          files the code writes for the workspace
  <job>/out/result.json        {ok, result, error, outputs, duration_ms}

The user's stdout and stderr are the process's own; this script never prints, so that
whatever the model printed is all the Rust side captures.
"""

import builtins
import ctypes
import json
import keyword
import math
import mmap
import os
import socket
import stat
import sys
import time
import traceback

_T0 = time.monotonic()
# The model's code is run from the job root so that `in/files/...` and `out/files/...`
# are the paths the tool description documents.
_JOB = os.path.abspath(sys.argv[1])
_CODE_NAME = "<code>"
_MESSAGE_CAP = 2000
_TRACEBACK_FRAMES_CAP = 20
_CODE_LINE_CAP = 200
_OUTPUT_NAME_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)
_OUTPUT_NAME_MAX = 64
_RESERVED = frozenset({"outputs", "result", "pd", "np"})
# The model's code runs in this namespace; emptied before the fast exit (`_exit_now`).
_USER_GLOBALS = {}


class ExchangeError(Exception):
    """A broken rule of the exchange (not the model's own exception): `kind` is its type."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _cap(text, limit):
    if len(text) <= limit:
        return text
    return text[:limit] + f"... ({len(text) - limit} more characters cut)"


def _write_json_atomic(path, value):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _finish(ok, result=None, error=None, outputs=()):
    _write_json_atomic(
        os.path.join(_JOB, "out", "result.json"),
        {
            "ok": ok,
            "result": result,
            "error": error,
            "outputs": list(outputs),
            "duration_ms": int((time.monotonic() - _T0) * 1000),
        },
    )


def _error(kind, message, frames=()):
    return {"type": kind, "message": _cap(message, _MESSAGE_CAP), "traceback": list(frames)}


def _user_frames(exc, source_lines):
    """The frames of the model's code only: library internals mean nothing to it."""
    frames = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename != _CODE_NAME or frame.lineno is None:
            continue
        code = ""
        if 1 <= frame.lineno <= len(source_lines):
            code = source_lines[frame.lineno - 1].strip()
        frames.append({"line": frame.lineno, "code": _cap(code, _CODE_LINE_CAP)})
    if isinstance(exc, SyntaxError) and exc.filename == _CODE_NAME and exc.lineno:
        code = (exc.text or "").strip()
        frames.append({"line": exc.lineno, "code": _cap(code, _CODE_LINE_CAP)})
    return frames[-_TRACEBACK_FRAMES_CAP:]


def _exception_message(exc):
    if isinstance(exc, SyntaxError):
        return exc.msg or str(exc)
    # KeyError's str() is the repr of the key, which reads fine as a message.
    return str(exc)


def _jsonable(value, pd, np, where, depth=0):
    """Converts `result` into plain JSON values; numpy and pandas scalars become their
    Python equivalents, NaN and NaT become null."""
    if depth > 32:
        raise ExchangeError("ResultNotSerializable", f"`result` nests deeper than 32 levels at {where}")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            return None
        return pd.Timestamp(value).isoformat()
    if isinstance(value, np.timedelta64):
        if np.isnat(value):
            return None
        return pd.Timedelta(value).isoformat()
    if isinstance(value, (pd.Timestamp, pd.Timedelta)):
        return value.isoformat()
    if hasattr(value, "isoformat") and callable(value.isoformat):
        # datetime.date, datetime.datetime, datetime.time
        return value.isoformat()
    if isinstance(value, pd.Period):
        return str(value)
    if isinstance(value, (pd.Series, pd.Index)):
        value = value.to_dict() if isinstance(value, pd.Series) else value.tolist()
    elif isinstance(value, pd.DataFrame):
        value = value.to_dict(orient="records")
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
        return _jsonable(value, pd, np, where, depth + 1)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = _jsonable(k, pd, np, f"{where} key {k!r}", depth + 1)
            if not isinstance(key, str):
                key = json.dumps(key) if key is not None else "null"
            out[key] = _jsonable(v, pd, np, f"{where}[{k!r}]", depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, pd, np, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise ExchangeError(
        "ResultNotSerializable",
        f"`result` holds a value of type `{type(value).__name__}` at {where}, which is not "
        "JSON-serialisable; convert it (str(), float(), .tolist()) or store tables in "
        "`outputs[name]`",
    )


def _result_json(value, pd, np, cap):
    converted = _jsonable(value, pd, np, "result")
    encoded = json.dumps(converted, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    size = len(encoded.encode("utf-8"))
    if size > cap:
        raise ExchangeError(
            "ResultTooLarge",
            f"`result` is {size} bytes as JSON, over the {cap}-byte cap; put tables in "
            "`outputs[name]` (they are stored as new dataRefs) and keep `result` to a small "
            "summary",
        )
    return converted


def _column_name(name):
    if isinstance(name, tuple):
        parts = [str(p) for p in name if p is not None and str(p) != ""]
        return "_".join(parts)
    return str(name)


def _output_frames(outputs, pd, max_outputs):
    if not isinstance(outputs, dict):
        raise ExchangeError(
            "OutputsNotDict", f"`outputs` must stay a dict, but it is a `{type(outputs).__name__}`"
        )
    if len(outputs) > max_outputs:
        raise ExchangeError(
            "TooManyOutputs", f"{len(outputs)} outputs, at most {max_outputs} are allowed"
        )
    frames = {}
    for name, value in outputs.items():
        if (
            not isinstance(name, str)
            or not name
            or len(name) > _OUTPUT_NAME_MAX
            or name.startswith(".")
            or not set(name) <= _OUTPUT_NAME_CHARS
        ):
            raise ExchangeError(
                "OutputNameInvalid",
                f"output name {name!r} is not allowed: use 1 to {_OUTPUT_NAME_MAX} of "
                "A-Z a-z 0-9 . _ -, not starting with a dot",
            )
        if isinstance(value, pd.Series):
            value = value.to_frame()
        if not isinstance(value, pd.DataFrame):
            raise ExchangeError(
                "OutputNotDataFrame",
                f"`outputs[{name!r}]` is a `{type(value).__name__}`; only pandas DataFrames "
                "(or Series) can be stored, put small values in `result` instead",
            )
        # A non-default index carries data (groupby keys, pivot rows): keep it as columns
        # rather than silently dropping it.
        index = value.index
        default_index = (
            isinstance(index, pd.RangeIndex)
            and index.start == 0
            and index.step == 1
            and index.name is None
        )
        if not default_index:
            value = value.reset_index()
        value = value.copy(deep=False)
        value.columns = [_column_name(c) for c in value.columns]
        frames[name] = value
    return frames


def _write_outputs(frames, pa):
    out_dir = os.path.join(_JOB, "out", "outputs")
    written = []
    for name, df in frames.items():
        try:
            table = pa.Table.from_pandas(df, preserve_index=False)
        except Exception as exc:  # noqa: BLE001 - the message is what the model needs
            raise ExchangeError(
                "OutputNotConvertible",
                f"`outputs[{name!r}]` cannot be stored as an Arrow table: {exc}",
            ) from None
        # A dot-prefixed temp name is never picked up by the collector, so a runner killed
        # mid-write leaves nothing that looks like an output.
        tmp = os.path.join(out_dir, f".{name}.arrow.tmp")
        with pa.OSFile(tmp, "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        os.replace(tmp, os.path.join(out_dir, f"{name}.arrow"))
        written.append(name)
    return written


def _wait_for_job():
    """A warm sandbox is started before its job exists: its stdin is a Unix socket, and the
    sandbox says `ready` once its imports are done, and the job arrives as one message `go`
    carrying the input files' descriptors (opened read-only
    by the server) in the order of `request.json`'s inputs. Returns None when started for a
    job directly (stdin is not a socket) and exits quietly when the server closes the
    socket without a job (the pool is shutting down)."""
    global _T0
    if not stat.S_ISSOCK(os.fstat(0).st_mode):
        return None
    sock = socket.socket(fileno=0)
    # Imports are done: the server puts this sandbox in the pool only now, so a job's
    # wall clock never pays for them.
    sock.sendall(b"ready")
    msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 256)
    sock.close()
    # Standard input is /dev/null from here on, not whatever is opened next on fd 0.
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:
        os.dup2(devnull, 0)
        os.close(devnull)
    if msg != b"go":
        for fd in fds:
            os.close(fd)
        sys.exit(0)
    _T0 = time.monotonic()
    return fds


def _map_and_close(fd, pa):
    """Maps `fd` read-only for the life of the process and closes it. (`mmap.mmap` would
    keep a duplicate of the descriptor open as long as the map: a store file in reach of the
    model's code, which could read its host path from `/proc/self/fd`.)"""
    size = os.fstat(fd).st_size
    if size == 0:
        os.close(fd)
        return pa.py_buffer(b"")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
    )
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    err = ctypes.get_errno()
    os.close(fd)
    if address is None or address == ctypes.c_void_p(-1).value:
        raise OSError(err, f"mapping an input: {os.strerror(err)}")
    return pa.foreign_buffer(address, size)


def _close_inherited_fds():
    """Closes every descriptor above stderr, before anything of the runner's is open: a
    descriptor the server process inherited without close-on-exec passes through bubblewrap
    into the sandbox, and a directory among them would reach past the mount namespace."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already


def _open_input(name, fds, index, pa, keep):
    if fds is None:
        source = pa.memory_map(os.path.join(_JOB, "in", "inputs", f"{name}.arrow"), "r")
    else:
        if index >= len(fds):
            raise ExchangeError("InputMissing", f"input {name!r} was not passed")
        # Mapped from the descriptor: the file itself is not reachable by path in here.
        source = pa.BufferReader(_map_and_close(fds[index], pa))
    # The map stays open for the life of the process: to_pandas may keep zero-copy views
    # of its buffers.
    keep.append(source)
    return pa.ipc.open_file(source).read_all()


def main():
    _close_inherited_fds()
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.ipc  # noqa: F401 - pa.ipc is a submodule

    fds = _wait_for_job()
    with open(os.path.join(_JOB, "in", "request.json"), encoding="utf-8") as f:
        request = json.load(f)
    with open(os.path.join(_JOB, "in", "code.py"), encoding="utf-8") as f:
        source = f.read()
    source_lines = source.splitlines()
    result_cap = int(request.get("result_cap", 4096))
    max_outputs = int(request.get("max_outputs", 16))
    os.makedirs(os.path.join(_JOB, "out", "outputs"), exist_ok=True)
    os.makedirs(os.path.join(_JOB, "out", "files"), exist_ok=True)

    user_globals = _USER_GLOBALS
    user_globals.update({
        "__name__": "__main__",
        "__builtins__": builtins,
        "pd": pd,
        "np": np,
        "outputs": {},
        "result": None,
    })
    keep = []
    for index, name in enumerate(request.get("inputs", [])):
        # The Rust side validates names; this is the second lock on the same door.
        if (
            not name.isidentifier()
            or keyword.iskeyword(name)
            or hasattr(builtins, name)
            or name in _RESERVED
            or name.startswith("__")
        ):
            raise ExchangeError("InputNameInvalid", f"input name {name!r} is not allowed")
        table = _open_input(name, fds, index, pa, keep)
        # date32/date64 arrive as datetime64 so that `.dt` works, as models expect.
        user_globals[name] = table.to_pandas(date_as_object=False)
    # Descriptors beyond the inputs would stay in reach of the model's code.
    for fd in (fds or [])[len(request.get("inputs", [])):]:
        os.close(fd)

    try:
        code = compile(source, _CODE_NAME, "exec")
        os.chdir(_JOB)
        exec(code, user_globals)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _finish(False, error=_error("SystemExit", f"exit({exc.code!r})", _user_frames(exc, source_lines)))
            return
    except BaseException as exc:  # noqa: BLE001 - every failure is an observation
        _finish(
            False,
            error=_error(type(exc).__name__, _exception_message(exc), _user_frames(exc, source_lines)),
        )
        return

    try:
        frames = _output_frames(user_globals.get("outputs"), pd, max_outputs)
        result = _result_json(user_globals.get("result"), pd, np, result_cap)
        written = _write_outputs(frames, pa)
    except ExchangeError as exc:
        _finish(False, error=_error(exc.kind, str(exc)))
        return
    _finish(True, result=result, outputs=written)


def _exit_now():
    """Leaves without Python's own shutdown, which tears down pandas' modules one by one
    and costs about 100 ms of every run; the result is on disk by now. Files the code left
    open are flushed first: dropping its globals closes them."""
    import gc

    _USER_GLOBALS.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
            pass
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except ExchangeError as exc:
        _finish(False, error=_error(exc.kind, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - a broken job must still say why
        _finish(False, error=_error("RunnerError", f"{type(exc).__name__}: {exc}"))
    _exit_now()
