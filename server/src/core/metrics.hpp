// Counters for GET /metrics (Prometheus text format).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace im {

class Metrics {
public:
    std::atomic<long long> connections{0};        // open WebSocket connections
    std::atomic<long long> connections_total{0};
    std::atomic<long long> pushes_event{0};
    std::atomic<long long> pushes_hint{0};
    std::atomic<long long> pushes_resync{0};
    std::atomic<long long> pushes_direct{0};      // events pushed by the gateway that committed them, without a read
    std::atomic<long long> notify_lag_ms{0};      // last commit -> gateway delay seen
    std::atomic<long long> fanout_cache_members{0}; // membership periods (+1 per conversation) the fan-out caches
    std::atomic<long long> fanout_cache_evictions{0}; // conversations dropped from that cache at its cap
    std::atomic<long long> listen_reconnects{0};
    std::atomic<long long> bus_publishes{0};      // NOTIFY statements (each carries a batch)
    std::atomic<long long> send_transactions{0};  // runs of sends handed to the database (name kept: /metrics)
    // Admission and back-pressure.
    std::atomic<long long> hello_timeouts{0};       // closed 1008: no hello in time
    std::atomic<long long> unsent_budget_closes{0}; // closed 1013: unsent output over budget
    std::atomic<long long> read_pauses{0};          // request reading paused for unsent output
    std::atomic<long long> unsent_bytes{0};         // unsent output of all connections now
    std::atomic<long long> write_timeouts{0};       // dropped: a write stuck past the deadline
    std::atomic<long long> rejected_total_cap{0};   // closed 1013: --max-connections reached
    std::atomic<long long> rejected_address_cap{0}; // closed 1013: --max-connections-per-address reached
    std::atomic<long long> accept_errors{0};        // accept() failures (EMFILE ...) that paused accepting
    std::atomic<long long> revoked_closes{0};       // connections closed because their device was revoked
    std::atomic<long long> token_rechecks{0};
    std::atomic<long long> send_group_commits{0}; // statements that carried runs of 2+ connections
    std::atomic<long long> send_runs_grouped{0};  // runs carried by those statements
    std::atomic<long long> send_runs_held{0};     // runs put back because their conversation's row was held
    std::atomic<long long> send_runs_queued{0};   // runs waiting for a send worker now
    std::atomic<long long> send_lingers{0};       // times a send worker lingered for a group (--send-linger-us)
    std::atomic<long long> send_workers{0};       // --send-workers in effect
    std::atomic<long long> db_timeouts{0};          // database connections cut by --db-timeout-ms
    std::atomic<long long> tls_handshake_failures{0};
    std::atomic<long long> tls_reloads_total{0};
    std::atomic<long long> tls_reload_failures_total{0};
    std::atomic<long long> jwt_reloads_total{0};
    std::atomic<long long> jwt_reload_failures_total{0};
    std::atomic<long long> jwt_expired_closes{0};   // JWT connections closed with 4001 at exp
    // Hardening (issue 24): authenticated connections, the process-wide
    // buffer budget, readiness checks, failed hellos, pre-upgrade connections.
    std::atomic<long long> authenticated_connections{0}; // connections whose token the gateway tracks (revocation)
    std::atomic<long long> buffered_bytes{0};            // queued input + unsent output of all connections now
    std::atomic<long long> buffered_budget_closes{0};    // closed 1013: shed at --max-buffered-bytes
    std::atomic<long long> buffered_read_waits{0};       // connections whose reading waits for the buffer budget now
    std::atomic<long long> readyz_checks{0};             // database checks run for /readyz
    std::atomic<long long> hello_failures{0};            // hellos answered UNAUTHENTICATED
    std::atomic<long long> hello_rate_limited{0};        // closed 1013: too many failed hellos from the address
    std::atomic<long long> writes_rate_limited{0};       // sends, edits, reactions answered RATE_LIMITED (--send-rate)
    std::atomic<long long> http_pending{0};              // HTTP connections not (yet) upgraded now
    // Attachments (server.md "Attachments").
    std::atomic<long long> attachment_bytes_in{0};       // upload bytes committed
    std::atomic<long long> attachment_bytes_out{0};      // download bytes written
    std::atomic<long long> uploads_in_progress{0};       // PUT requests whose body is being received now
    std::atomic<long long> downloads_in_progress{0};     // downloads being written now
    std::atomic<long long> attachment_digest_mismatches{0}; // uploads answered 422 DIGEST_MISMATCH
    std::atomic<long long> attachment_digests_read_back{0}; // finishes that read the bytes back (no running digest)
    std::atomic<long long> attachment_gc_runs{0};        // collector runs finished
    std::atomic<long long> attachment_gc_uploads{0};     // uploads the collector removed
    std::atomic<long long> attachment_gc_bytes{0};       // their bytes
    std::atomic<long long> http_rejected{0};             // closed at accept: --max-http-connections reached
    // Typing and presence (contract section 13).
    std::atomic<long long> typing_forwarded{0};  // typing frames published to the bus
    std::atomic<long long> typing_dropped{0};    // over 2 a second per (device, conversation): answered, not forwarded
    std::atomic<long long> pushes_typing{0};
    std::atomic<long long> pushes_presence{0};
    std::atomic<long long> presence_writes{0};   // presence transactions of this gateway (writes, sweeps)
    std::atomic<long long> presence_write_failures{0};
    std::atomic<long long> presence_online_users{0}; // users with a connection past welcome here now
    // Webhooks (net/webhook_deliverer.hpp): deliveries (POSTs) by outcome.
    std::atomic<long long> webhook_deliveries_ok{0};            // answered 2xx
    std::atomic<long long> webhook_deliveries_http_error{0};    // answered, not 2xx (retried)
    std::atomic<long long> webhook_deliveries_network_error{0}; // no answer: refused, reset, TLS, timeout (retried)
    std::atomic<long long> webhook_events_delivered{0};
    std::atomic<long long> webhook_batches_failed{0};           // given up after --webhook-give-up-ms (listed, replayable)
    std::atomic<long long> webhook_leases_lost{0};              // delivered, but the lease had passed on (a duplicate)
    std::atomic<long long> webhook_claims_sweep{0};             // claims that looked at every cursor of a webhook
    std::atomic<long long> webhook_claims_hinted{0};            // claims of only the conversations the bus announced
    /// Per-webhook gauges (backlog, oldest undelivered age), Prometheus lines.
    void set_webhook_gauges(std::string text);

