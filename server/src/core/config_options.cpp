// The option table: every option's flag, environment variable, file key,
// help text, check and effective value. One row per option; what the rows
// share is in config_option.hpp.
#include "core/config_option.hpp"
#include "core/strings.hpp"

#include <charconv>

namespace im::config_detail {

std::optional<std::string> to_int(const std::string& s, int lo, int hi, int& out) {
    int v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
        return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'";
    out = v;
    return std::nullopt;
}

std::optional<std::string> to_bool(const std::string& v, bool& out) {
    if (v == "1" || v == "true" || v == "yes" || v == "on") out = true;
    else if (v == "0" || v == "false" || v == "no" || v == "off") out = false;
    else return "expected true or false, got '" + v + "'";
    return std::nullopt;
}

std::string yes_no(bool b) { return b ? "true" : "false"; }

std::string trim(const std::string& s) {
    auto b = s.find_first_not_of(" \t\r");
    if (b == std::string::npos) return {};
    auto e = s.find_last_not_of(" \t\r");
    return s.substr(b, e - b + 1);
}

std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
    return out;
}

const std::vector<Option>& options() {
    static const std::vector<Option> list = {
        {"--config", "IM_CONFIG", "FILE",
         "configuration file (default /etc/imserver/imserver.conf if it exists; '' reads none)",
         [](Config&, const std::string&) -> std::optional<std::string> { return std::nullopt; },
         [](const Config& c) { return c.config_file; }, for_both, false},
        {"--listen", "IM_LISTEN", "HOST:PORT", "address for WebSocket and HTTP (default 127.0.0.1:8080; port 0 picks one)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             auto colon = v.rfind(':');
             if (colon == std::string::npos) return "expected HOST:PORT";
             int port = 0;
             if (auto e = to_int(v.substr(colon + 1), 0, 65535, port)) return e;
             c.listen_host = v.substr(0, colon);
             c.listen_port = static_cast<unsigned short>(port);
             return std::nullopt;
         },
         [](const Config& c) { return c.listen_host + ":" + std::to_string(c.listen_port); }},
        {"--api-listen", "IM_API_LISTEN", "HOST:PORT",
         "address of the backend API (HTTP + JSON, bearer API keys; TLS with --tls-cert/--tls-key); default "
         "127.0.0.1:8081, port 0 picks one, '' turns it off",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v.empty()) {
                 c.api_listen.clear();
                 return std::nullopt;
             }
             auto colon = v.rfind(':');
             int port = 0;
             if (colon == std::string::npos || colon == 0) return "expected HOST:PORT or ''";
             if (auto e = to_int(v.substr(colon + 1), 0, 65535, port)) return e;
             c.api_listen = v;
             return std::nullopt;
         },
         [](const Config& c) { return c.api_listen; }},
        {"--api-ready-file", "IM_API_READY_FILE", "PATH", "write the backend API's listening port here once ready",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             c.api_ready_file = v;
             return std::nullopt;
         },
         [](const Config& c) { return c.api_ready_file; }},
        {"--api-auth-failures", "IM_API_AUTH_FAILURES", "N",
         "failed backend API authentications allowed per client address per minute; beyond, 429 RATE_LIMITED "
         "until the minute is over (default 10)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.api_auth_failures); },
         [](const Config& c) { return std::to_string(c.api_auth_failures); }},
        {"--api-auth-failures-exempt", "IM_API_AUTH_FAILURES_EXEMPT", "loopback|none",
         "callers not counted by --api-auth-failures: loopback (the default: a caller on this host gets 401 however "
         "often it fails) or none",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v == "loopback") c.api_auth_failures_loopback = false;
             else if (v == "none") c.api_auth_failures_loopback = true;
             else return "expected loopback or none, got '" + v + "'";
             return std::nullopt;
         },
         [](const Config& c) { return std::string(c.api_auth_failures_loopback ? "none" : "loopback"); }},
        {"--db", "IM_DB", "URL", "PostgreSQL connection (URL or key=value); default: the embedded cluster",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.db_url = v; return std::nullopt; },
         [](const Config& c) { return c.db_url ? mask_conninfo(*c.db_url) : std::string(); }, for_both},
        {"--db-password-file", "IM_DB_PASSWORD_FILE", "FILE",
         "read the database password from FILE (first line), so it is on no command line and in no file "
         "of the configuration; libpq's PGPASSWORD and PGPASSFILE work too",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             c.db_password_file = v;
             return std::nullopt;
         },
         [](const Config& c) { return c.db_password_file; }, for_both},
        {"--tls-cert", "IM_TLS_CERT", "FILE",
         "serve wss:// and https:// with this PEM certificate (chain allowed; needs --tls-key; reloaded on SIGHUP)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.tls_cert = v; return std::nullopt; },
         [](const Config& c) { return c.tls_cert; }},
        {"--tls-key", "IM_TLS_KEY", "FILE", "the PEM private key of --tls-cert (reloaded on SIGHUP)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.tls_key = v; return std::nullopt; },
         [](const Config& c) { return c.tls_key; }},
        {"--jwt-hs256-secret-file", "IM_JWT_HS256_SECRET_FILE", "FILE",
         "accept JWTs signed with HS256 by this shared secret (the file's first line, at least 32 bytes) as "
         "hello tokens (reloaded on SIGHUP)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             c.jwt_hs256_secret_file = v;
             return std::nullopt;
         },
         [](const Config& c) { return c.jwt_hs256_secret_file; }},
        {"--jwt-jwks", "IM_JWT_JWKS", "FILE",
         "accept JWTs signed with RS256 or ES256 by the public keys of this JWKS file, selected by kid "
         "(reloaded on SIGHUP)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.jwt_jwks = v; return std::nullopt; },
         [](const Config& c) { return c.jwt_jwks; }},
        {"--jwt-issuer", "IM_JWT_ISSUER", "ISS", "a JWT's iss claim must equal this (default: not checked)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.jwt_issuer = v; return std::nullopt; },
         [](const Config& c) { return c.jwt_issuer; }},
        {"--jwt-audience", "IM_JWT_AUDIENCE", "AUD", "a JWT's aud claim must contain this (default: not checked)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.jwt_audience = v; return std::nullopt; },
         [](const Config& c) { return c.jwt_audience; }},
        {"--state-dir", "IM_STATE_DIR", "DIR", "folder of the embedded PostgreSQL and demo tokens (default ./var)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.state_dir = v; return std::nullopt; },
         [](const Config& c) { return c.state_dir; }, for_both},
        {"--gateway-id", "IM_GATEWAY_ID", "ID", "this gateway's name in welcome frames and logs (default gw-1)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.gateway_id = v; return std::nullopt; },
         [](const Config& c) { return c.gateway_id; }},
        {"--db-pool", "IM_DB_POOL", "N", "database worker threads/connections (default 4)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 256, c.db_pool); },
         [](const Config& c) { return std::to_string(c.db_pool); }},
        {"--db-queue", "IM_DB_QUEUE", "N|auto",
         "requests waiting for a worker before UNAVAILABLE (default auto: --max-connections, at least 1024; a "
         "connection has at most one request waiting, so a reconnect wave of every connection at once waits "
         "instead of being refused and retried)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v == "auto") {
                 c.db_queue = 0;
                 return std::nullopt;
             }
             int n = 0;
             if (auto e = to_int(v, 1, 1000000, n)) return e;
             c.db_queue = static_cast<std::size_t>(n);
             return std::nullopt;
         },
         [](const Config& c) { return c.db_queue == 0 ? std::string("auto") : std::to_string(c.db_queue); }},
        {"--send-group-max", "IM_SEND_GROUP_MAX", "N",
         "group commit: at most this many connections' runs of sends in one database statement and commit, when "
         "sends queue for a busy worker (default 32; 1: every run commits alone)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 256, c.send_group_max); },
         [](const Config& c) { return std::to_string(c.send_group_max); }},
        {"--send-workers", "IM_SEND_WORKERS", "N|auto",
         "database workers that may run sends at once; the others stay free for reads, and under load the "
         "sends queue into larger group commits (default auto: half the CPU cores, at least 1, at most --db-pool)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v == "auto") {
                 c.send_workers = 0;
                 return std::nullopt;
             }
             return to_int(v, 1, 256, c.send_workers);
         },
         [](const Config& c) { return c.send_workers == 0 ? std::string("auto") : std::to_string(c.send_workers); }},
        {"--send-linger-us", "IM_SEND_LINGER_US", "N",
         "group commit under load: after a group of several runs, a send worker waits up to N microseconds for "
         "as many runs as that group had plus those already queued before it starts the next statement, so the "
         "senders it just answered join the next group instead of forming a group of their own: less database "
         "CPU per send for a few milliseconds more latency under moderate load (default 0: never wait; a lone run "
         "never waits)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 1000000, c.send_linger_us); },
         [](const Config& c) { return std::to_string(c.send_linger_us); }},
        {"--io-threads", "IM_IO_THREADS", "N", "network I/O threads (default 2)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 64, c.io_threads); },
         [](const Config& c) { return std::to_string(c.io_threads); }},
        {"--ready-file", "IM_READY_FILE", "PATH", "write the listening port here once ready",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.ready_file = v; return std::nullopt; },
         [](const Config& c) { return c.ready_file; }},
        {"--drain-timeout-ms", "IM_DRAIN_TIMEOUT_MS", "MS", "SIGTERM: longest wait for in-flight requests (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 600000, c.drain_timeout_ms); },
         [](const Config& c) { return std::to_string(c.drain_timeout_ms); }},
        {"--ping-interval-ms", "IM_PING_INTERVAL_MS", "MS", "WebSocket ping period (default 20000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 600000, c.ping_interval_ms); },
         [](const Config& c) { return std::to_string(c.ping_interval_ms); }},
        {"--idle-timeout-ms", "IM_IDLE_TIMEOUT_MS", "MS", "close a connection silent this long (default 60000)",
         [](Config& c, const std::string& v) { return to_int(v, 200, 3600000, c.idle_timeout_ms); },
         [](const Config& c) { return std::to_string(c.idle_timeout_ms); }},
        {"--hello-timeout-ms", "IM_HELLO_TIMEOUT_MS", "MS",
         "close (1008) a connection that has not sent hello this long after the upgrade (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 600000, c.hello_timeout_ms); },
         [](const Config& c) { return std::to_string(c.hello_timeout_ms); }},
        {"--max-unsent-bytes", "IM_MAX_UNSENT_BYTES", "BYTES",
         "close (1013) a connection whose unsent output passes this; its request reading pauses at half "
         "(default 4194304)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             int n = 0;
             if (auto e = to_int(v, 131072, 1 << 30, n)) return e;
             c.max_unsent_bytes = static_cast<std::size_t>(n);
             return std::nullopt;
         },
         [](const Config& c) { return std::to_string(c.max_unsent_bytes); }},
        {"--write-timeout-ms", "IM_WRITE_TIMEOUT_MS", "MS",
         "drop a connection when one frame write has not completed this long (default 30000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 600000, c.write_timeout_ms); },
         [](const Config& c) { return std::to_string(c.write_timeout_ms); }},
        {"--max-connections", "IM_MAX_CONNECTIONS", "N",
         "WebSocket connections this gateway serves; more are closed with 1013 (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.max_connections); },
         [](const Config& c) { return std::to_string(c.max_connections); }},
        {"--max-connections-per-address", "IM_MAX_CONNECTIONS_PER_ADDRESS", "N",
         "WebSocket connections from one client IP address; more are closed with 1013 (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.max_connections_per_address); },
         [](const Config& c) { return std::to_string(c.max_connections_per_address); }},
        {"--max-buffered-bytes", "IM_MAX_BUFFERED_BYTES", "BYTES",
         "process-wide budget for the queued requests and unsent output of all WebSocket connections: at it, "
         "connections stop reading and the biggest holders are closed with 1013 until the rest hold at most "
         "three quarters of it (default 1073741824; 0 turns it off)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             long long n = 0;
             auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
             if (ec != std::errc() || p != v.data() + v.size() || (n != 0 && n < (1 << 20)) || n > (1LL << 40))
                 return "expected 0 or a byte count in [1048576, 1099511627776], got '" + v + "'";
             c.max_buffered_bytes = static_cast<std::size_t>(n);
             return std::nullopt;
         },
         [](const Config& c) { return std::to_string(c.max_buffered_bytes); }},
        {"--max-attachment-bytes", "IM_MAX_ATTACHMENT_BYTES", "BYTES",
         "largest attachment an upload may declare (POST /v1/uploads); larger ones are answered 413 TOO_LARGE "
         "(default 104857600)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             long long n = 0;
             auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
             if (ec != std::errc() || p != v.data() + v.size() || n < 1 || n > (1LL << 40))
                 return "expected a byte count in [1, 1099511627776], got '" + v + "'";
             c.max_attachment_bytes = n;
             return std::nullopt;
         },
         [](const Config& c) { return std::to_string(c.max_attachment_bytes); }},
        {"--attachments-dir", "IM_ATTACHMENTS_DIR", "DIR",
         "keep the bytes of attachments in this directory, shared by every gateway (a file per upload, written to "
         "a temporary name, fsynced and renamed); empty (the default): in PostgreSQL, table upload_chunks",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.attachments_dir = v; return std::nullopt; },
         [](const Config& c) { return c.attachments_dir; }},
        {"--attachments-gc-after-ms", "IM_ATTACHMENTS_GC_AFTER_MS", "MS",
         "incomplete uploads not written to for this long, and complete ones no message references this long after "
         "they completed, are removed with their bytes (default 86400000: 24 h)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             long long n = 0;
             auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
             if (ec != std::errc() || p != v.data() + v.size() || n < 0 || n > (1LL << 45))
                 return "expected milliseconds in [0, 35184372088832], got '" + v + "'";
             c.attachments_gc_after_ms = n;
             return std::nullopt;
         },
         [](const Config& c) { return std::to_string(c.attachments_gc_after_ms); }},
        {"--attachment-db-pool", "IM_ATTACHMENT_DB_POOL", "N",
         "database workers/connections of the attachment routes' own (upload pieces, downloads and their checks), "
         "so file transfers neither wait for nor hold the --db-pool workers of sends and reads (default 2; 0: "
         "they share --db-pool)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 64, c.attachment_db_pool); },
         [](const Config& c) { return std::to_string(c.attachment_db_pool); }},
        {"--attachment-nice", "IM_ATTACHMENT_NICE", "N",
         "CPU priority of file transfers below the send path's: the --attachment-db-pool workers run at this nice "
         "value, and so do their PostgreSQL backends when they run on this host (a Unix socket connection, e.g. the "
         "embedded cluster) (0-19; default 0: "
         "the same priority)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 19, c.attachment_nice); },
         [](const Config& c) { return std::to_string(c.attachment_nice); }},
        {"--attachments-gc-interval-ms", "IM_ATTACHMENTS_GC_INTERVAL_MS", "MS",
         "how often this gateway runs the attachment collector (default 600000; 0: never, another gateway does)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 86400000, c.attachments_gc_interval_ms); },
         [](const Config& c) { return std::to_string(c.attachments_gc_interval_ms); }},
        {"--max-http-connections", "IM_MAX_HTTP_CONNECTIONS", "N",
         "accepted connections on --listen that have not (yet) upgraded to WebSocket (health checks, scrapes, "
         "handshakes in progress); more are closed at once (default 2048)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.max_http_connections); },
         [](const Config& c) { return std::to_string(c.max_http_connections); }},
        {"--hello-failures", "IM_HELLO_FAILURES", "N",
         "failed hellos (UNAUTHENTICATED) allowed per client address per minute; beyond, hellos from it are "
         "answered UNAVAILABLE and closed with 1013 until the minute is over, without a database check (default 30)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.hello_failures); },
         [](const Config& c) { return std::to_string(c.hello_failures); }},
        {"--hello-failures-exempt", "IM_HELLO_FAILURES_EXEMPT", "loopback|none",
         "clients not counted by --hello-failures: loopback (the default: behind a proxy on this host every client "
         "has its address, so the proxy must limit them) or none",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v == "loopback") c.hello_failures_loopback = false;
             else if (v == "none") c.hello_failures_loopback = true;
             else return "expected loopback or none, got '" + v + "'";
             return std::nullopt;
         },
         [](const Config& c) { return std::string(c.hello_failures_loopback ? "none" : "loopback"); }},
        {"--send-rate", "IM_SEND_RATE", "N",
         "sends, edits and reactions allowed per user per second, a token bucket per gateway; beyond, "
         "RATE_LIMITED with retry_ms, nothing written (default 20; 0: unlimited)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 1000000, c.send_rate); },
         [](const Config& c) { return std::to_string(c.send_rate); }},
        {"--send-burst", "IM_SEND_BURST", "N",
         "the size of --send-rate's bucket: writes a user may make at once after a quiet spell (default 60)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.send_burst); },
         [](const Config& c) { return std::to_string(c.send_burst); }},
        {"--trusted-proxies", "IM_TRUSTED_PROXIES", "CIDR,...",
         "load balancers whose word on the client's address is taken: from these peers a PROXY protocol v2 header "
         "(HAProxy send-proxy-v2) and X-Forwarded-For give the address every per-address limit counts; from any "
         "other peer both are ignored (default none)",
         [](Config& c, const std::string& v) { return parse_cidr_list(v, c.trusted_proxies); },
         [](const Config& c) {
             std::vector<std::string> v;
             for (const auto& n : c.trusted_proxies) v.push_back(to_string(n));
             return join(v);
         }},
        {"--metrics-listen", "IM_METRICS_LISTEN", "public|api|HOST:PORT",
         "where GET /metrics is served: on --listen (public, the default), on the backend API's listener (api), "
         "or on a listener of its own (HOST:PORT); elsewhere it is 404",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v != "public" && v != "api") {
                 auto colon = v.rfind(':');
                 int port = 0;
                 if (colon == std::string::npos || colon == 0 || to_int(v.substr(colon + 1), 0, 65535, port))
                     return "expected public, api or HOST:PORT, got '" + v + "'";
             }
             c.metrics_listen = v;
             return std::nullopt;
         },
         [](const Config& c) { return c.metrics_listen; }},
        {"--db-timeout-ms", "IM_DB_TIMEOUT_MS", "MS",
         "a database round trip (one statement; or a LISTEN probe) without an answer for longer is cut: its connection "
         "is dropped and replaced, the request gets UNAVAILABLE (a hung database is noticed; a request of many "
         "statements is not bounded as a whole; default 5000)",
         [](Config& c, const std::string& v) { return to_int(v, 200, 600000, c.db_timeout_ms); },
         [](const Config& c) { return std::to_string(c.db_timeout_ms); }},
        {"--fanout-cache-members", "IM_FANOUT_CACHE_MEMBERS", "N",
         "membership periods the push fan-out keeps cached, over all conversations; beyond, the least recently "
         "pushed conversations are dropped and read again when next needed (default 200000)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 100000000, c.fanout_cache_members); },
         [](const Config& c) { return std::to_string(c.fanout_cache_members); }},
        {"--accept-backoff-ms", "IM_ACCEPT_BACKOFF_MS", "MS",
         "pause accepting this long after accept() fails for lack of descriptors or memory (EMFILE, ENFILE, "
         "ENOBUFS, ENOMEM); doubles up to 2000 while it keeps failing (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 2000, c.accept_backoff_ms); },
         [](const Config& c) { return std::to_string(c.accept_backoff_ms); }},
        {"--listen-probe-ms", "IM_LISTEN_PROBE_MS", "MS",
         "how often an idle notification listener checks its database session is alive (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 50, 3600000, c.listen_probe_ms); },
         [](const Config& c) { return std::to_string(c.listen_probe_ms); }},
        {"--webhook-workers", "IM_WEBHOOK_WORKERS", "N",
         "threads of this gateway that deliver webhooks, each with its own database session; 0: this gateway "
         "delivers none (the others do) (default 2)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 64, c.webhook_workers); },
         [](const Config& c) { return std::to_string(c.webhook_workers); }},
        {"--webhook-poll-ms", "IM_WEBHOOK_POLL_MS", "MS",
         "an idle webhook worker looks for newly committed events this often (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 10, 60000, c.webhook_poll_ms); },
         [](const Config& c) { return std::to_string(c.webhook_poll_ms); }},
        {"--webhook-refresh-ms", "IM_WEBHOOK_REFRESH_MS", "MS",
         "webhook workers re-read the registered webhooks and the backlog gauges this often (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 50, 600000, c.webhook_refresh_ms); },
         [](const Config& c) { return std::to_string(c.webhook_refresh_ms); }},
        {"--webhook-lease-ms", "IM_WEBHOOK_LEASE_MS", "MS",
         "a webhook batch's lease: a gateway killed mid-delivery holds its conversations this long, then another "
         "delivers them again; keep it above --webhook-timeout-ms (default 30000)",
         [](Config& c, const std::string& v) { return to_int(v, 500, 3600000, c.webhook_lease_ms); },
         [](const Config& c) { return std::to_string(c.webhook_lease_ms); }},
        {"--webhook-timeout-ms", "IM_WEBHOOK_TIMEOUT_MS", "MS",
         "one webhook POST, resolve to answer; later is a failure, retried (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 120000, c.webhook_timeout_ms); },
         [](const Config& c) { return std::to_string(c.webhook_timeout_ms); }},
        {"--webhook-retry-max-ms", "IM_WEBHOOK_RETRY_MAX_MS", "MS",
         "the ceiling of a failing webhook batch's backoff (1 s doubling, +-20 % jitter) (default 600000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 3600000, c.webhook_retry_max_ms); },
         [](const Config& c) { return std::to_string(c.webhook_retry_max_ms); }},
        {"--webhook-batch", "IM_WEBHOOK_BATCH", "N",
         "events in one webhook POST at most; a worker's claim takes conversations, longest-waiting first, until "
         "their undelivered events fill it (so at most N conversations) (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 10000, c.webhook_batch); },
         [](const Config& c) { return std::to_string(c.webhook_batch); }},
        {"--webhook-fill-events", "IM_WEBHOOK_FILL_EVENTS", "N",
         "a webhook worker's round that read fewer events than this from a claim that was not full is followed "
         "by a wait of --webhook-fill-ms, so the next POST carries more (default 50; 0: never waits)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 10000, c.webhook_fill_events); },
         [](const Config& c) { return std::to_string(c.webhook_fill_events); }},
        {"--webhook-fill-ms", "IM_WEBHOOK_FILL_MS", "MS",
         "the wait after a small round (--webhook-fill-events), at most --webhook-poll-ms (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 60000, c.webhook_fill_ms); },
         [](const Config& c) { return std::to_string(c.webhook_fill_ms); }},
        {"--webhook-linger-ms", "IM_WEBHOOK_LINGER_MS", "MS",
         "a conversation whose webhook events were delivered up to its head is not claimed again for this long, "
         "so its next batch carries that time's events; adds at most this to a delivery's lag (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 60000, c.webhook_linger_ms); },
         [](const Config& c) { return std::to_string(c.webhook_linger_ms); }},
        {"--webhook-pause-max-ms", "IM_WEBHOOK_PAUSE_MAX_MS", "MS",
         "after a failed POST a worker leaves that webhook alone (no claim, no read) for 250 ms doubling up to "
         "this (and at most --webhook-retry-max-ms) while it keeps failing (default 5000)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 3600000, c.webhook_pause_max_ms); },
         [](const Config& c) { return std::to_string(c.webhook_pause_max_ms); }},
        {"--webhook-sweep-ms", "IM_WEBHOOK_SWEEP_MS", "MS",
         "a webhook worker's claims read only the cursors of the conversations the bus announced as moved; every "
         "cursor is looked at once this often per gateway (what no announcement named: a lost bus message, a "
         "retry whose time came, a dead gateway's lease) (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 50, 600000, c.webhook_sweep_ms); },
         [](const Config& c) { return std::to_string(c.webhook_sweep_ms); }},
        {"--webhook-give-up-ms", "IM_WEBHOOK_GIVE_UP_MS", "MS",
         "a webhook batch failing for this long is marked failed (listed, replayable) and the conversation's "
         "later events go on (default 259200000: 72 h)",
         [](Config& c, const std::string& v) {
             int ms = 0;
             auto e = to_int(v, 0, 2000000000, ms);
             if (!e) c.webhook_give_up_ms = ms;
             return e;
         },
         [](const Config& c) { return std::to_string(c.webhook_give_up_ms); }},
        {"--webhook-insecure-tls", "IM_WEBHOOK_INSECURE_TLS", "on|off",
         "tests only: no certificate check on https:// webhook receivers (default off)",
         [](Config& c, const std::string& v) { return to_bool(v, c.webhook_insecure_tls); },
         [](const Config& c) { return std::string(c.webhook_insecure_tls ? "on" : "off"); }},
        {"--presence-lease-ms", "IM_PRESENCE_LEASE_MS", "MS",
         "presence lease of this gateway, renewed every third of it; a gateway that renewed nothing for this long "
         "(killed, cut off) is swept by the others and its users go offline. A dead gateway's users are offline "
         "within 4/3 of it (default 30000: 40 s, inside contract 13's 60 s)",
         [](Config& c, const std::string& v) { return to_int(v, 300, 45000, c.presence_lease_ms); },
         [](const Config& c) { return std::to_string(c.presence_lease_ms); }},
        {"--bus", "IM_BUS", "postgres|nats://HOST:PORT",
         "notification bus between gateways: PostgreSQL LISTEN/NOTIFY (default) or NATS (comma-separated URLs "
         "of one NATS cluster); admin commands notify the gateways on it",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v == "postgres") {
                 c.bus = v;
                 return std::nullopt;
             }
             // Split as the bus splits it (one URL per server of the list).
             for (const auto& url : nats_servers(v)) {
                 const std::string scheme = "nats://";
                 auto colon = url.rfind(':');
                 int port = 0;
                 if (url.rfind(scheme, 0) != 0 || colon == std::string::npos || colon < scheme.size() + 1 ||
                     to_int(url.substr(colon + 1), 1, 65535, port))
                     return "expected 'postgres' or nats://HOST:PORT[,nats://HOST:PORT...], got '" + v + "'";
             }
             c.bus = v;
             return std::nullopt;
         },
         [](const Config& c) { return c.bus; }, for_both},
        {"--notify-in-commit", "IM_NOTIFY_IN_COMMIT", "on|off",
         "with --bus postgres: a send's NOTIFY goes inside its own transaction, so its reply waits for one commit "
         "(default on); off: the bus's own session publishes after COMMIT, as the NATS bus does, and notifying "
         "commits no longer queue one after another (PostgreSQL serialises them)",
         [](Config& c, const std::string& v) { return to_bool(v, c.notify_in_commit); },
         [](const Config& c) { return std::string(c.notify_in_commit ? "on" : "off"); }},
        {"--quiet", "IM_QUIET", nullptr, "log warnings and errors only",
         [](Config& c, const std::string& v) { return to_bool(v, c.quiet); },
         [](const Config& c) { return yes_no(c.quiet); }},
        {"--enable-faults", "IM_ENABLE_FAULTS", nullptr, "LAB ONLY: allow fault injection (--fault, POST /lab/fault)",
         [](Config& c, const std::string& v) { return to_bool(v, c.enable_faults); },
         [](const Config& c) { return yes_no(c.enable_faults); }, for_both},
        {"--fault", "IM_FAULTS", "POINT=ACTION[:COUNT]",
         "LAB ONLY: arm a fault point (repeatable; env: comma-separated). Points: store.*, api.*, notify.* "
         "(actions crash, drop_reply, unavailable, delay:MS) and the rule.* negative controls (action skip); "
         "the list is in docs/acceptance.md",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             for (auto& item : split_commas(v)) c.faults.push_back(std::move(item));
             return std::nullopt;
         },
         [](const Config& c) { return join(c.faults); }, for_both},
        {"--lab-no-unique-index", "IM_LAB_NO_UNIQUE_INDEX", nullptr,
         "LAB ONLY negative control: drop events_idempotency and check-then-insert without the row lock, and let "
         "one conversation's sends run in several send workers at once",
         [](Config& c, const std::string& v) { return to_bool(v, c.lab.no_unique_index); },
         [](const Config& c) { return yes_no(c.lab.no_unique_index); }},
        {"--lab-no-resync", "IM_LAB_NO_RESYNC", nullptr,
         "LAB ONLY negative control: after a lost LISTEN session, push no `resync` to subscribers",
         [](Config& c, const std::string& v) { return to_bool(v, c.lab.no_resync); },
         [](const Config& c) { return yes_no(c.lab.no_resync); }},
        {"--lab-purge-without-tombstones", "IM_LAB_PURGE_WITHOUT_TOMBSTONES", nullptr,
         "LAB ONLY negative control: retention purge writes no tombstones",
         [](Config& c, const std::string& v) { return to_bool(v, c.lab.purge_without_tombstones); },
         [](const Config& c) { return yes_no(c.lab.purge_without_tombstones); }, for_both},
        {"--lab-erase-without-tombstones", "IM_LAB_ERASE_WITHOUT_TOMBSTONES", nullptr,
         "LAB ONLY negative control: a user's erase keeps no tombstones of their request keys",
         [](Config& c, const std::string& v) { return to_bool(v, c.lab.erase_without_tombstones); },
         [](const Config& c) { return yes_no(c.lab.erase_without_tombstones); }, for_both},
    };
    return list;
}

unsigned scope_bit(ConfigScope s) { return s == ConfigScope::gateway ? for_gateway : for_admin; }

std::string key_of(const Option& o) { return std::string(o.flag).substr(2); }

} // namespace im::config_detail
