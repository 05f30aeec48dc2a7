"""A scripted OpenAI-compatible Chat Completions server for the end-to-end tests: each
request is answered with the next scripted reply, streamed (SSE) when asked, and recorded.
A commercial model is the one part these tests cannot have for real."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedModel:
    """An OpenAI-compatible Chat Completions server answering each request with the next
    scripted reply ({"text": …} or {"calls": [(id, name, arguments)]}), streamed (SSE)
    when the request asks for it; it records every request body."""

    def __init__(self):
        self.script = []
        self.requests = []
        self.lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with model.lock:
                    model.requests.append(body)
                    reply = model.script.pop(0) if model.script else None
                if callable(reply):
                    # A reply made from the request (e.g. a call naming the dataRef the
                    # previous tool result gave).
                    reply = reply(body)
                if not self.path.endswith("/chat/completions") or reply is None:
                    err = json.dumps({"error": {"message": "scripted model: no reply left",
                                                "type": "server_error"}}).encode()
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                model.answer(self, body, reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def push(self, **reply):
        with self.lock:
            self.script.append(reply)

    def push_made(self, make):
        """A reply made when its request comes: `make(request_body)` gives the reply."""
        with self.lock:
            self.script.append(make)

    def answer(self, handler, body, reply):
        text = reply.get("text", "")
        calls = reply.get("calls", [])
        prompt, completion = reply.get("usage", (10, 2))
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        finish = "tool_calls" if calls else "stop"
        base = {"id": "chatcmpl-py", "created": 1700000000, "model": body.get("model", "m")}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, n, a in calls]
            out = json.dumps({**base, "object": "chat.completion", "usage": usage,
                              "choices": [{"index": 0, "message": message,
                                           "finish_reason": finish}]}).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(out)))
            handler.end_headers()
            handler.wfile.write(out)
            return

        def chunk(delta, finish_reason=None):
            return {**base, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": text[i:i + 5]}) for i in range(0, len(text), 5)]
        for index, (call_id, name, arguments) in enumerate(calls):
            events.append(chunk({"tool_calls": [{
                "index": index, "id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}}]}))
        events.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "object": "chat.completion.chunk", "choices": [],
                           "usage": usage})
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        for e in events:
            handler.wfile.write(f"data: {json.dumps(e)}\n\n".encode())
            handler.wfile.flush()
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
        handler.close_connection = True

    def close(self):
        self.server.shutdown()
        self.server.server_close()
