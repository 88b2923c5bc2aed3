#!/usr/bin/env python3
"""A bot that hears the chat through webhooks (Python 3 standard library).

What a product's backend does with imserver's webhooks (docs/integration.md,
"Webhooks"):
  1. register its URL for `msg` events (POST /v1/webhooks, an admin key);
  2. check every delivery's signature (X-Im-Signature: v1=<hex HMAC-SHA256 of
     X-Im-Timestamp + "." + body>) and timestamp, in constant time;
  3. dedupe by event id (a delivery may come more than once);
  4. answer each message starting with "!ping" with "pong", as the bot user,
     through POST /v1/conversations/{conv}/messages with cmid "pong-<id>":
     a redelivered event makes no second answer (the server's request key).

Usage:
  IM_API_KEY=imk_... ./webhook_bot.py --api http://127.0.0.1:8081 \\
      --listen 127.0.0.1:9090 --bot helpdesk [--ready-file FILE]

It removes its webhook on SIGTERM/SIGINT. With --ready-file it writes the
webhook's id there once it listens and is registered.
"""

import argparse
import hashlib
import hmac
import http.server
import json
import os
import secrets
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backend import Api, ApiError  # noqa: E402  (the same small API client)

MAX_SKEW_S = 300


def signature_ok(secret, timestamp, body, header):
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > MAX_SKEW_S:
        return False
    want = "v1=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, header)


class Bot:
    def __init__(self, api, bot_user, secret):
        self.api = api
        self.bot = bot_user
        self.secret = secret
        self.seen = set()  # event ids handled (a real backend keeps these in its database)
        self.lock = threading.Lock()

    def handle(self, delivery):
        for item in delivery["events"]:
            with self.lock:
                if item["id"] in self.seen:
                    continue
                self.seen.add(item["id"])
            ev = item["ev"]
            if ev["kind"] == "msg" and ev.get("sender") != self.bot and ev.get("body", "").startswith("!ping"):
                # cmid from the event id: posted once, however often the event comes
                self.api.call("POST", f"/v1/conversations/{ev['conv']}/messages",
                              {"sender": self.bot, "cmid": "pong-" + item["id"].replace(":", "-"), "body": "pong",
                               "reply_to": ev["seq"]})


def make_handler(bot):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if not signature_ok(bot.secret, self.headers.get("X-Im-Timestamp", ""), body,
                                self.headers.get("X-Im-Signature", "")):
                self.send_response(401)
                self.end_headers()
                return
            try:
                bot.handle(json.loads(body))
            except (ApiError, OSError) as e:  # the API is unavailable: 500, the delivery comes again
                print(f"webhook_bot: {e}", file=sys.stderr)
                self.send_response(500)
                self.end_headers()
                return
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", required=True)
    p.add_argument("--listen", default="127.0.0.1:9090")
    p.add_argument("--bot", required=True, help="the user the bot answers as (a member of the conversations)")
    p.add_argument("--ready-file")
    a = p.parse_args()
    key = os.environ.get("IM_API_KEY")
    if not key:
        sys.exit("webhook_bot: set IM_API_KEY (an admin key: it registers its webhook)")
    api = Api(a.api, key)
    host, port = a.listen.rsplit(":", 1)
    secret = secrets.token_hex(32)
    bot = Bot(api, a.bot, secret)
    server = http.server.ThreadingHTTPServer((host, int(port)), make_handler(bot))
    url = f"http://{host}:{server.server_address[1]}/im-events"
    _, made = api.call("POST", "/v1/webhooks", {"url": url, "events": ["msg"], "secret": secret})
    hook = made["id"]

    def stop(*_):
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if a.ready_file:
        with open(a.ready_file + ".tmp", "w") as f:
            f.write(hook + "\n")
        os.rename(a.ready_file + ".tmp", a.ready_file)
    try:
        server.serve_forever()
    finally:
        api.call("DELETE", f"/v1/webhooks/{hook}")


if __name__ == "__main__":
    main()
