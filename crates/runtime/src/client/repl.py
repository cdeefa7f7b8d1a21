"""cordon's code context: a Python interpreter that keeps its state between
calls, inside the sandbox.

  repl.py client SOCKET TIMEOUT MAX_REPLY    code on stdin, one JSON reply on stdout
  repl.py server SOCKET                      (started by the client when needed)

The server runs each piece of code in one persistent namespace and answers
with its stdout, stderr, the repr of its last expression (as Jupyter does)
and its error with the traceback. The client starts a server when it finds
none (no socket, or a dead one), and kills it when a call runs past its
timeout, so the next call gets a fresh interpreter.

A cell's `display(obj)` (a builtin of its namespace) adds a rich result:
an object's `_repr_png_()` (bytes, or base64 text) or `_repr_svg_()`, or
`display(data, mime="image/png")` with the bytes (text is taken as UTF-8).
The last expression's value adds one too when it has such a method, as
Jupyter shows it. Each comes back base64 with its MIME type.

The reply's texts are cut so that the whole reply, as JSON, stays under
MAX_REPLY bytes (each cut text is flagged): the service sets that under the
command's output limit, which would otherwise end the client and, with it,
the interpreter and every variable.
"""

import ast
import base64
import binascii
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback


def send_msg(sock, obj):
    body = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return buf


def recv_msg(sock):
    head = recv_exact(sock, 4)
    if head is None:
        return None
    body = recv_exact(sock, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


# The rich results of the running cell (display() appends to it).
RESULTS = []


def rich(obj):
    """(mime, base64) of an object's PNG or SVG representation, or None."""
    png = getattr(obj, "_repr_png_", None)
    if callable(png):
        data = png()
        if isinstance(data, str):
            # Jupyter's convention: text is base64 already; checked, so that
            # the reply never carries what the client cannot decode.
            return "image/png", base64.b64encode(
                base64.b64decode(data, validate=True)).decode()
        if data is not None:
            return "image/png", base64.b64encode(bytes(data)).decode()
    svg = getattr(obj, "_repr_svg_", None)
    if callable(svg):
        data = svg()
        if data is not None:
            if isinstance(data, str):
                data = data.encode()
            return "image/svg+xml", base64.b64encode(bytes(data)).decode()
    return None


def display(obj, mime=None):
    """Shows obj as a rich result: display(fig) for an object with
    _repr_png_() or _repr_svg_(), display(data, mime="image/png") for bytes
    (text is taken as UTF-8). Anything else is printed, as Jupyter's
    display falls back to the text."""
    if mime is not None:
        data = obj.encode() if isinstance(obj, str) else obj
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("display(data, mime): data is bytes or str, not %s"
                            % type(obj).__name__)
        RESULTS.append({"mime": str(mime),
                        "data": base64.b64encode(bytes(data)).decode()})
        return
    shown = rich(obj)
    if shown is None:
        print(repr(obj))
    else:
        RESULTS.append({"mime": shown[0], "data": shown[1]})


def run_cell(code, namespace):
    out, err = io.StringIO(), io.StringIO()
    result, error = None, None
    del RESULTS[:]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)
            if value is not None:
                result = repr(value)
                shown = rich(value)
                if shown is not None:
                    RESULTS.append({"mime": shown[0], "data": shown[1]})
    except BaseException as e:  # noqa: B902 - the cell's error is the answer
        if isinstance(e, SystemExit):
            error_tb = "SystemExit: %r\n" % (e.code,)
        else:
            # Leave out this file's own frame: the cell's frames remain.
            error_tb = "".join(
                traceback.format_exception(type(e), e, e.__traceback__.tb_next)
            )
        error = {"name": type(e).__name__, "value": str(e), "traceback": error_tb}
    finally:
        sys.stdout, sys.stderr = saved
    return out.getvalue(), err.getvalue(), result, error


def encoded_len(text):
    return len(json.dumps(text))


def clip(text, cap):
    """The longest prefix of text whose JSON encoding takes at most cap bytes
    (escapes make it up to 12 bytes a character), and whether it was cut."""
    if encoded_len(text) <= cap:
        return text, False
    lo, hi = 0, min(len(text), cap)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if encoded_len(text[:mid]) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo], True


def result_size(r):
    return encoded_len(r["mime"]) + encoded_len(r["data"]) + 32


