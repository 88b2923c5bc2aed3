#include "core/config.hpp"

#include "bus/nats_bus.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace im {

namespace {

enum : unsigned { for_gateway = 1, for_admin = 2, for_both = 3 };

struct Option {
    const char* flag;
    const char* env;       // nullptr: flag only
    const char* arg;       // nullptr: a switch
    const char* help;
    std::function<std::optional<std::string>(Config&, const std::string&)> set;
    // The effective value for --print-config ("" = unset); switches print
    // true/false. Missing: print-config shows the raw value that was set.
    std::function<std::string(const Config&)> get = {};
    unsigned scope = for_gateway;
    bool in_file = true;   // false: flag and environment only (--config)
};

std::optional<std::string> to_int(const std::string& s, int lo, int hi, int& out) {
    int v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
        return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'";
    out = v;
    return std::nullopt;
}

// Switch values: a bare flag means "1"; files and the environment spell it.
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
         "a database request (or LISTEN round trip) taking longer is cut: its connection is dropped and replaced, "
         "the request gets UNAVAILABLE (a hung database is noticed; default 5000)",
         [](Config& c, const std::string& v) { return to_int(v, 200, 600000, c.db_timeout_ms); },
         [](const Config& c) { return std::to_string(c.db_timeout_ms); }},
        {"--accept-backoff-ms", "IM_ACCEPT_BACKOFF_MS", "MS",
         "pause accepting this long after accept() fails for lack of descriptors or memory (EMFILE, ENFILE, "
         "ENOBUFS, ENOMEM); doubles up to 2000 while it keeps failing (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 2000, c.accept_backoff_ms); },
         [](const Config& c) { return std::to_string(c.accept_backoff_ms); }},
        {"--listen-probe-ms", "IM_LISTEN_PROBE_MS", "MS",
         "how often an idle notification listener checks its database session is alive (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 50, 3600000, c.listen_probe_ms); },
         [](const Config& c) { return std::to_string(c.listen_probe_ms); }},
        {"--bus", "IM_BUS", "postgres|nats://HOST:PORT",
         "notification bus between gateways: PostgreSQL LISTEN/NOTIFY (default) or NATS (comma-separated URLs "
         "of one NATS cluster); admin commands notify the gateways on it",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (v == "postgres") {
                 c.bus = v;
                 return std::nullopt;
             }
             // Split as the bus splits it (one URL per server of the list).
             for (const auto& url : NatsBus::servers(v)) {
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
             std::stringstream ss(v);
             std::string item;
             while (std::getline(ss, item, ','))
                 if (!item.empty()) c.faults.push_back(item);
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
    };
    return list;
}

unsigned scope_bit(ConfigScope s) { return s == ConfigScope::gateway ? for_gateway : for_admin; }

// The key in the configuration file: the flag without its dashes.
std::string key_of(const Option& o) { return std::string(o.flag).substr(2); }

const Option* find_flag(const std::string& name) {
    for (const auto& o : options())
        if (name == o.flag) return &o;
    return nullptr;
}

const Option* find_key(const std::string& key) {
    for (const auto& o : options())
        if (o.in_file && key == key_of(o)) return &o;
    return nullptr;
}

struct Setting {
    std::string value;
    std::string origin;
};

// Reads `key = value` lines. Unknown keys are
// errors (a typo must not pass silently).
std::optional<std::string> read_file(const std::string& path, std::map<const Option*, std::vector<Setting>>& out) {
    std::ifstream in(path);
    if (!in) return "cannot read configuration file " + path;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        // A '#' at the start or after a blank starts a comment.
        for (std::size_t h = line.find('#'); h != std::string::npos; h = line.find('#', h + 1))
            if (h == 0 || line[h - 1] == ' ' || line[h - 1] == '\t') {
                line.erase(h);
                break;
            }
        std::string t = trim(line);
        if (t.empty()) continue;
        auto eq = t.find('=');
        std::string where = path + ":" + std::to_string(n);
        if (eq == std::string::npos) return where + ": expected 'key = value'";
        std::string key = trim(t.substr(0, eq));
        const Option* o = find_key(key);
        if (!o) return where + ": unknown key '" + key + "'";
        out[o].push_back({trim(t.substr(eq + 1)), where});
    }
    return std::nullopt;
}

