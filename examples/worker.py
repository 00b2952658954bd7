#!/usr/bin/env python3
"""A Switchyard worker in Python with only the standard library.

It serves a queue over the node's HTTP worker API: each job's input is a
string of words, streamed back one output per word before the job
completes; a job the node cancels stops at once.

    SWITCHYARD_URL=http://127.0.0.1:8080 QUEUE=demo python3 examples/worker.py

Settings (environment): SWITCHYARD_URL, QUEUE (demo), CAPABILITY
(model=demo), CONCURRENCY (1), DELAY (seconds between words, 0.05), NAME
(py-worker), SWITCHYARD_API_KEY (a key with the work role, for a node that
checks keys: sent on the session and on every post).

The protocol (described by the node's /openapi.json): POST
/v1/queues/{queue}/workers opens a session, read as server-sent events:
registered (the session id), then job and cancel events. The worker answers
with JSON posts to /v1/workers/{session}/jobs/{job}/accept, output,
complete or fail, each naming the offer's generation, and posts
/v1/workers/{session}/heartbeat when it has nothing else to say. When the
stream ends, so does the session.
"""

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

URL = os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080").rstrip("/")
QUEUE = os.environ.get("QUEUE", "demo")
CAPABILITY = os.environ.get("CAPABILITY", "model=demo")
CONCURRENCY = int(os.environ.get("CONCURRENCY", "1"))
DELAY = float(os.environ.get("DELAY", "0.05"))
NAME = os.environ.get("NAME", "py-worker")
AUTH = {"Authorization": "Bearer " + os.environ["SWITCHYARD_API_KEY"]} if os.environ.get("SWITCHYARD_API_KEY") else {}


def post(path, body=None):
    """POSTs JSON to the node; returns the HTTP status."""
    return post_answer(path, body)[0]


def post_answer(path, body=None):
    """POSTs JSON to the node; returns the HTTP status and headers."""
    data = json.dumps(body if body is not None else {}).encode()
    req = urllib.request.Request(URL + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **AUTH})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, res.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def post_output(path, body):
    """POSTs one output. Output is paced by the job's reader: the answer
    waits while the reader is behind, and after a while says 429
    reader_behind (nothing taken): the same output goes again after
    Retry-After."""
    while True:
        status, headers = post_answer(path, body)
        if status != 429:
            return status
        time.sleep(float(headers.get("Retry-After", "1")))


def events(res):
    """Yields (event, data) from a text/event-stream response."""
    event, data = "", []
    for raw in res:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if event or data:
                yield event or "message", "\n".join(data)
            event, data = "", []
        elif line.startswith(":"):
            continue  # a heartbeat comment
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


class Worker:
    def __init__(self):
        self.session = None
        self.cancelled = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def job_path(self, job, action):
        return "/v1/workers/%s/jobs/%s/%s" % (self.session, job, action)

    def run(self, offer):
        job, gen = offer["job_id"], offer["generation"]
        post(self.job_path(job, "accept"), {"generation": gen})
        text = offer["input"] if isinstance(offer["input"], str) else json.dumps(offer["input"])
        for word in text.split():
            with self.lock:
                cancelled = job in self.cancelled
            if cancelled:
                post(self.job_path(job, "fail"),
                     {"generation": gen, "code": "cancelled", "message": "cancelled by the node"})
                return
            post_output(self.job_path(job, "output"), {"generation": gen, "data": word + " "})
            time.sleep(DELAY)
        post(self.job_path(job, "complete"), {"generation": gen})

    def heartbeat(self, seconds):
        while not self.stop.wait(seconds):
            if post("/v1/workers/%s/heartbeat" % self.session) == 404:
                return

    def serve(self):
        body = json.dumps({"name": NAME, "capabilities": [CAPABILITY], "concurrency": CONCURRENCY}).encode()
        req = urllib.request.Request("%s/v1/queues/%s/workers" % (URL, QUEUE), data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "text/event-stream", **AUTH})
        with urllib.request.urlopen(req) as res:
            for event, data in events(res):
                msg = json.loads(data)
                if event == "registered":
                    self.session = msg["session"]
                    threading.Thread(target=self.heartbeat, args=(msg["heartbeat_ms"] / 1000,), daemon=True).start()
                    print("registered on %s: session %s" % (QUEUE, self.session), file=sys.stderr, flush=True)
                elif event == "job":
                    threading.Thread(target=self.run, args=(msg,), daemon=True).start()
                elif event == "cancel":
                    with self.lock:
                        self.cancelled.add(msg["job_id"])
                elif event == "closed":
                    print("the node ended the session: %s" % data, file=sys.stderr, flush=True)
        self.stop.set()


if __name__ == "__main__":
    try:
        Worker().serve()
    except KeyboardInterrupt:
        pass
    print("session ended", file=sys.stderr)
    sys.exit(1)
