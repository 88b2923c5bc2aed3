#include "core/metrics.hpp"

#include <sstream>

namespace im {

void Metrics::count_request(std::string_view type, std::string_view code) {
    std::lock_guard lk(mu_);
    ++requests_[{std::string(type), std::string(code)}];
}

void Metrics::set_webhook_gauges(std::string text) {
    std::lock_guard lk(mu_);
    webhook_gauges_ = std::move(text);
}

void Metrics::observe_send_seconds(double s) {
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < bounds_.size(); ++i)
        if (s <= bounds_[i]) ++send_buckets_[i];
    ++send_count_;
    send_sum_ += s;
}

void Metrics::observe_send_stage(SendStage stage, double s) {
    auto& h = stages_[static_cast<std::size_t>(stage)];
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < stage_bounds_.size(); ++i)
        if (s <= stage_bounds_[i]) ++h.buckets[i];
    ++h.count;
    h.sum += s;
}

std::string Metrics::render(std::size_t pool_in_use, std::size_t pool_size, std::size_t pool_queued) const {
    std::ostringstream o;
    auto gauge = [&](const char* name, const char* help, long long v, const char* type = "gauge") {
        o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << v << '\n';
    };
    gauge("im_connections", "Open WebSocket connections.", connections.load());
    gauge("im_connections_total", "WebSocket connections accepted.", connections_total.load(), "counter");
    gauge("im_db_pool_in_use", "Database workers running a job.", static_cast<long long>(pool_in_use));
    gauge("im_db_pool_size", "Database workers.", static_cast<long long>(pool_size));
    gauge("im_db_pool_queued", "Jobs waiting for a database worker.", static_cast<long long>(pool_queued));
    gauge("im_notify_lag_ms", "Last delay from commit to this gateway's notification.", notify_lag_ms.load());
    gauge("im_fanout_cache_members",
          "Membership periods (plus one per conversation) in the fan-out's cache; at most --fanout-cache-members.",
          fanout_cache_members.load());
    gauge("im_fanout_cache_evictions_total", "Conversations dropped from the fan-out's cache at --fanout-cache-members.",
          fanout_cache_evictions.load(), "counter");
    gauge("im_send_transactions_total",
          "Runs of sends handed to the database (a run: one connection's pipelined sends to one conversation); "
          "runs of several connections share a group commit (im_send_runs_grouped_total).",
          send_transactions.load(), "counter");
    gauge("im_pushes_direct_total", "Events pushed to own subscribers by the committing gateway (no read, no bus).",
          pushes_direct.load(), "counter");
    gauge("im_bus_publishes_total", "Publish statements sent to the notification bus (each carries a batch).",
          bus_publishes.load(), "counter");
    gauge("im_typing_forwarded_total", "typing frames published to the bus (contract section 13).",
          typing_forwarded.load(), "counter");
    gauge("im_typing_dropped_total", "typing frames answered but not forwarded: over 2 a second per device and conversation.",
          typing_dropped.load(), "counter");
    gauge("im_pushes_typing_total", "typing pushes written to connections.", pushes_typing.load(), "counter");
    gauge("im_pushes_presence_total", "presence pushes written to watching connections.", pushes_presence.load(),
          "counter");
    gauge("im_presence_writes_total", "Presence transactions of this gateway (connects, closes, sweeps).",
          presence_writes.load(), "counter");
    gauge("im_presence_write_failures_total", "Presence transactions that failed (retried with the next one).",
          presence_write_failures.load(), "counter");
    gauge("im_presence_online_users", "Users with a connection past welcome on this gateway now.",
          presence_online_users.load());
    gauge("im_listen_reconnects_total", "LISTEN connection re-establishments.", listen_reconnects.load(), "counter");
    gauge("im_hello_timeouts_total", "Connections closed (1008) for sending no hello in time.", hello_timeouts.load(),
          "counter");
    gauge("im_unsent_budget_closes_total", "Connections closed (1013) with unsent output over the budget.",
          unsent_budget_closes.load(), "counter");
    gauge("im_read_pauses_total", "Times a connection's request reading paused for unsent output.",
          read_pauses.load(), "counter");
    gauge("im_unsent_bytes", "Output bytes queued for all connections, not yet written.", unsent_bytes.load());
    gauge("im_write_timeouts_total", "Connections dropped for a write stuck past the write deadline.",
          write_timeouts.load(), "counter");
    o << "# HELP im_connections_rejected_total Connections closed (1013) at a connection cap.\n"
         "# TYPE im_connections_rejected_total counter\n"
      << "im_connections_rejected_total{cap=\"total\"} " << rejected_total_cap.load() << '\n'
      << "im_connections_rejected_total{cap=\"address\"} " << rejected_address_cap.load() << '\n';
    gauge("im_accept_errors_total", "accept() failures (EMFILE, ENFILE, ...) after which accepting paused.",
          accept_errors.load(), "counter");
    gauge("im_db_timeouts_total", "Database connections cut after --db-timeout-ms without an answer.",
          db_timeouts.load(), "counter");
    gauge("im_revoked_closes_total", "Connections closed because their device was revoked or got a new token.",
          revoked_closes.load(), "counter");
    gauge("im_tls_handshake_failures_total", "TLS handshakes that failed (bad client, untrusted certificate, old protocol).",
          tls_handshake_failures.load(), "counter");
    gauge("im_tls_reloads_total", "Certificate reloads on SIGHUP.", tls_reloads_total.load(), "counter");
    gauge("im_tls_reload_failures_total", "SIGHUP reloads refused (the old certificate stays).",
          tls_reload_failures_total.load(), "counter");
    gauge("im_jwt_reloads_total", "JWT key reloads on SIGHUP.", jwt_reloads_total.load(), "counter");
    gauge("im_jwt_reload_failures_total", "SIGHUP JWT key reloads refused (the old keys stay).",
          jwt_reload_failures_total.load(), "counter");
    gauge("im_jwt_expired_closes_total", "Connections closed with 4001 because their JWT reached exp unrefreshed.",
          jwt_expired_closes.load(), "counter");
    gauge("im_token_rechecks_total",
          "Checks of every open connection's token after the bus came back (revocations it may have missed).",
          token_rechecks.load(), "counter");
    gauge("im_send_workers", "Database workers that may run sends at once (--send-workers).", send_workers.load());
    gauge("im_send_runs_queued", "Runs of sends waiting for a send worker (they go in the next group commit).",
          send_runs_queued.load());
    gauge("im_send_group_commits_total",
          "Send statements (one commit each) that carried the runs of two or more connections (group commit).",
          send_group_commits.load(), "counter");
    gauge("im_send_runs_grouped_total", "Runs of sends committed inside those group statements.",
          send_runs_grouped.load(), "counter");
    gauge("im_send_lingers_total",
          "Times a send worker waited (--send-linger-us) for the senders of its last group before its next statement.",
          send_lingers.load(), "counter");
    gauge("im_send_runs_held_total",
          "Runs of sends put back in the queue because another transaction held their conversation's row.",
          send_runs_held.load(), "counter");
    gauge("im_authenticated_connections", "Authenticated connections whose token the gateway tracks.",
          authenticated_connections.load());
    gauge("im_buffered_bytes", "Queued request input and unsent output of all connections now (--max-buffered-bytes).",
          buffered_bytes.load());
    gauge("im_buffered_budget_closes_total", "Connections shed (closed 1013) at the process-wide buffer budget.",
          buffered_budget_closes.load(), "counter");
    gauge("im_buffered_read_waits", "Connections whose request reading waits for the process-wide buffer budget.",
          buffered_read_waits.load());
    gauge("im_readyz_checks_total", "Database checks run for /readyz (at most one a second; others get the cached answer).",
          readyz_checks.load(), "counter");
    gauge("im_hello_failures_total", "Hellos answered UNAUTHENTICATED.", hello_failures.load(), "counter");
    gauge("im_hello_rate_limited_total", "Connections closed (1013) for too many failed hellos from their address.",
          hello_rate_limited.load(), "counter");
    gauge("im_writes_rate_limited_total", "Sends, edits and reactions answered RATE_LIMITED (--send-rate), unwritten.",
          writes_rate_limited.load(), "counter");
    gauge("im_http_connections_pending", "HTTP connections accepted and not upgraded to WebSocket (yet).",
          http_pending.load());
    gauge("im_attachment_bytes_in_total", "Upload bytes committed to the attachment store.", attachment_bytes_in.load(),
          "counter");
    gauge("im_attachment_bytes_out_total", "Attachment bytes written to downloads.", attachment_bytes_out.load(),
          "counter");
    gauge("im_uploads_in_progress", "PUT /v1/uploads requests whose body is being received.",
          uploads_in_progress.load());
    gauge("im_downloads_in_progress", "GET /v1/attachments responses being written.", downloads_in_progress.load());
    gauge("im_attachment_digests_read_back_total",
          "Completed uploads whose SHA-256 was computed by reading their bytes back (some piece was written "
          "elsewhere or before a restart); the rest were hashed while written.",
          attachment_digests_read_back.load(), "counter");
    gauge("im_attachment_digest_mismatches_total", "Uploads answered 422 DIGEST_MISMATCH (restarted at 0).",
          attachment_digest_mismatches.load(), "counter");
    gauge("im_attachment_gc_runs_total", "Attachment collector runs finished.", attachment_gc_runs.load(), "counter");
    gauge("im_attachment_gc_uploads_total", "Stale or unreferenced uploads the collector removed.",
          attachment_gc_uploads.load(), "counter");
    gauge("im_attachment_gc_bytes_total", "Bytes of the uploads the collector removed.", attachment_gc_bytes.load(),
          "counter");
    gauge("im_http_connections_rejected_total", "Connections closed at accept: --max-http-connections reached.",
          http_rejected.load(), "counter");
    o << "# HELP im_pushes_total Server-initiated frames sent.\n# TYPE im_pushes_total counter\n"
      << "im_pushes_total{t=\"event\"} " << pushes_event.load() << '\n'
      << "im_pushes_total{t=\"hint\"} " << pushes_hint.load() << '\n'
      << "im_pushes_total{t=\"resync\"} " << pushes_resync.load() << '\n';
    o << "# HELP im_webhook_deliveries_total Webhook POSTs by outcome (ok: 2xx; http_error, network_error: retried).\n"
         "# TYPE im_webhook_deliveries_total counter\n"
      << "im_webhook_deliveries_total{outcome=\"ok\"} " << webhook_deliveries_ok.load() << '\n'
      << "im_webhook_deliveries_total{outcome=\"http_error\"} " << webhook_deliveries_http_error.load() << '\n'
      << "im_webhook_deliveries_total{outcome=\"network_error\"} " << webhook_deliveries_network_error.load() << '\n';
    gauge("im_webhook_events_delivered_total", "Events in webhook POSTs answered 2xx.", webhook_events_delivered.load(),
          "counter");
    gauge("im_webhook_batches_failed_total", "Webhook batches given up after --webhook-give-up-ms (listed, replayable).",
          webhook_batches_failed.load(), "counter");
    gauge("im_webhook_leases_lost_total", "Webhook batches delivered after their lease had passed to another worker.",
          webhook_leases_lost.load(), "counter");
    gauge("im_webhook_claims_sweep_total", "Webhook claims that looked at every cursor of a webhook (--webhook-sweep-ms).",
          webhook_claims_sweep.load(), "counter");
    gauge("im_webhook_claims_hinted_total", "Webhook claims of only the conversations the bus announced as moved.",
          webhook_claims_hinted.load(), "counter");
    std::lock_guard lk(mu_);
    o << webhook_gauges_;
    o << "# HELP im_requests_total Requests by type and result code.\n# TYPE im_requests_total counter\n";
    for (const auto& [k, v] : requests_)
        o << "im_requests_total{t=\"" << k.first << "\",code=\"" << k.second << "\"} " << v << '\n';
    o << "# HELP im_send_seconds Send latency, request read to reply written.\n# TYPE im_send_seconds histogram\n";
    for (std::size_t i = 0; i < bounds_.size(); ++i)
        o << "im_send_seconds_bucket{le=\"" << bounds_[i] << "\"} " << send_buckets_[i] << '\n';
    o << "im_send_seconds_bucket{le=\"+Inf\"} " << send_count_ << '\n'
      << "im_send_seconds_sum " << send_sum_ << '\n'
      << "im_send_seconds_count " << send_count_ << '\n';
    o << "# HELP im_send_stage_seconds Send time per stage: queue (run submitted -> taken by a send worker), "
         "statement (a group's im_send statement with its commit), publish (run handed to the bus -> taken; none when "
         "the notification went with the commit, --notify-in-commit), "
         "strand (reply answered -> on its session's strand).\n# TYPE im_send_stage_seconds histogram\n";
    static constexpr const char* stage_names[send_stages] = {"queue", "statement", "publish", "strand"};
    for (std::size_t k = 0; k < send_stages; ++k) {
        const auto& h = stages_[k];
        for (std::size_t i = 0; i < stage_bounds_.size(); ++i)
            o << "im_send_stage_seconds_bucket{stage=\"" << stage_names[k] << "\",le=\"" << stage_bounds_[i] << "\"} "
              << h.buckets[i] << '\n';
        o << "im_send_stage_seconds_bucket{stage=\"" << stage_names[k] << "\",le=\"+Inf\"} " << h.count << '\n'
          << "im_send_stage_seconds_sum{stage=\"" << stage_names[k] << "\"} " << h.sum << '\n'
          << "im_send_stage_seconds_count{stage=\"" << stage_names[k] << "\"} " << h.count << '\n';
    }
    return o.str();
}

} // namespace im