std::optional<std::string> read_secret(const std::string& path, std::string& out) {
    std::ifstream in(path);
    if (!in) return "cannot read " + path;
    std::string line;
    std::getline(in, line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return path + " is empty";
    out = line;
    return std::nullopt;
}

bool is_uri(const std::string& s) { return s.rfind("postgresql://", 0) == 0 || s.rfind("postgres://", 0) == 0; }

std::string percent_encode(const std::string& s) {
    static const char* hex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char ch : s) {
        if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') out += static_cast<char>(ch);
        else {
            out += '%';
            out += hex[ch >> 4];
            out += hex[ch & 15];
        }
    }
    return out;
}

std::string pad(const std::string& left, std::size_t width) {
    return left.size() < width ? left + std::string(width - left.size(), ' ') : left + "\n  " + std::string(width, ' ');
}

} // namespace

bool is_config_flag(const std::string& arg, ConfigScope scope, bool& takes_value) {
    const Option* o = find_flag(arg.substr(0, arg.find('=')));
    if (!o || !(o->scope & scope_bit(scope))) return false;
    takes_value = o->arg && arg.find('=') == std::string::npos;
    return true;
}

std::optional<std::string> parse_config(const std::vector<std::string>& args, Config& cfg, ConfigScope scope,
                                        ConfigAction& action) {
    action = ConfigAction::run;
    const unsigned bit = scope_bit(scope);
    std::map<const Option*, std::vector<Setting>> flags, file;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            action = ConfigAction::help;
            return std::nullopt;
        }
        if (a == "--print-config" && scope == ConfigScope::gateway) {
            action = ConfigAction::print_config;
            continue;
        }
        auto eq = a.find('=');
        const Option* o = find_flag(a.substr(0, eq));
        if (!o || !(o->scope & bit)) return "unknown option '" + a + "' (see --help)";
        std::string value;
        if (!o->arg) value = eq == std::string::npos ? "1" : a.substr(eq + 1);
        else if (eq != std::string::npos) value = a.substr(eq + 1);
        else if (i + 1 < args.size()) value = args[++i];
        else return std::string(o->flag) + " needs " + o->arg;
        flags[o].push_back({value, "flag"});
    }

    // Which file: --config, else IM_CONFIG (set but empty: none), else the
    // default one if it exists. A named file must exist.
    const Option* config_opt = find_flag("--config");
    std::string path;
    bool named = false;
    if (flags.count(config_opt)) path = flags[config_opt].back().value, named = true;
    else if (const char* v = std::getenv("IM_CONFIG")) path = v, named = true;
    else if (std::filesystem::exists(default_config_file)) path = default_config_file;
    if (!path.empty()) {
        if (auto e = read_file(path, file)) return e;
    }
    cfg.config_file = path;
    cfg.origin["config"] = named ? (flags.count(config_opt) ? "flag" : "env IM_CONFIG") : "default";

    for (const auto& o : options()) {
        if (!(o.scope & bit) || &o == config_opt) continue;
        std::vector<Setting> chosen;
        if (auto it = flags.find(&o); it != flags.end()) chosen = it->second;
        else if (const char* v = o.env ? std::getenv(o.env) : nullptr; v && *v) chosen = {{v, std::string("env ") + o.env}};
        else if (auto f = file.find(&o); f != file.end()) chosen = f->second;
        for (const auto& s : chosen) {
            if (auto e = o.set(cfg, s.value)) {
                std::string where = s.origin == "flag" ? std::string(o.flag) : s.origin;
                return where + ": " + *e;
            }
            cfg.origin[key_of(o)] = s.origin;
        }
    }

    if (!cfg.db_password_file.empty()) {
        if (!cfg.db_url) return "--db-password-file needs --db (the embedded cluster has no password)";
        if (auto e = read_secret(cfg.db_password_file, cfg.db_password)) return "--db-password-file: " + *e;
    }
    if (cfg.tls_cert.empty() != cfg.tls_key.empty()) return "--tls-cert and --tls-key go together";
    if (scope == ConfigScope::gateway && cfg.metrics_listen == "api" && cfg.api_listen.empty())
        return "--metrics-listen api needs the backend API (--api-listen is off)";
    if ((!cfg.jwt_issuer.empty() || !cfg.jwt_audience.empty()) && !cfg.jwt_enabled())
        return "--jwt-issuer and --jwt-audience need --jwt-hs256-secret-file or --jwt-jwks";
    if (!cfg.enable_faults && (!cfg.faults.empty() || cfg.lab.no_unique_index || cfg.lab.purge_without_tombstones ||
                                cfg.lab.no_resync))
        return "--fault and --lab-* need --enable-faults";
    return std::nullopt;
}

std::optional<std::string> parse_config(int argc, char** argv, Config& cfg, ConfigAction& action) {
    return parse_config(std::vector<std::string>(argv + 1, argv + argc), cfg, ConfigScope::gateway, action);
}

