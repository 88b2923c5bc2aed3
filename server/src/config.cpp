#include "config.hpp"

#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

namespace im {

namespace {

struct Option {
    const char* flag;
    const char* env;       // nullptr: flag only
    const char* arg;       // nullptr: a switch
    const char* help;
    std::function<std::optional<std::string>(Config&, const std::string&)> set;
};

std::optional<std::string> to_int(const std::string& s, int lo, int hi, int& out) {
    int v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
        return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'";
    out = v;
    return std::nullopt;
}

bool truthy(const std::string& v) { return v == "1" || v == "true" || v == "yes" || v == "on"; }

const std::vector<Option>& options() {
    static const std::vector<Option> list = {
        {"--listen", "IM_LISTEN", "HOST:PORT", "address for WebSocket and HTTP (default 127.0.0.1:8080; port 0 picks one)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             auto colon = v.rfind(':');
             if (colon == std::string::npos) return "expected HOST:PORT";
             int port = 0;
             if (auto e = to_int(v.substr(colon + 1), 0, 65535, port)) return e;
             c.listen_host = v.substr(0, colon);
             c.listen_port = static_cast<unsigned short>(port);
             return std::nullopt;
         }},
        {"--db", "IM_DB", "URL", "PostgreSQL connection (URL or key=value); default: the embedded cluster",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.db_url = v; return std::nullopt; }},
        {"--db-password-file", "IM_DB_PASSWORD_FILE", "PATH",
         "read the database password from this file (first line) instead of the URL; libpq's PGPASSWORD and "
         "PGPASSFILE work too",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             c.db_password_file = v;
             return std::nullopt;
         }},
        {"--state-dir", "IM_STATE_DIR", "DIR", "folder of the embedded PostgreSQL and demo tokens (default ./var)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.state_dir = v; return std::nullopt; }},
        {"--gateway-id", "IM_GATEWAY_ID", "ID", "this gateway's name in welcome frames and logs (default gw-1)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.gateway_id = v; return std::nullopt; }},
        {"--db-pool", "IM_DB_POOL", "N", "database worker threads/connections (default 4)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 256, c.db_pool); }},
        {"--db-queue", "IM_DB_QUEUE", "N", "requests waiting for a worker before UNAVAILABLE (default 1024)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             int n = 0;
             if (auto e = to_int(v, 1, 1000000, n)) return e;
             c.db_queue = static_cast<std::size_t>(n);
             return std::nullopt;
         }},
        {"--send-group-max", "IM_SEND_GROUP_MAX", "N",
         "group commit: at most this many connections' runs of sends in one database statement and commit, when "
         "sends queue for a busy worker (default 32; 1: every run commits alone)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 256, c.send_group_max); }},
        {"--io-threads", "IM_IO_THREADS", "N", "network I/O threads (default 2)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 64, c.io_threads); }},
        {"--ready-file", "IM_READY_FILE", "PATH", "write the listening port here once ready",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.ready_file = v; return std::nullopt; }},
        {"--drain-timeout-ms", "IM_DRAIN_TIMEOUT_MS", "MS", "SIGTERM: longest wait for in-flight requests (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 0, 600000, c.drain_timeout_ms); }},
        {"--ping-interval-ms", "IM_PING_INTERVAL_MS", "MS", "WebSocket ping period (default 20000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 600000, c.ping_interval_ms); }},
        {"--idle-timeout-ms", "IM_IDLE_TIMEOUT_MS", "MS", "close a connection silent this long (default 60000)",
         [](Config& c, const std::string& v) { return to_int(v, 200, 3600000, c.idle_timeout_ms); }},
        {"--hello-timeout-ms", "IM_HELLO_TIMEOUT_MS", "MS",
         "close (1008) a connection that has not sent hello this long after the upgrade (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 600000, c.hello_timeout_ms); }},
        {"--max-unsent-bytes", "IM_MAX_UNSENT_BYTES", "BYTES",
         "close (1013) a connection whose unsent output passes this; its request reading pauses at half "
         "(default 4194304)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             int n = 0;
             if (auto e = to_int(v, 131072, 1 << 30, n)) return e;
             c.max_unsent_bytes = static_cast<std::size_t>(n);
             return std::nullopt;
         }},
        {"--write-timeout-ms", "IM_WRITE_TIMEOUT_MS", "MS",
         "drop a connection when one frame write has not completed this long (default 30000)",
         [](Config& c, const std::string& v) { return to_int(v, 100, 600000, c.write_timeout_ms); }},
        {"--max-connections", "IM_MAX_CONNECTIONS", "N",
         "WebSocket connections this gateway serves; more are closed with 1013 (default 10000)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.max_connections); }},
        {"--max-connections-per-address", "IM_MAX_CONNECTIONS_PER_ADDRESS", "N",
         "WebSocket connections from one client IP address; more are closed with 1013 (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 1000000, c.max_connections_per_address); }},
        {"--db-timeout-ms", "IM_DB_TIMEOUT_MS", "MS",
         "a database request (or LISTEN round trip) taking longer is cut: its connection is dropped and replaced, "
         "the request gets UNAVAILABLE (a hung database is noticed; default 5000)",
         [](Config& c, const std::string& v) { return to_int(v, 200, 600000, c.db_timeout_ms); }},
        {"--accept-backoff-ms", "IM_ACCEPT_BACKOFF_MS", "MS",
         "pause accepting this long after accept() fails for lack of descriptors or memory (EMFILE, ENFILE, "
         "ENOBUFS, ENOMEM); doubles up to 2000 while it keeps failing (default 100)",
         [](Config& c, const std::string& v) { return to_int(v, 1, 2000, c.accept_backoff_ms); }},
        {"--listen-probe-ms", "IM_LISTEN_PROBE_MS", "MS",
         "how often an idle notification listener checks its database session is alive (default 1000)",
         [](Config& c, const std::string& v) { return to_int(v, 50, 3600000, c.listen_probe_ms); }},
        {"--bus", "IM_BUS", "postgres|nats://HOST:PORT",
         "notification bus between gateways: PostgreSQL LISTEN/NOTIFY (default) or NATS (comma-separated URLs "
         "of one NATS cluster)",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             if (auto e = check_bus(v)) return e;
             c.bus = v;
             return std::nullopt;
         }},
        {"--quiet", "IM_QUIET", nullptr, "log warnings and errors only",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.quiet = truthy(v); return std::nullopt; }},
        {"--enable-faults", "IM_ENABLE_FAULTS", nullptr, "LAB ONLY: allow fault injection (--fault, POST /lab/fault)",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.enable_faults = truthy(v); return std::nullopt; }},
        {"--fault", "IM_FAULTS", "POINT=ACTION[:COUNT]",
         "LAB ONLY: arm a fault point (repeatable; env: comma-separated). Points: store.before_insert, "
         "store.before_commit, api.after_send_commit, store.recall_before_commit, api.after_recall_commit, "
         "store.ack_before_commit, store.read_before_commit, notify.before_publish (and, for admin purge, "
         "store.purge_after_tombstones, store.purge_before_commit). Actions: crash, drop_reply, unavailable, "
         "delay:MS",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             std::stringstream ss(v);
             std::string item;
             while (std::getline(ss, item, ','))
                 if (!item.empty()) c.faults.push_back(item);
             return std::nullopt;
         }},
        {"--lab-no-unique-index", "IM_LAB_NO_UNIQUE_INDEX", nullptr,
         "LAB ONLY negative control: drop events_idempotency and check-then-insert without the row lock",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.lab.no_unique_index = truthy(v); return std::nullopt; }},
        {"--lab-no-resync", "IM_LAB_NO_RESYNC", nullptr,
         "LAB ONLY negative control: after a lost LISTEN session, push no `resync` to subscribers",
         [](Config& c, const std::string& v) -> std::optional<std::string> { c.lab.no_resync = truthy(v); return std::nullopt; }},
        {"--lab-purge-without-tombstones", "IM_LAB_PURGE_WITHOUT_TOMBSTONES", nullptr,
         "LAB ONLY negative control: retention purge writes no tombstones",
         [](Config& c, const std::string& v) -> std::optional<std::string> {
             c.lab.purge_without_tombstones = truthy(v);
             return std::nullopt;
         }},
    };
    return list;
}

} // namespace

