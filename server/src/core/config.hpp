// Server options. One table (config.cpp) gives every option its flag, its
// environment variable and its key in the configuration file; --help, the
// manual pages and --print-config are all rendered from it.
#pragma once

#include "core/address.hpp"
#include "core/faults.hpp"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace im {

/// The configuration file read when neither --config nor IM_CONFIG names one
/// (skipped if it does not exist).
inline constexpr const char* default_config_file = "/etc/imserver/imserver.conf";

struct Config {
    std::string listen_host = "127.0.0.1";
    unsigned short listen_port = 8080;
    std::optional<std::string> db_url;   // none: the embedded cluster in state_dir
    std::string db_password_file;        // read into db_password
    std::string db_password;             // secret: never printed
    std::string tls_cert;                // PEM certificate (chain allowed); with tls_key: wss:// and https://
    std::string tls_key;                 // PEM private key file (a secret: only its path is configured)
    // Signed device tokens (contract section 4a); reloaded on SIGHUP.
    std::string jwt_hs256_secret_file;   // HS256 shared secret (a secret: only its path is configured)
    std::string jwt_jwks;                // JWKS file of RS256/ES256 public keys, by kid
    std::string jwt_issuer;              // `iss` must equal this when set
    std::string jwt_audience;            // `aud` must contain this when set
    bool jwt_enabled() const { return !jwt_hs256_secret_file.empty() || !jwt_jwks.empty(); }
    std::string state_dir = "./var";
    // Attachments (server.md "Attachments").
    long long max_attachment_bytes = 104857600; // largest declared upload
    std::string attachments_dir;                // empty: the bytes in PostgreSQL (upload_chunks)
    long long attachments_gc_after_ms = 86400000; // incomplete / unreferenced uploads older than this go
    int attachments_gc_interval_ms = 600000;      // how often this gateway collects; 0: never
    int attachment_db_pool = 2;                   // the attachment routes' own database workers; 0: share db_pool
    int attachment_nice = 0;                      // their CPU priority below the send path's (nice 0-19)
    std::string gateway_id = "gw-1";
    int db_pool = 4;
    std::size_t db_queue = 0;            // jobs waiting for a database worker; 0: auto (effective_db_queue)
    int send_group_max = 32;             // runs of sends of different connections per commit
    int send_workers = 0;                // database workers running sends at once; 0: auto (effective_send_workers)
    int send_linger_us = 0;              // under load, a send worker waits up to this for the last group's senders
    int io_threads = 2;
    std::string ready_file;
    // The backend API (docs/integration.md): its own listener, never the WebSocket port.
    std::string api_listen = "127.0.0.1:8081"; // HOST:PORT; empty: no backend API
    std::string api_ready_file;                // write the API's bound port here once ready
    int api_auth_failures = 10;                // failed authentications per client address per minute before 429
    bool api_auth_failures_loopback = false;   // count loopback callers too (default: exempt, the company's backend on this host)
    bool enable_faults = false;
    std::vector<std::string> faults;
    LabSwitches lab;
    int drain_timeout_ms = 10000;
    int ping_interval_ms = 20000;
    int idle_timeout_ms = 60000;
    // Admission and back-pressure (contract section 3).
    int hello_timeout_ms = 10000;           // no hello by then: close 1008
    std::size_t max_unsent_bytes = 4 << 20;  // unsent output past this: close 1013
    int write_timeout_ms = 30000;           // a write stuck this long: drop the socket
    int max_connections = 10000;            // WebSocket connections per gateway
    int max_connections_per_address = 1000; // ... per client IP address
    std::size_t max_buffered_bytes = std::size_t(1) << 30; // queued input + unsent output of all connections: shed past it
    int max_http_connections = 2048;        // accepted connections not upgraded (yet); more are closed at accept
    int hello_failures = 30;                // failed hellos per client address per minute, then 1013
    bool hello_failures_loopback = false;   // count loopback clients too (default: exempt, a local proxy's address)
    int send_rate = 20;                     // sends, edits, reactions per user per second (token bucket per gateway); 0: unlimited
    int send_burst = 60;                    // ... the bucket's size
    std::vector<IpNetwork> trusted_proxies; // peers whose PROXY v2 header / X-Forwarded-For name the client
    std::string metrics_listen = "public";  // where GET /metrics is served: public, api, or HOST:PORT
    int db_timeout_ms = 5000;               // a database round trip unanswered this long: drop its connection
    int fanout_cache_members = 200000;      // the fan-out's membership cache: periods cached in all (notifier.hpp)
    int accept_backoff_ms = 100;            // first pause after EMFILE & co. (doubles to 2 s)
    int listen_probe_ms = 1000;
    // Webhooks (net/webhook_deliverer.hpp; docs/operations.md, "Webhooks").
    int webhook_workers = 2;                 // delivering threads of this gateway (0: it delivers nothing)
    int webhook_poll_ms = 100;               // an idle worker looks for new events this often
    int webhook_refresh_ms = 1000;           // re-reads the webhooks, adds new conversations' cursors
    int webhook_lease_ms = 30000;            // a batch's lease; a dead gateway's work is taken over after it
    int webhook_timeout_ms = 10000;          // one POST, connect to answer
    int webhook_retry_max_ms = 600000;       // the backoff's ceiling (1 s doubling)
    int webhook_batch = 100;                 // events per POST at most; also conversations per claim
    int webhook_fill_events = 50;            // a round that read fewer (claim not full) waits webhook_fill_ms
    int webhook_fill_ms = 100;               // that wait (at most webhook_poll_ms)
    int webhook_linger_ms = 100;             // a caught-up conversation is not claimed again for this long
    int webhook_pause_max_ms = 5000;         // after a failed POST the webhook rests 250 ms doubling to this
    int webhook_sweep_ms = 1000;             // every cursor looked at this often; between, only what the bus named
    std::int64_t webhook_give_up_ms = 259200000; // a batch failing this long is marked failed (72 h)
    bool webhook_insecure_tls = false;       // tests only: no certificate check on https:// receivers
    int presence_lease_ms = 30000;       // a gateway silent this long is swept: its users go offline (contract 13)
    std::string bus = "postgres";        // or nats://HOST:PORT[,nats://HOST:PORT...]
    bool notify_in_commit = true;        // PostgreSQL bus: sends NOTIFY inside their transaction
    bool quiet = false;