    /// The stages of a send between the session and the database, each its
    /// own histogram im_send_stage_seconds{stage=...} (docs/operations.md):
    enum class SendStage {
        queue,     // a run: submitted -> taken by a send worker (held back-offs included)
        statement, // a group: the one im_send statement (its commit included)
        publish,   // a run: handed to the bus -> the bus took it
        strand,    // a reply: answered by the worker or bus thread -> on its session's strand
    };
    static constexpr std::size_t send_stages = 4;

    /// code is "OK" for success replies.
    void count_request(std::string_view type, std::string_view code);
    void observe_send_seconds(double s);
    void observe_send_stage(SendStage stage, double s);
    std::string render(std::size_t pool_in_use, std::size_t pool_size, std::size_t pool_queued) const;

private:
    static constexpr std::array<double, 10> bounds_{0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
    mutable std::mutex mu_;
    std::string webhook_gauges_;
    std::map<std::pair<std::string, std::string>, long long> requests_;
    std::array<long long, bounds_.size()> send_buckets_{};
    long long send_count_ = 0;
    double send_sum_ = 0;
    // Finer at the low end: the stages are sub-millisecond when idle.
    static constexpr std::array<double, 13> stage_bounds_{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005,
                                                          0.01,    0.025,  0.05,    0.1,    0.25,  1};
    struct StageHistogram {
        std::array<long long, stage_bounds_.size()> buckets{};
        long long count = 0;
        double sum = 0;
    };
    std::array<StageHistogram, send_stages> stages_{};
};

} // namespace im