std::string config_help() {
    std::ostringstream o;
    o << "usage: imserver [OPTIONS]            run a gateway\n"
         "       imserver admin [--db URL | --state-dir DIR] COMMAND ...   (imserver admin --help)\n\n"
         "Options (each also read from the environment variable shown; flags win):\n";
    for (const auto& opt : options()) {
        std::string left = std::string(opt.flag) + (opt.arg ? std::string(" ") + opt.arg : "");
        o << "  " << left;
        if (left.size() < 30) o << std::string(30 - left.size(), ' ');
        else o << "\n  " << std::string(30, ' ');
        o << opt.help;
        if (opt.env) o << "  [" << opt.env << "]";
        o << '\n';
    }
    o << "  --help                        this text\n";
    return o.str();
}

std::optional<std::string> check_bus(const std::string& v) {
    if (v == "postgres") return std::nullopt;
    std::stringstream ss(v);
    std::string url;
    int n = 0;
    while (std::getline(ss, url, ',')) {
        ++n;
        const std::string scheme = "nats://";
        auto colon = url.rfind(':');
        int port = 0;
        if (url.rfind(scheme, 0) != 0 || colon < scheme.size() + 1 || to_int(url.substr(colon + 1), 1, 65535, port))
            return "expected 'postgres' or nats://HOST:PORT[,nats://HOST:PORT...], got '" + v + "'";
    }
    if (n == 0) return std::string("expected 'postgres' or nats://HOST:PORT");
    return std::nullopt;
}

std::optional<std::string> parse_config(int argc, char** argv, Config& cfg, bool& help) {
    help = false;
    for (const auto& opt : options()) {
        if (!opt.env) continue;
        if (const char* v = std::getenv(opt.env); v && *v)
            if (auto e = opt.set(cfg, v)) return std::string(opt.env) + ": " + *e;
    }
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            help = true;
            return std::nullopt;
        }
        std::string value;
        auto eq = a.find('=');
        std::string name = a.substr(0, eq);
        const Option* found = nullptr;
        for (const auto& opt : options())
            if (name == opt.flag) found = &opt;
        if (!found) return "unknown option '" + a + "' (see --help)";
        if (!found->arg) value = eq == std::string::npos ? "1" : a.substr(eq + 1);
        else if (eq != std::string::npos) value = a.substr(eq + 1);
        else if (i + 1 < argc) value = argv[++i];
        else return std::string(found->flag) + " needs " + found->arg;
        if (auto e = found->set(cfg, value)) return std::string(found->flag) + ": " + *e;
    }
    if (!cfg.enable_faults && (!cfg.faults.empty() || cfg.lab.no_unique_index || cfg.lab.purge_without_tombstones ||
                                cfg.lab.no_resync))
        return "--fault and --lab-* need --enable-faults";
    return std::nullopt;
}

} // namespace im