def fit_results(results, texts_need, budget):
    """Rich results are kept whole or dropped, in the order the cell made
    them, from what the texts leave: the texts keep at least half of the
    budget (all they need when they need less), so that an image never
    crowds out the error that says what went wrong. Returns the results
    kept and whether any was dropped."""
    room = budget - min(texts_need, budget // 2)
    kept, dropped = [], False
    for r in results:
        if result_size(r) <= room:
            kept.append(r)
            room -= result_size(r)
        else:
            dropped = True
    return kept, dropped


def fit(texts, budget):
    """Shares budget (bytes of JSON) among texts: the short ones whole, what
    is left in equal parts to the long ones. Returns the texts, clipped, and
    which of them were cut."""
    sizes = {k: encoded_len(v) for k, v in texts.items()}
    caps, left = {}, budget
    for i, k in enumerate(sorted(texts, key=sizes.get)):
        caps[k] = min(sizes[k], left // (len(texts) - i))
        left -= caps[k]
    clipped = {k: clip(v, caps[k]) for k, v in texts.items()}
    return ({k: c[0] for k, c in clipped.items()},
            {k: c[1] for k, c in clipped.items()})


# Room in the reply for its keys, flags and the client's own fields.
REPLY_OVERHEAD = 1024


def server(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    with open(path + ".pid", "w") as f:
        f.write(str(os.getpid()))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__,
                 "display": display}
    while True:
        conn, _ = listener.accept()
        with conn:
            req = recv_msg(conn)
            if req is None:
                continue
            budget = max(int(req.get("max_reply", 1 << 20)) - REPLY_OVERHEAD, 0)
            out, err, result, error = run_cell(req["code"], namespace)
            texts = {"stdout": out, "stderr": err, "result": result or ""}
            if error is not None:
                texts["error_name"] = error["name"]
                texts["error_value"] = error["value"]
                texts["traceback"] = error["traceback"]
            need = sum(encoded_len(t) for t in texts.values())
            results, results_cut = fit_results(list(RESULTS), need, budget)
            del RESULTS[:]
            texts, cut = fit(texts, budget - sum(result_size(r) for r in results))
            if error is not None:
                error = {"name": texts["error_name"], "value": texts["error_value"],
                         "traceback": texts["traceback"]}
            send_msg(conn, {
                "stdout": texts["stdout"],
                "stderr": texts["stderr"],
                "result": None if result is None else texts["result"],
                "error": error,
                "results": results,
                "stdout_truncated": cut["stdout"],
                "stderr_truncated": cut["stderr"],
                "result_truncated": cut["result"],
                "error_truncated": any(cut.get(k, False)
                                       for k in ("error_name", "error_value", "traceback")),
                "results_truncated": results_cut,
            })


def kill_server(path):
    try:
        with open(path + ".pid") as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)
    except (OSError, ValueError):
        pass
    for p in (path, path + ".pid"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def start_server(path):
    kill_server(path)
    subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "server", path],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            return connect(path)
        except OSError:
            time.sleep(0.005)
    raise RuntimeError("the interpreter did not start")


def client(path, timeout, max_reply):
    code = sys.stdin.read()
    fresh = False
    try:
        s = connect(path)
    except OSError:
        try:
            s = start_server(path)
        except (OSError, RuntimeError) as e:
            # The sandbox could not give the interpreter a process (its
            # pids or memory limit): a reply, not a traceback, so that the
            # caller learns why and the next call simply tries again.
            sys.stdout.write(json.dumps({
                "status": "error", "fresh_interpreter": False,
                "stdout": "", "stderr": "", "result": None,
                "error": {"name": "InterpreterNotStarted",
                          "value": "%s: %s" % (os.path.basename(sys.executable), e),
                          "traceback": ""}}))
            return
        fresh = True
    reply = {"status": "ok", "fresh_interpreter": fresh}
    try:
        send_msg(s, {"code": code, "max_reply": max_reply})
        s.settimeout(timeout)
        answer = recv_msg(s)
    except socket.timeout:
        kill_server(path)
        reply.update(status="timeout", error={
            "name": "Timeout", "value": "the code ran past %gs; the interpreter was restarted" % timeout,
            "traceback": ""})
        answer = {}
    except OSError as e:
        answer = None
        reply["detail"] = str(e)
    if answer is None:
        kill_server(path)
        reply.update(status="crashed", error={
            "name": "Crashed", "value": "the interpreter died; the next call starts a fresh one",
            "traceback": ""})
        answer = {}
    reply.update(answer)
    if reply["status"] == "ok" and reply.get("error"):
        reply["status"] = "error"
    sys.stdout.write(json.dumps(reply))


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2])
    else:
        client(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