std::optional<std::string> db_conninfo(const Config& cfg) {
    if (!cfg.db_url || cfg.db_password.empty()) return cfg.db_url;
    const std::string& url = *cfg.db_url;
    if (is_uri(url)) return url + (url.find('?') == std::string::npos ? "?" : "&") + "password=" + percent_encode(cfg.db_password);
    std::string quoted;
    for (char ch : cfg.db_password) {
        if (ch == '\'' || ch == '\\') quoted += '\\';
        quoted += ch;
    }
    return url + " password='" + quoted + "'";
}

std::string mask_conninfo(const std::string& s) {
    std::string out = s;
    if (is_uri(out)) {
        // postgresql://user:PASSWORD@host...
        auto scheme = out.find("://") + 3;
        auto at = out.find('@', scheme);
        auto slash = out.find('/', scheme);
        if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
            auto colon = out.find(':', scheme);
            if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "****");
        }
    }
    // password=... as a keyword or a URL query parameter.
    for (std::size_t pos = 0; (pos = out.find("password", pos)) != std::string::npos;) {
        std::size_t p = pos + 8;
        while (p < out.size() && out[p] == ' ') ++p;
        bool starts_word = pos == 0 || out[pos - 1] == ' ' || out[pos - 1] == '?' || out[pos - 1] == '&';
        if (!starts_word || p >= out.size() || out[p] != '=') {
            pos = p;
            continue;
        }
        ++p;
        while (p < out.size() && out[p] == ' ') ++p;
        std::size_t end = p;
        if (end < out.size() && out[end] == '\'') {
            ++end;
            while (end < out.size() && out[end] != '\'') end += out[end] == '\\' ? 2 : 1;
            end = std::min(end + 1, out.size());
        } else {
            while (end < out.size() && out[end] != ' ' && out[end] != '&') ++end;
        }
        out.replace(p, end - p, "****");
        pos = p + 4;
    }
    return out;
}

std::string options_help(ConfigScope scope) {
    std::ostringstream o;
    for (const auto& opt : options()) {
        if (!(opt.scope & scope_bit(scope))) continue;
        o << "  " << pad(std::string(opt.flag) + (opt.arg ? std::string(" ") + opt.arg : ""), 30) << opt.help;
        if (opt.env) o << "  [" << opt.env << "]";
        o << '\n';
    }
    return o.str();
}

std::string config_help() {
    std::ostringstream o;
    o << "usage: imserver [OPTIONS]            run a gateway\n"
         "       imserver --print-config [OPTIONS]   show the effective configuration (secrets masked)\n"
         "       imserver admin [OPTIONS] COMMAND ...   (imserver admin --help)\n\n"
         "Options; each is also the environment variable shown and the key 'name = value'\n"
         "(the flag without '--') in the configuration file. A flag beats the environment,\n"
         "which beats the file:\n"
      << options_help(ConfigScope::gateway) << "  " << pad("--print-config", 30)
      << "print the effective configuration and exit\n"
      << "  " << pad("--help", 30) << "this text\n";
    return o.str();
}

std::string print_config(const Config& cfg) {
    std::ostringstream o;
    o << "# imserver: effective configuration (flag > environment > "
      << (cfg.config_file.empty() ? std::string("no file") : cfg.config_file) << " > default)\n";
    std::size_t width = 0;
    std::vector<std::pair<std::string, std::string>> lines;
    for (const auto& opt : options()) {
        if (!(opt.scope & for_gateway) || !opt.in_file) continue;
        std::string key = key_of(opt);
        std::string value = opt.get ? opt.get(cfg) : std::string();
        std::string line = value.empty() ? "# " + key + " =" : key + " = " + value;
        auto it = cfg.origin.find(key);
        width = std::max(width, line.size());
        lines.emplace_back(line, it == cfg.origin.end() ? "default" : it->second);
    }
    for (const auto& [line, origin] : lines) o << line << std::string(width + 2 - line.size(), ' ') << "# " << origin << '\n';
    if (!cfg.db_password.empty()) o << "# database password: **** (from " << cfg.db_password_file << ")\n";
    return o.str();
}

std::string roff_escape(const std::string& s) {
    std::string out;
    for (char ch : s) {
        if (ch == '\\') out += "\\e";
        else if (ch == '-') out += "\\-";
        else out += ch;
    }
    if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
    return out;
}