    std::string config_file;                     // the file that was read ("" if none)
    std::map<std::string, std::string> origin;   // option key -> where its value came from
};

/// --db-queue as the pool and the send scheduler use it: auto is
/// --max-connections (at least 1024). A WebSocket connection has at most one
/// request (or run of sends) waiting for a worker, so with auto a wave of
/// every connection reconnecting at once is queued, never refused for room
/// (a refusal costs more than the wait: the client retries after a backoff;
/// docs/benchmarks.md, "Reconnect storm").
std::size_t effective_db_queue(const Config& c);

/// --send-workers as the gateway uses it: auto is half the CPU cores (at
/// least 1), never more than --db-pool.
int effective_send_workers(const Config& c);

/// Which program reads the options: the gateway reads them all, `imserver
/// admin` only those marked for it (the database and the lab switches); both
/// accept the whole configuration file.
enum class ConfigScope { gateway, admin };

enum class ConfigAction { run, help, print_config };

/// Parses flags (args, without the program name), the environment and the
/// configuration file; a flag beats its environment variable, which beats the
/// file, which beats the default. On error returns a message and changes
/// nothing the caller relies on.
std::optional<std::string> parse_config(const std::vector<std::string>& args, Config& cfg, ConfigScope scope,
                                        ConfigAction& action);
std::optional<std::string> parse_config(int argc, char** argv, Config& cfg, ConfigAction& action);

/// The server URLs of a NATS --bus value, split at every ',' (an empty item
/// stays, for the caller to refuse): the option's check and the NATS bus
/// split it alike. The C library takes a list only as an array
/// (natsOptions_SetServers): one string with commas in it is one server it
/// cannot reach.
std::vector<std::string> nats_servers(const std::string& bus);

/// True if `arg` (e.g. "--db" or "--db=URL") names an option of `scope`;
/// `takes_value` tells whether it consumes the next argument.
bool is_config_flag(const std::string& arg, ConfigScope scope, bool& takes_value);

/// The connection string to use: --db with the password of
/// --db-password-file added.
std::optional<std::string> db_conninfo(const Config& cfg);

/// Replaces the password of a libpq URL or key=value string with ****.
std::string mask_conninfo(const std::string& conninfo);

std::string config_help();
/// The effective configuration in the file's format, secrets masked, each
/// line commented with the value's origin.
std::string print_config(const Config& cfg);
/// imserver(8) in roff, from the same table as --help.
std::string config_man(const std::string& version);

/// Options of `scope` for other usage texts: lines "  --flag ARG  help  [ENV]".
std::string options_help(ConfigScope scope);
/// The same as roff .TP paragraphs.
std::string options_man(ConfigScope scope);
/// Escapes text for roff.
std::string roff_escape(const std::string& s);

} // namespace im
