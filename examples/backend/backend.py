#!/usr/bin/env python3
"""An app backend in ~150 lines of Python 3 standard library (no pip).

What a product's own server does with imserver (docs/integration.md):
  1. provision a user, a device and a conversation through the backend API
     (bearer API key, `imserver admin apikey add NAME --scope write`);
  2. mint a short-lived HS256 JWT for the user's device (contract section 4a:
     claims sub, device, exp, optional iss/aud), verified by an imserver
     started with --jwt-hs256-secret-file holding the same secret;
  3. post a message on a user's behalf (a welcome notice, a bot).

Usage:
  IM_API_KEY=imk_... ./backend.py walkthrough --api http://127.0.0.1:8081 \\
      --user dora --device dora-laptop --bot helpdesk --conv dora-help \\
      [--jwt-secret-file secret] [--jwt-ttl 600] [--jwt-issuer ISS] [--jwt-audience AUD]
  ./backend.py mint-jwt --jwt-secret-file secret --user dora --device dora-laptop

`walkthrough` prints one JSON object: the user, device and its random token,
the conversation, the posted message's answer and (with a secret) the JWT.
Every step may run again: an existing user, device or conversation is fine.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class Api:
    """The backend API: JSON in, JSON out, errors as ApiError."""

    def __init__(self, base, key):
        self.base = base.rstrip("/")
        self.key = key

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.key)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                return res.status, json.loads(res.read() or b"{}")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = {"code": "?", "message": text}
            raise ApiError(e.code, parsed) from None


def b64url(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def mint_jwt(secret, user, device, ttl_s=600, issuer=None, audience=None, now=None):
    """A compact HS256 JWS with the claims of contract section 4a."""
    now = int(time.time() if now is None else now)
    header = {"alg": "HS256", "typ": "JWT"}
    claims = {"sub": user, "device": device, "iat": now, "exp": now + int(ttl_s)}
    if issuer:
        claims["iss"] = issuer
    if audience:
        claims["aud"] = audience
    signing_input = b64url(json.dumps(header, separators=(",", ":")).encode()) + "." + \
        b64url(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64url(sig)


def read_secret(path):
    with open(path, "rb") as f:
        # The first line, as imserver reads --jwt-hs256-secret-file.
        secret = f.readline().rstrip(b"\r\n")
    if len(secret) < 32:
        sys.exit(f"{path}: an HS256 secret needs at least 32 bytes")
    return secret


def ensure_device(api, user, device):
    """The device's random token: a new device, or a new token for an existing one."""
    try:
        _, body = api.call("POST", f"/v1/users/{user}/devices", {"device": device})
    except ApiError as e:
        if e.status != 409:
            raise
        _, body = api.call("POST", f"/v1/devices/{device}/token")
    return body["token"]


def walkthrough(args):
    key = os.environ.get("IM_API_KEY", "")
    if not key:
        sys.exit("set IM_API_KEY to a backend API key (imserver admin apikey add NAME --scope write)")
    api = Api(args.api, key)
    for user in (args.user, args.bot):
        api.call("POST", "/v1/users", {"user": user})           # 201, or 200 if it existed
    token = ensure_device(api, args.user, args.device)
    api.call("POST", "/v1/conversations",                        # 201, or 200 if the same exists
             {"conv": args.conv, "kind": "direct", "members": [args.user, args.bot]})
    # The message key (cmid) makes a retry safe: the same request answers dup.
    _, sent = api.call("POST", f"/v1/conversations/{args.conv}/messages",
                       {"sender": args.bot, "cmid": args.cmid, "body": args.message})
    out = {"user": args.user, "device": args.device, "token": token, "conv": args.conv, "sent": sent}
    if args.jwt_secret_file:
        out["jwt"] = mint_jwt(read_secret(args.jwt_secret_file), args.user, args.device, args.jwt_ttl,
                              args.jwt_issuer, args.jwt_audience)
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("walkthrough", help="provision, post a message, mint a JWT")
    w.add_argument("--api", default="http://127.0.0.1:8081")
    w.add_argument("--user", required=True)
    w.add_argument("--device", required=True)
    w.add_argument("--bot", default="helpdesk")
    w.add_argument("--conv", required=True)
    w.add_argument("--cmid", default="welcome-1")
    w.add_argument("--message", default="Welcome! Ask us anything here.")
    m = sub.add_parser("mint-jwt", help="print a JWT for a user's device")
    m.add_argument("--user", required=True)
    m.add_argument("--device", required=True)
    for q in (w, m):
        q.add_argument("--jwt-secret-file", required=(q is m))
        q.add_argument("--jwt-ttl", type=int, default=600, help="seconds (keep it short; refresh instead)")
        q.add_argument("--jwt-issuer")
        q.add_argument("--jwt-audience")
    args = p.parse_args()
    try:
        if args.cmd == "walkthrough":
            walkthrough(args)
        else:
            print(mint_jwt(read_secret(args.jwt_secret_file), args.user, args.device, args.jwt_ttl,
                           args.jwt_issuer, args.jwt_audience))
    except ApiError as e:
        sys.exit(f"backend API: {e}")


if __name__ == "__main__":
    main()