std::string options_man(ConfigScope scope) {
    std::ostringstream o;
    for (const auto& opt : options()) {
        if (!(opt.scope & scope_bit(scope))) continue;
        o << ".TP\n\\fB" << roff_escape(opt.flag) << "\\fR";
        if (opt.arg) o << " \\fI" << roff_escape(opt.arg) << "\\fR";
        o << '\n' << roff_escape(opt.help) << ".\n";
        if (opt.env) {
            o << "Environment: \\fB" << roff_escape(opt.env) << "\\fR";
            if (opt.in_file) o << "; file key: \\fB" << roff_escape(key_of(opt)) << "\\fR";
            o << ".\n";
        }
    }
    return o.str();
}

std::string config_man(const std::string& version) {
    std::ostringstream o;
    o << ".TH IMSERVER 8 \"\" \"imserver " << version << "\" \"System Administration\"\n"
      << ".SH NAME\nimserver \\- chat gateway of the im contract (WebSocket and HTTP)\n"
      << ".SH SYNOPSIS\n.B imserver\n[\\fIOPTIONS\\fR]\n.br\n.B imserver \\-\\-print\\-config\n[\\fIOPTIONS\\fR]\n"
      << ".br\n.B imserver admin\n[\\fIOPTIONS\\fR] \\fICOMMAND\\fR ...\n"
      << ".SH DESCRIPTION\n"
         "\\fBimserver\\fR serves the chat contract over WebSocket (\\fB/v1/ws\\fR) and HTTP "
         "(\\fB/healthz\\fR, \\fB/readyz\\fR, \\fB/metrics\\fR), storing everything in PostgreSQL: "
         "the server given with \\fB\\-\\-db\\fR or an embedded cluster in the state directory. "
         "Migrations are applied at start. Any number of gateways may share one database.\n"
      << ".PP\nEvery option is a flag, an environment variable and a key of the configuration file. "
         "A flag beats the environment, which beats the file, which beats the default.\n"
      << ".SH OPTIONS\n"
      << options_man(ConfigScope::gateway)
      << ".TP\n\\fB\\-\\-print\\-config\\fR\nPrint the effective configuration in the file's format, each value "
         "with its origin, secrets masked, and exit.\n"
      << ".TP\n\\fB\\-\\-help\\fR\nPrint the options and exit.\n"
      << ".SH CONFIGURATION FILE\n"
         "Lines \\fIkey\\fR = \\fIvalue\\fR, where \\fIkey\\fR is the flag without its leading dashes; "
         "a # at the start of a line or after a blank starts a comment; switches take true or false; a repeatable "
         "option takes a comma-separated list. An unknown key is an error. "
         "Secrets are not written in the file: \\fBdb\\-password\\-file\\fR names a file holding the "
         "database password.\n"
      << ".SH SIGNALS\n.TP\n\\fBSIGTERM\\fR, \\fBSIGINT\\fR\nDrain: tell clients to go (goaway), finish "
         "requests in flight for up to \\fB\\-\\-drain\\-timeout\\-ms\\fR, exit 0.\n"
      << ".TP\n\\fBSIGHUP\\fR\nRe-read the TLS certificate and key: new connections use them, open ones keep "
         "theirs. Re-read the JWT keys (\\fB\\-\\-jwt\\-hs256\\-secret\\-file\\fR, \\fB\\-\\-jwt\\-jwks\\fR): "
         "tokens are checked with the new keys from then on, also at refresh. If a file is unusable the old "
         "certificate or keys stay and an error is logged.\n"
      << ".SH FILES\n.TP\n\\fI" << roff_escape(default_config_file) << "\\fR\nThe configuration file.\n"
      << ".TP\n\\fI/var/lib/imserver\\fR\nState directory of the packaged service (embedded PostgreSQL).\n"
      << ".SH EXIT STATUS\n0 after a drain, 1 on a fatal error, 2 on bad usage.\n"
      << ".SH SEE ALSO\n\\fBimserver\\-admin\\fR(8), \\fBsystemctl\\fR(1), /usr/share/doc/imserver/operations.md\n";
    return o.str();
}

std::size_t effective_db_queue(const Config& c) {
    if (c.db_queue) return c.db_queue;
    return std::max<std::size_t>(1024, static_cast<std::size_t>(c.max_connections));
}

int effective_send_workers(const Config& c) {
    int n = c.send_workers;
    // auto: half the cores, at least 1. On the 2-core machine that also runs
    // PostgreSQL one send worker made larger groups and spent less database
    // CPU per send at every load (docs/benchmarks.md, "One send worker
    // against two").
    if (n == 0) n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
    return std::max(1, std::min(n, c.db_pool));
}

} // namespace im
